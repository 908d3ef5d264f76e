# Two entry points (see README): `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-cuda conformance-cuda venv clean

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

# the ONNX backend tests of the core subset on device CUDA under numba's CUDA simulator, then their
# counts per category beside the CPU's (tests/conformance_counts.py). Slow (the simulator runs
# each GPU thread as a Python thread): not part of `test`. CONFORMANCE_K narrows it, e.g.
# `make conformance-cuda CONFORMANCE_K="OnnxBackendNodeModelTest and _cuda"` for the node tests.
CONFORMANCE_K ?= _cuda
conformance-cuda: $(STAMP)
	mkdir -p build
	NUMBA_ENABLE_CUDASIM=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_onnx_backend.py \
		-k "$(CONFORMANCE_K)" -rf --junitxml=build/conformance-cuda.xml; rc=$$?; \
	NUMBA_ENABLE_CUDASIM=1 $(VENV)/bin/python tests/conformance_counts.py build/conformance-cuda.xml || rc=1; \
	exit $$rc

clean:
	rm -rf $(VENV) build *.egg-info
