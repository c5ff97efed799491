# Developer shortcuts. PY: the interpreter of your virtual environment.
PY ?= .venv/bin/python
FUZZ_EXAMPLES ?= 5000

.PHONY: test fuzz bench-cache

test:
	$(PY) -m pytest -q -m "not slow" -n 2

# the deep differential-fuzzing profile (docs/reliability.md): failing programs, shrunk,
# are written to tests/fuzz_regressions/ and replayed by every test run
fuzz:
	TILECC_FUZZ=deep TILECC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TILECC_FUZZ_COUNTER=$${TILECC_FUZZ_COUNTER:-/tmp/tilecc-fuzz-count} \
		nice -n 19 $(PY) -m pytest -q -p no:logging tests/test_fuzz.py -k random_programs

bench-cache:
	$(PY) benchmarks/compile_cache.py
