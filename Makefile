# Two entry points (see README): `make demo` (set-up + export 12x768 + parity check), `make test`.
VENV   ?= .venv
PYTHON ?= $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test,plot]'
	touch $@

demo: $(STAMP)
	$(VENV)/bin/mha-export onnx --heads 12 --dim 768 --force
	$(VENV)/bin/mha-export torchscript --heads 12 --dim 768 --force
	$(VENV)/bin/mha-export check models/split-h12-d768-onnx --json models/split-h12-d768-onnx/parity-ci.json

test: $(STAMP)
	$(PYTHON) -m pytest -q

clean:
	rm -rf build models/*-onnx models/*-torchscript
