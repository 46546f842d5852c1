# scankit: `make test` (CPU, any machine) and `make bench` (CUDA machine).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The GPU machine's own python3 (with torch + triton) runs the asv suite: `make bench`.
BENCH_PYTHON ?= python3
MACHINE      ?= h200

PORT         ?= 8080

# The tests that run Triton kernels (through the interpreter on a CPU)
KERNEL_TESTS := tests/test_kernels.py tests/test_fused.py tests/test_compile.py tests/test_edges.py tests/test_mixers.py tests/test_autocast.py tests/test_gated_scans.py tests/test_interpreter_scan.py
NEWEST       ?= .venv-newest

.PHONY: test test-newest-triton venv clean bench render dashboard

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

## test: CPU test suite; Triton kernels run through TRITON_INTERPRET=1
test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n auto --dist loadgroup tests

## test-newest-triton: the kernel tests again with the newest triton (and numpy) the index serves,
## beside the same CPU torch (its wheel pins no triton): what a user who upgrades gets
test-newest-triton:
	$(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install -q --upgrade pip
	$(NEWEST)/bin/python -m pip install -q torch==2.13.0 pytest pytest-xdist hypothesis
	$(NEWEST)/bin/python -m pip install -q --upgrade triton numpy
	$(NEWEST)/bin/python -m pip install -q --no-deps -e .
	@$(NEWEST)/bin/python -c "import torch, triton, numpy; print('newest: triton', triton.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)"
	TRITON_INTERPRET=1 $(NEWEST)/bin/python -m pytest -q -n auto $(KERNEL_TESTS)

## bench: the asv suite on the current commit (CUDA machine), then render experiments/bench/.
## asv installs the commit into its virtualenv environment (asv.conf.json), torch/triton from BENCH_PYTHON.
bench:
	@$(BENCH_PYTHON) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null || \
	  { echo "make bench: $(BENCH_PYTHON) sees no CUDA device (or has no torch); the suite times and checks the kernels on a GPU (README: Running the benchmarks on a GPU machine)." >&2; exit 2; }
	@test -z "$$(git status --porcelain --untracked-files=no -- scankit benchmarks)" || \
	  { echo "make bench: scankit/ or benchmarks/ has uncommitted changes; asv measures the committed HEAD. Commit first." >&2; exit 2; }
	@$(BENCH_PYTHON) -c "import asv, asv_runner, virtualenv, jinja2, tabulate, matplotlib" 2>/dev/null || $(BENCH_PYTHON) -m pip install -q -r requirements-bench.txt
	$(BENCH_PYTHON) tools/asv_machine.py --machine $(MACHINE)
	SCANKIT_ASV_MACHINE=$(MACHINE) SCANKIT_ASV_COMMIT=$$(git rev-parse HEAD) SCANKIT_ASV_SITE_PYTHON=$$(command -v $(BENCH_PYTHON)) \
	  $(BENCH_PYTHON) -m asv run HEAD^! --machine $(MACHINE) --record-samples --show-stderr
	$(MAKE) render BENCH_PYTHON=$(BENCH_PYTHON) MACHINE=$(MACHINE)

## render: experiments/bench/*.md + *.json from the newest committed asv run of MACHINE
render:
	$(BENCH_PYTHON) tools/render_artifacts.py --machine $(MACHINE) --readme README.md

## dashboard: the committed history as asv's HTML dashboard, assets vendored (works offline), on localhost
dashboard: $(STAMP)
	$(PY) -m asv publish
	@echo "dashboard: http://127.0.0.1:$(PORT)/   (Ctrl-C stops it)"
	$(PY) -m http.server $(PORT) --bind 127.0.0.1 --directory .asv/html

clean:
	rm -rf $(VENV) $(NEWEST) .pytest_cache .hypothesis
