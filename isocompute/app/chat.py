"""Chat requests as the model and the policy see them: one prompt rendered with the model's chat template,
and the bare question the policy's features are computed from.

The template is the served model's tokenizer's (the transformers engine's, or the tokenizer in
``model_dir`` for vLLM upstreams — the same template vLLM's own chat endpoint applies). Ignores: images,
audio and tool calls (non-text content is refused with 400).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from isocompute.app.schemas import ChatMessage
from isocompute.errors import InputError

__all__ = ["check_text", "policy_text", "render_chat"]


def check_text(text: str, where: str) -> str:
    """``text`` when it encodes as UTF-8; a lone surrogate (JSON ``"\\ud800"`` without its pair) is a 400
    naming ``where`` and the character's index, not a tokenizer's 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"{where} has a lone surrogate (U+{ord(text[e.start]):04X}) at character {e.start}; send "
                         "valid Unicode text (a \\uD800–\\uDFFF escape must be one half of a surrogate pair)") from None
    return text


def _message_text(i: int, m: ChatMessage) -> str:
    if isinstance(m.content, list):
        parts = []
        for j, part in enumerate(m.content):
            if part.type != "text":
                raise InputError(f"messages[{i}].content[{j}] is a {part.type!r} part; only text parts are "
                                 "supported: send {\"type\": \"text\", \"text\": \"...\"}")
            if part.text is None:
                raise InputError(f"messages[{i}].content[{j}] is a text part without its \"text\" field; send "
                                 "{\"type\": \"text\", \"text\": \"...\"}")
            parts.append(check_text(part.text, f"messages[{i}].content[{j}].text"))
        return "".join(parts)
    return check_text(m.content or "", f"messages[{i}].content")


def policy_text(messages: Sequence[ChatMessage]) -> str:
    """The text the policy's features are computed from: the last user message.

    Outcome tables hold the bare question in ``prompt`` and the policy was fitted on it, so features of
    the chat-templated string (role markers, system prompt) would be out of distribution.
    """
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "user":
            return _message_text(i, messages[i])
    return _message_text(len(messages) - 1, messages[-1])


def render_chat(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """One prompt string from OpenAI chat messages via the tokenizer's chat template.

    Raises :class:`InputError` for non-text content or a tokenizer without a template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the served model's tokenizer has no chat template; use /v1/completions instead")
    rendered = [{"role": "system" if m.role == "developer" else m.role, "content": _message_text(i, m)}
                for i, m in enumerate(messages)]
    if not any(r["content"].strip() for r in rendered):
        raise InputError("every message is empty; send at least one message with text content")
    text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
    # Templates often render BOS while encoding adds it again; a doubled BOS is out of distribution.
    bos = getattr(tokenizer, "bos_token", None)
    if bos and text.startswith(bos):
        ids = tokenizer("")["input_ids"]
        if ids and ids[0] == getattr(tokenizer, "bos_token_id", None):
            text = text[len(bos):]
    return str(text)
