# Set-up-and-go targets: each makes the virtual environment on first use, pinned by constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: train test clean

$(VENV)/.core: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e .
	touch $@

$(VENV)/.dev: $(VENV)/.core
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

train: $(VENV)/.core  ## train on the built-in dataset (pass more flags with ARGS="--epochs 5")
	$(PY) train.py $(ARGS)

test: $(VENV)/.dev  ## run the test suite
	$(PY) -m pytest tests $(ARGS)

clean:
	rm -rf $(VENV) runs data/shapes data/shapes.yaml
