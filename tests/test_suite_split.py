"""The split of the suite into its two passes (conftest): the serial pass imports only SERIAL_MODULES and
MARKED_SERIAL, so a module with a test marked ``serial`` or ``vllm`` by hand must be in one of them, or the
serial pass would never run that test."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import MARKED_SERIAL, SERIAL_MODULES

TESTS = Path(__file__).resolve().parent
MARK = re.compile(r"pytest\.mark\.(serial|vllm)\b")


def test_every_module_with_a_serial_or_vllm_mark_is_collected_by_the_serial_pass():
    marked = {p.name for p in TESTS.glob("test_*.py") if MARK.search(p.read_text(encoding="utf-8"))}
    assert marked, "no module marks a test serial or vllm: the pattern is stale"
    assert marked - {Path(__file__).name} <= SERIAL_MODULES | MARKED_SERIAL, sorted(marked - SERIAL_MODULES - MARKED_SERIAL)


def test_the_lists_name_existing_modules():
    assert {p.name for p in TESTS.glob("test_*.py")} >= SERIAL_MODULES | MARKED_SERIAL
