# trt-spec: every target creates (once) and uses the virtual environment $(VENV).
#
#   make demo                          the embedded demo pair end to end on CPU: check, plan,
#                                      Triton repository, real Triton server, streamed generation
#   make bench                         the demo pair in-process: speculative vs plain decoding per K
#   make test                          the test suite (CPU; GPU tests skip)
#   make lint                          ruff (lint + format check), mypy (strict on the pure core) and
#                                      the import layers (import-linter)
#   make plan SPEC=examples/x.yaml     conversion + trtllm-build steps and the memory plan
#   make build-engines SPEC=...        download -> check -> convert + build (GPU machine)
#
# In NVIDIA's TensorRT-LLM container, reuse its torch and tensorrt_llm:
#   make build-engines SPEC=... VENV_FLAGS=--system-site-packages TORCH=

SPEC ?= examples/pystdlib-demo.yaml
# The demo pair `make demo` and `make bench` run (the tests use the smaller pystdlib-demo.yaml).
DEMO_SPEC ?= examples/pystdlib-wide.yaml
VENV ?= .venv
VENV_FLAGS ?=
# A CPU build of torch; empty to keep the torch already installed (e.g. in a GPU container).
TORCH ?= torch==2.13.0
EXTRAS ?= triton,bench,test,lint,openai
PYTHON ?= python3
PY := $(VENV)/bin/python
TRT_SPEC := $(VENV)/bin/trt-spec
STAMP := $(VENV)/.installed-$(EXTRAS)
LINT_PATHS := trt_spec tests scripts

.PHONY: setup test lint demo bench plan build-engines clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(if $(TORCH),$(PY) -m pip install --quiet '$(TORCH)')
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

test: $(STAMP)
	$(PY) -m pytest -q

# mypy checks the whole package, strictly the modules listed under [tool.mypy] overrides in
# pyproject.toml; import-linter the contracts under [tool.importlinter] (imports follow the data's flow).
lint: $(STAMP)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	$(PY) -m mypy -p trt_spec
	$(VENV)/bin/lint-imports

demo: $(STAMP)
	$(TRT_SPEC) demo --spec $(DEMO_SPEC)

bench: $(STAMP)
	$(TRT_SPEC) bench --local --spec $(DEMO_SPEC)

plan: $(STAMP)
	$(TRT_SPEC) plan --spec $(SPEC)

build-engines: $(STAMP)
	$(TRT_SPEC) download --spec $(SPEC)
	$(TRT_SPEC) check --spec $(SPEC)
	$(TRT_SPEC) build --spec $(SPEC)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
