# Two entry points (see README): `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-cuda venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/demo.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider

# the cuda target's tests under numba's CUDA simulator (no GPU needed); .ci/run runs it after `test`
test-cuda: $(STAMP)
	NUMBA_ENABLE_CUDASIM=1 $(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider tests/cuda

clean:
	rm -rf $(VENV) build *.egg-info
