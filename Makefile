# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv idempotently. torch is pinned in its own pip call first, so pip never
# resolves an unpinned torch (that would fetch a multi-GB CUDA build).
# pip itself comes first, at constraints.txt's version (tests/cli/install_lane.py: the
# install lanes' resolves cost half the CPU with it).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hpcodegen-installed
EXAMPLE ?= examples/llama_tp2
# pytest-xdist workers of `make test`: two fit the 2-core, 24 GiB CI machine (each worker
# keeps at most one gloo world and runs one torchrun job at a time); work stealing, with the
# multi-process modules collected first (tests/conftest.py), ends both workers on short tests
# --durations=20 prints the slowest tests: the figures of docs/testing.md's table
# Bytecode is written by every target's commands even where the machine sets
# PYTHONDONTWRITEBYTECODE (unexported below): the suite starts ~200 interpreters (ranks,
# launchers, CLI runs) that import hpcodegen, and each compiled its modules from source again
# (~0.15 s of CPU each). The venv is installed without bytecode (`--no-compile`): pip
# compiled every module of torch, transformers and the rest, ~12,000 files one after the
# other, 20-30 s of the set-up's wall time (while the second core idles), where a run
# imports a fraction of them and writes their bytecode the first time (the install lanes of
# tests/cli link torch's bytecode, as written so far, into their venvs). The editable
# install builds with the venv's own setuptools (pinned, installed first) instead of an
# isolated build env (~4 s). Artifacts never get a __pycache__: the runtime's loader
# compiles the checked bytes itself and writes none.
TEST_WORKERS ?= 2
unexport PYTHONDONTWRITEBYTECODE

.PHONY: venv test demo lint examples check-examples bench gpu clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt pip setuptools
	$(BIN)/pip install -q --disable-pip-version-check --no-compile -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check --no-compile --no-build-isolation \
	  -c constraints.txt -e '.[dev,runtime]'
	touch $(STAMP)

venv: $(STAMP)

test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=20

demo: venv
	$(BIN)/hpcodegen verify $(EXAMPLE) --hf-config examples/configs/llama
	$(BIN)/hpcodegen inspect-plan $(EXAMPLE)
	$(BIN)/hpcodegen launch $(EXAMPLE) --nproc 2 --model-dir examples/configs/llama --check-parity

lint: venv
	$(BIN)/ruff check .

examples: venv
	$(BIN)/python -m hpcodegen.generate.examples

check-examples: venv
	$(BIN)/python -m hpcodegen.generate.examples --check

bench: venv
	$(BIN)/python bench/gate_speed.py
	$(BIN)/python bench/forward_overhead.py
	$(BIN)/python bench/install_time.py
	$(BIN)/python bench/load_memory.py

# the GPU lane (needs CUDA; the cuda tests skip and bench/gpu.py exits 2 elsewhere)
gpu: venv
	$(BIN)/python -m pytest -q -m cuda tests/gpu
	$(BIN)/python bench/gpu.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
