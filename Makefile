# Two entry points (see README): `make demo` and `make test`. Both create .venv when missing, with
# the test tools, the GPU stack and Ray (the extras test, cuda and ray: make test-cuda and the PTX gate need
# cuda, tests/test_tune_ray.py needs ray).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-cuda ptx-gate conformance-cuda venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e '.[test,cuda,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/python examples/demo.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider -m "not heavy"

# the tests marked "heavy" (the largest light models, the longer halves of some sweeps: see
# pyproject.toml and README), kept out of the default suite's 15 minutes; .ci/run
# runs it after `test`
test-heavy: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider -m heavy

# the cuda target's tests under numba's CUDA simulator (no GPU needed), which export every kernel
# source they generate into $(CUDA_SOURCES); then the PTX gate. .ci/run runs it after `test`
CUDA_SOURCES := build/cuda-sources
test-cuda: $(STAMP)
	rm -rf $(CUDA_SOURCES)
	NUMBA_ENABLE_CUDASIM=1 TENSORFUSE_CUDA_SOURCES_DIR=$(CURDIR)/$(CUDA_SOURCES) $(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider tests/cuda
	$(MAKE) --no-print-directory ptx-gate

# the PTX gate, without the simulator: every kernel the simulator tests exported and every kernel
# of resnet18, mobilenet_v2 and bert_mini (../shared/models) compiles to PTX for sm_90 (and
# assembles with ptxas when it is on PATH); kernels that compiled before are remembered in
# build/ptx-gate-cache; first the PTX tests and every shared model compiled for cuda
# (tests/test_codegen_cuda_ptx.py, tests/test_ptx_gate.py, tests/test_cuda_models.py)
ptx-gate: $(STAMP)
	env -u NUMBA_ENABLE_CUDASIM TENSORFUSE_PTX_TESTS=1 $(VENV)/bin/python -m pytest -n 2 -q -p no:cacheprovider \
		tests/test_codegen_cuda_ptx.py tests/test_ptx_gate.py tests/test_cuda_models.py
	env -u NUMBA_ENABLE_CUDASIM $(VENV)/bin/python -m tensorfuse.compiler.ptx_gate --sources $(CUDA_SOURCES) \
		--shared-models --cache build/ptx-gate-cache

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
