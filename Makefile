# The two commands a newcomer runs: `make demo` and `make test`.
PY ?= python3
export PYTHONUNBUFFERED := 1

.PHONY: install install-test demo test test-fast smollm2-plan

install:
	PYTHON=$(PY) scripts/install.sh

install-test:
	PYTHON=$(PY) scripts/install.sh test
	scripts/test_services.sh install

demo: install
	$(PY) -m compiler.demo

test: install-test
	OMP_NUM_THREADS=1 scripts/test_services.sh run $(PY) -m pytest tests $(PYTEST_ARGS)

# the tests without PostgreSQL or Chromium, for a quick edit-test loop
test-fast:
	$(PY) -m pytest tests -m "not slow" -x -q $(PYTEST_ARGS)

# the SmolLM2 plan tests/compiler/test_serve.py serves (after plan-format or op-signature changes)
smollm2-plan:
	PY=$(PY) scripts/smollm2_plan.sh
