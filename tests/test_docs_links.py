"""The README stays a five-minute read and every relative link in it and in ``docs/`` leads somewhere.

A relative link is a Markdown ``[text](path)`` or ``![alt](path)`` whose target is not ``http(s):``,
``mailto:`` or a pure ``#anchor``; a trailing ``#anchor`` is stripped and the path must name an existing
file or directory relative to the file that links to it. Links inside fenced code blocks and inline code
are not links.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250

# [text](target) and ![alt](target); the target may carry a "title" after a space
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^(?:https?:|mailto:)", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`+[^`]*`+")


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def relative_links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every relative link outside code, anchors stripped."""
    found, in_fence = [], False
    for no, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            target = m.group(1) or m.group(2)
            if EXTERNAL.match(target) or target.startswith("#"):
                continue
            path = target.split("#", 1)[0]
            if path:
                found.append((no, path))
    return found


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """``file:line: target`` for every relative link of md whose target does not exist."""
    return [f"{md.relative_to(root)}:{no}: {target}" for no, target in relative_links(md.read_text())
            if not (md.parent / target).exists()]


def test_the_link_parser_on_a_hand_written_page(tmp_path):
    text = (
        "see [a](a.md#part), ![plot](img/p.png \"title\") and [b](<b c.md>)\n"
        "[web](https://x.org/y) [mail](mailto:a@b) [here](#anchor) `[code](nope.md)`\n"
        "```\n[fenced](nope.md)\n```\n"
        "[nested [brackets]](d/e.md)\n"
    )
    assert relative_links(text) == [(1, "a.md"), (1, "img/p.png"), (1, "b c.md"), (6, "d/e.md")]
    page = tmp_path / "page.md"
    page.write_text("[ok](page.md) [gone](missing.md#x)\n")
    assert broken_links(page, root=tmp_path) == ["page.md:1: missing.md"]


def test_there_are_docs_to_check():
    files = markdown_files()
    assert README in files and len(files) > 1, "no docs/**/*.md found"
    assert sum(len(relative_links(f.read_text())) for f in files) > 10, "suspiciously few links found"


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(md):
    broken = broken_links(md)
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, (
        f"README.md has {n} lines, more than {MAX_README_LINES}: move the detail to a page in docs/")
