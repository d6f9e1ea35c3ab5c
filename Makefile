# `make demo` and `make test` each create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
EXTRAS := offline,data,eval,report,serve,cttd,test

.PHONY: demo test test-all bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, so nothing below pulls a CUDA build onto a CPU machine
	@if $(BIN)/python -c "import torch" 2>/dev/null; then echo "torch already installed"; \
	elif command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	else $(BIN)/pip install -q torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/caprecon demo

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q

test-all: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -m ''

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs .pytest_cache
