"""The tiny embedded causal LM and its offline character-level tokenizer.

The embedded default world runs without any download: a Llama-architecture decoder small enough to train
from scratch on a laptop CPU in minutes (:mod:`isocompute.training.sft`), with a tokenizer built here from
a fixed character vocabulary using the ``tokenizers`` library. The saved directory loads with
``AutoModelForCausalLM``/``AutoTokenizer.from_pretrained`` and with vLLM (``vllm serve DIR``).

Vocabulary: 7 special tokens, then every printable ASCII character, newline and a few maths symbols
(``×``, ``−``, ``÷``). One character is one token, so ``"47 + 385"`` is 8 tokens. Characters outside the
vocabulary become ``<unk>``; encoding never fails.

Chat format (what :data:`CHAT_TEMPLATE` renders and what SFT trains on)::

    <s><|user|>What is 2 + 3?<|end|><|assistant|>2 + 3 = 5. The answer is 5.<|end|>

``<|end|>`` closes every turn and is the EOS token, so generation (transformers or vLLM) stops at the end
of the assistant's turn. Plain completion works too: the tokenizer prepends ``<s>`` and the model,
trained also on ``<s>PROMPT\\nSOLUTION<|end|>``, continues a bare prompt.

Architecture: ``head_dim`` must be one of 32, 64, 80, 96, 112, 128 because vLLM's CPU attention kernels
support only those; :func:`tiny_config` checks it. Ignores: sub-word merges (arithmetic reads digit by
digit anyway), byte fallback, multi-lingual text.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from isocompute.errors import InputError

BOS, EOS, PAD, UNK = "<s>", "<|end|>", "<pad>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK, *ROLE_TOKENS)
# printable ASCII (without \t\r\x0b\x0c) + newline + maths symbols some prompts may carry
CHARACTERS: tuple[str, ...] = tuple(
    c for c in string.printable if c not in "\t\r\x0b\x0c"
) + ("×", "−", "÷")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128)


def vocabulary() -> dict[str, int]:
    """Token → id: special tokens first (``<pad>`` = 0, ``<s>`` = 1, ``<|end|>`` = 2), then characters."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}


def build_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` over :func:`vocabulary`, adding ``<s>`` in front of every encoding,
    with :data:`CHAT_TEMPLATE` set. Deterministic and offline.

    >>> tok = build_tokenizer()
    >>> tok("7+5")["input_ids"]            # <s> 7 + 5
    [1, 14, 79, 12]
    >>> tok.decode(tok("7+5")["input_ids"], skip_special_tokens=True)
    '7+5'
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    # BPE with no merges and no pre-tokenizer splits text into single characters and maps each to its id.
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tk.add_special_tokens(list(SPECIAL_TOKENS))
    tk.decoder = decoders.Fuse()  # concatenate characters; the default decoder joins with spaces
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(ROLE_TOKENS),
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"  # decoder-only batched generation pads on the left
    return tok


def tiny_config(
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    head_dim: int = 32,
    intermediate_size: int = 384,
    max_positions: int = 512,
) -> Any:
    """A ``LlamaConfig`` for the tiny model (defaults: 4 layers, hidden 128, 4 heads × 32, MLP 384, ~0.87 M params;
    SFT trains a smaller 3-layer, MLP-256 variant by default, see :class:`isocompute.training.sft.SFTConfig`).

    Raises :class:`InputError` when ``head_dim`` is not one vLLM's CPU attention supports.
    """
    from transformers import LlamaConfig

    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise InputError(f"head_dim={head_dim} is not supported by vLLM's CPU attention; "
                         f"choose one of {VLLM_CPU_HEAD_DIMS}.")
    if num_heads * head_dim != hidden_size:
        raise InputError(f"num_heads × head_dim = {num_heads * head_dim} must equal hidden_size={hidden_size}; "
                         "change one of them.")
    vocab = vocabulary()
    return LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=vocab[BOS],
        eos_token_id=vocab[EOS],
        pad_token_id=vocab[PAD],
        torch_dtype="float32",
    )


def build_model(config: Any | None = None, *, seed: int = 0) -> Any:
    """A randomly initialised ``LlamaForCausalLM`` (seeded) for ``config`` (default :func:`tiny_config`)."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    config = config or tiny_config()
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_new_tokens=256,
    )
    return model


def save_tiny(out_dir: str | Path, model: Any | None = None, tokenizer: Any | None = None, *, seed: int = 0) -> Path:
    """Save ``model`` (default: a fresh random one) and ``tokenizer`` (default :func:`build_tokenizer`) as a
    Hugging Face model directory (safetensors, ``generation_config.json`` with EOS, tokenizer files).

    Writes straight into ``out_dir``; callers wanting atomicity write into a temporary directory
    (see :func:`isocompute.artifacts.artifact_writer`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else build_model(seed=seed)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _make_tokenizer_config_portable(out / "tokenizer_config.json")
    _make_model_config_portable(out / "config.json")
    return out


def _make_model_config_portable(path: Path) -> None:
    """Add the transformers-4.x spellings (``torch_dtype``, ``rope_theta``) next to the v5 ones so an older
    transformers inside vLLM reads the same dtype and RoPE base."""
    import json

    cfg = json.loads(path.read_text())
    cfg.setdefault("torch_dtype", cfg.get("dtype", "float32"))
    rope = cfg.get("rope_parameters") or {}
    cfg.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def _make_tokenizer_config_portable(path: Path) -> None:
    """Rewrite transformers-5 names in ``tokenizer_config.json`` to ones transformers 4.x also reads, because
    vLLM releases may pin an older transformers: class ``PreTrainedTokenizerFast`` (v5 maps it to its
    ``TokenizersBackend``), ``additional_special_tokens`` instead of a list-valued ``extra_special_tokens``,
    and the chat template inline as well as in ``chat_template.jinja``."""
    import json

    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    elif extra is not None:
        cfg["extra_special_tokens"] = extra
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["padding_side"] = "left"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_tiny(model_dir: str | Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a directory written by :func:`save_tiny`, model in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    return model.eval(), tokenizer


def count_parameters(model: Any) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
