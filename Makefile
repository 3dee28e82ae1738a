# GPUPool. `make demo` runs the product on its embedded default; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: demo test test-deps venv lint mutation clean

$(VENV)/.runtime: requirements.txt pyproject.toml
	@echo "installing GPUPool's Python packages into $(VENV) (first start, or after requirements.txt changed: a few minutes)..."
	scripts/make-venv.sh $(PYTHON) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

$(VENV)/.test: $(VENV)/.runtime requirements-test.txt
	$(PY) -m pip install -q -r requirements-test.txt
	touch $@

venv: $(VENV)/.runtime

demo: $(VENV)/.runtime
	$(PY) scripts/demo.py

test-deps: $(VENV)/.test
	scripts/install-test-deps.sh

# Lint, then the whole suite against PostgreSQL and Redis (started on free loopback ports),
# then the Django tests again on SQLite, the embedded default. Any failure, or no test at
# all (pytest's exit 5), fails the target.
test: test-deps
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m tests.services -- $(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS)
	env -u DATABASE_URL -u REDIS_URL GPUPOOL_TEST_EMBEDDED=1 \
		$(PY) -m pytest -p no:cacheprovider -m "not browser and not services" \
		--ignore=tests/engine $(PYTEST_ARGS)

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Mutation testing of the engine's actions and fair share (docs/engine.md, "Mutation testing").
# Slow: run a file at a time, e.g. make mutation MUTANTS='scheduling.engine.actions.reclaim*'.
# PYTEST_TIMEOUT (pytest-timeout) fails a test caught in a mutant's endless loop after 120 s;
# mutmut's own limit is 30 times the covering tests' time, over half an hour for fairshare.py.
MUTANTS ?=
MUTATION_CHILDREN ?= 2
mutation: $(VENV)/.test
	$(PY) -m pip install -q -r requirements-mutation.txt
	$(PY) -m pip install -q --no-deps -r requirements-mutmut.txt
	PYTEST_TIMEOUT=120 nice -n 10 \
		$(VENV)/bin/mutmut run --max-children $(MUTATION_CHILDREN) $(MUTANTS)
	$(VENV)/bin/mutmut results

clean:
	rm -rf $(VENV) var mutants
