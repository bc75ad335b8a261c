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

# The demo's recipe (docs/training.md, "The demo"): an 8-minute budget, and settings that learn the most per minute
# on a 2-core CPU without BF16 (no gradient accumulation, AdamW at a higher rate, 256 px, one input size).
DEMO ?= --time 8m --imgsz 256 --nominal-batch 16 --optimizer AdamW --lr0 0.005 --momentum 0.9 --no-multi-scale

train: $(VENV)/.core  ## train on the built-in dataset (pass more flags with ARGS="--time 4m")
	$(PY) train.py $(DEMO) $(ARGS)

# Two workers, each test file whole on one of them: its module fixtures (the pt2 compile, the wheel install, the
# torchrun runs) are built once. (Tests one by one to either worker, --dist loadgroup: 339 s against 292 s.)
# --no-loadscope-reorder: files are handed out in collection order, which tests/conftest.py starts with the
# slowest; xdist's own order (most tests first) left the one-minute files to the end, one worker running them alone.
test: $(VENV)/.dev  ## run the test suite
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder tests $(ARGS)

clean:
	rm -rf $(VENV) runs datasets/shapes
