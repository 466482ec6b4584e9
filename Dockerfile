# isocompute gateway image: CPU-only, python:3.11-slim, torch from PyTorch's CPU wheel index.
#
# Build and run the embedded default (tiny model + fitted policy, in-process transformers engine):
#
#   docker build -t isocompute .                           # the demo then runs on first start
#   docker build -t isocompute --build-arg BAKE_DEMO=1 .   # or run the demo (~3 min on 2 cores) at build time
#   docker run --rm -p 8000:8000 -v isocompute-data:/data isocompute
#
# The first start without a baked demo runs `isocompute demo --out /data/demo` before serving (about
# 3 minutes on 2 CPU cores; the named volume keeps it, and an interrupted demo resumes). Then:
#   curl -s localhost:8000/health
#
# Configure with ISOCOMPUTE_<FIELD> variables or a TOML file in ISOCOMPUTE_CONFIG (every setting is in
# the "Configuration" table of docs/gateway.md); flags after the image name are appended to `isocompute serve`.
# Your own policy and checkpoint, mounted read-only:
#   docker run --rm -p 8000:8000 -v $PWD/runs/gsm8k:/models:ro \
#     -e ISOCOMPUTE_POLICY_DIR=/models/policy -e ISOCOMPUTE_MODEL_DIR=/models/checkpoint isocompute
# The container runs as uid 10001; isocompute writes artifact directories mode 0755, but with a strict
# umask make them readable first (chmod -R a+rX runs/gsm8k) or run as their owner (--user "$(id -u)").
#
# Secrets are never baked in. API keys are stored hashed in a JSON file (format in isocompute.app.accounting.auth)
# that you mount at run time:
#   docker run ... -v $PWD/keys.json:/run/secrets/api_keys.json:ro \
#     -e ISOCOMPUTE_API_KEYS_FILE=/run/secrets/api_keys.json -e ISOCOMPUTE_ADMIN_KEY_SHA256=<sha256 hex> isocompute
#
# GPU / vLLM: this image is also the gateway in front of vLLM's own GPU image (vllm/vllm-openai), which
# it reaches over HTTP (--engine vllm-http), so the gateway needs no GPU, no CUDA and no vLLM install.
# docker/compose.gpu.yaml runs the demo once, vLLM on the GPU serving its checkpoint, and the gateway:
#   docker compose -f docker/compose.gpu.yaml up --build
# The same by hand, for your own model (the policy must be fitted on outcomes of the model vLLM serves):
#   docker network create iso
#   docker run -d --gpus all --ipc=host --network iso --name vllm -v $PWD/runs/gsm8k:/models:ro \
#     --entrypoint python3 vllm/vllm-openai:v0.32.0 -m vllm.entrypoints.openai.api_server \
#     --model /models/checkpoint --host 0.0.0.0 --port 8000
#   docker run -d --network iso -p 8000:8000 -v $PWD/runs/gsm8k:/models:ro \
#     -e ISOCOMPUTE_ENGINE=vllm-http -e 'ISOCOMPUTE_UPSTREAMS=["http://vllm:8000"]' \
#     -e ISOCOMPUTE_POLICY_DIR=/models/policy -e ISOCOMPUTE_MODEL_DIR=/models/checkpoint isocompute
# ISOCOMPUTE_MODEL_DIR gives the gateway the checkpoint's chat template and FLOP accounting (it loads no
# weights with vllm-http) and is also the model name it sends upstream: mount the checkpoint at the same
# path in both containers, as here (or start vLLM with --served-model-name set to that path), or vLLM
# answers 404 "model does not exist". The in-process `--engine vllm` needs vLLM inside this image and
# is not built.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: compilers and pip caches stay here ---------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder
# Keep in step with the Makefile's TORCH pin. The CPU index matters: on x86 PyPI's torch is the CUDA build.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# build-essential: for a dependency without a wheel on this platform (e.g. an arm64 host)
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --upgrade pip \
 && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY isocompute ./isocompute
# The constraint keeps the CPU torch above: no dependency may swap it for PyPI's CUDA build.
RUN echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt \
 && pip install --constraint /tmp/torch-constraint.txt . \
 && isocompute --version

# ---- runtime: the default target ---------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# libgomp1: LightGBM's wheel links the system OpenMP runtime, which the slim image lacks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 10001 --user-group isocompute \
 && mkdir -p /data /opt/isocompute/demo \
 && chown isocompute:isocompute /data /opt/isocompute/demo
COPY --from=builder /opt/venv /opt/venv
COPY docker/entrypoint.py docker/healthcheck.py /opt/isocompute/
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER isocompute
WORKDIR /home/isocompute
# BAKE_DEMO=1 runs the demo here, as the user who will read it, into /opt/isocompute/demo (the
# entrypoint prefers a complete baked demo over /data/demo).
ARG BAKE_DEMO=0
RUN if [ "$BAKE_DEMO" = "1" ]; then isocompute demo --out /opt/isocompute/demo; fi
VOLUME ["/data"]
EXPOSE 8000
# The start period covers a first-start demo; failures in it do not count, the first success ends it.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30m --retries=3 \
  CMD ["python", "/opt/isocompute/healthcheck.py"]
ENTRYPOINT ["python", "/opt/isocompute/entrypoint.py"]
CMD []
