# scankit: `make test` (CPU, any machine) and `make bench` (CUDA machine).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-test.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $(STAMP)

## test: CPU test suite; Triton kernels run through TRITON_INTERPRET=1
test: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n auto tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
