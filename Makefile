# One-command setup: every target creates .venv, installs requirements.txt and builds the
# extension in release mode first, so a fresh clone needs nothing but `make demo` or `make test`.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.requirements-installed
INSTALLED := $(VENV)/.dynamo-rs-installed
export PATH := $(HOME)/.cargo/bin:$(PATH)
export VIRTUAL_ENV := $(abspath $(VENV))

.PHONY: all build demo test test-rust test-python lint bench bench-quick fuzz fuzz-quick clean

all: test

$(DEPS): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(DEPS)

# The first build installs the package (editable); later ones only rebuild the extension in
# place, which skips maturin's pip pass over torch's dependencies.
$(INSTALLED): $(DEPS)
	$(VENV)/bin/maturin develop --release --quiet
	touch $(INSTALLED)

build: $(INSTALLED)
	$(VENV)/bin/maturin develop --release --quiet --skip-install

demo: build
	$(PY) -m dynamo_rs demo

lint: $(DEPS)
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings
	$(PY) tools/gen_opcodes.py --check
	$(PY) tools/graph_break_docs.py --check
	$(PY) tools/check_wildcard_arms.py

test-rust:
	cargo test --workspace --quiet

# Tests run on every core (pytest-xdist); worksteal evens out the long model and zoo tests.
# Each worker is its own process, so no test may depend on another having run first.
test-python: build
	$(PY) -m pytest -q -n auto --dist worksteal

test: lint test-rust test-python

bench: build
	$(PY) benchmarks/run.py
	$(PY) benchmarks/zoo.py

bench-quick: build
	$(PY) benchmarks/run.py --quick
	$(PY) benchmarks/zoo.py --quick

# Differential fuzzing (tools/fuzz): random programs run eagerly and compiled, compared
# value for value and side effect for side effect; mismatches are shrunk into tests/fuzz_cases.
fuzz: build
	$(PY) tools/fuzz --programs 100000

fuzz-quick: build
	$(PY) tools/fuzz --programs 2000 --seed 1000000 --save ''

clean:
	rm -rf target $(VENV)
