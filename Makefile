# Two entry points: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast check fuzz bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/apmw plan examples/coding-agent.yaml

# the suite on every core (pytest-xdist, one worker per test file), then the tests that time a real server or
# cluster (marked serial) alone, so that nothing else loads the machine while they measure it
test: $(STAMP)
	scripts/ensure_browser.sh
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not serial"
	$(BIN)/python -m pytest -m serial

# the suite without the tests marked slow: a quick loop while editing (`make test` stays the full suite)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not slow"

# the fuzzers at length (CI runs a few examples of each): any value in any spec field, any verb's
# command line (5000/50 per verb), broken lines of every trace format (5000/10 per format)
fuzz: $(STAMP)
	APMW_FUZZ_EXAMPLES=5000 $(BIN)/python -m pytest tests/spec/test_fuzz.py tests/e2e/test_fuzz_verbs.py \
		tests/traces/test_fuzz_traces.py --hypothesis-show-statistics

# lint (ruff) and type check (mypy, the files listed in pyproject.toml)
check: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/plan_speed.py

clean:
	rm -rf $(VENV) build src/*.egg-info
