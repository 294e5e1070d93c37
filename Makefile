# The whole set-up: `make train` and `make test` create .venv, install requirements.txt and the project on first use.
VENV   := .venv
PYTHON := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup train test test-fast test-numerics test-slow clean

setup: $(STAMP)

# The project itself is installed editable (its commands and `python -m lra.*` work from any directory):
# --no-deps, requirements.txt has pinned everything; --no-build-isolation builds with the setuptools it pins.
$(STAMP): requirements.txt requirements-test.txt pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	$(PYTHON) -m pip install --quiet -r requirements-test.txt   # the attention tests' reference packages (test only)
	$(PYTHON) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

train: setup
	$(PYTHON) -m lra.train

# pytest exits 5 when it collected no test: treat that as the failure it is. --durations lists the slowest
# tests, which keep the default suite inside its 12-minute budget on 2 cores (mark longer ones slow); the last
# line gives the time the suite took and the machine. Two pytest-xdist workers of one thread each (--dist worksteal:
# each starts on its half of the collected tests, in file order, so a file's module fixtures are mostly made once, and
# takes tests from the other's queue when its own runs out, so neither idles at the end); half the suite's time is
# processes and compilers waiting on one core. A test must not depend on another's leftovers (state in the process, files).
test: setup
	start=$$(date +%s); OMP_NUM_THREADS=1 $(PYTHON) -m pytest -m "not slow" -n 2 --dist worksteal --durations=15; rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s on $$(nproc) cores of $$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //' || uname -m)"; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# The tests of one area while it is being changed, in under 2 minutes on 2 cores: `make test-fast AREA=runtime`
# (tests/<area>/ mirrors the source tree: attention, kernels, models, runtime, tasks, analysis, bench); without AREA,
# every area and the repo-wide checks. It leaves out the slow tests, those that start a process of their own
# (marker `process`: `python -m lra.*`, a script, a CLI) and those that run torch.compile (marker `compile`), all of
# which `make test` runs.
AREA ?=
test-fast: setup
	@if [ -n "$(AREA)" ] && [ ! -d tests/$(AREA) ]; then echo "no tests/$(AREA): AREA is one of $$(cd tests && ls -d */ | tr -d / | grep -v __pycache__ | tr '\n' ' ')"; exit 2; fi
	start=$$(date +%s); $(PYTHON) -m pytest -m "not slow and not process and not compile" --durations=5 tests/$(AREA); rc=$$?; \
	echo "make test-fast AREA=$(AREA): $$(( $$(date +%s) - start )) s"; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

# The numerics tests (float results against references: the files that set `pytestmark = pytest.mark.numerics`),
# again under one ATen SIMD level: ATen's kernels
# sum in another order on each (ATEN_CPU_CAPABILITY = default, avx2, avx512; a CPU without it falls back),
# so a tolerance that holds on one CPU only fails here too. .ci/run runs it with ISA=default after `make test`.
ISA ?= default

test-numerics: setup
	ATEN_CPU_CAPABILITY=$(ISA) $(PYTHON) -m pytest -m "numerics and not slow" tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

test-slow: setup
	$(PYTHON) -m pip install --quiet -r requirements-data.txt
	$(PYTHON) -m pytest -m slow; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

clean:
	rm -rf outputs multirun wandb .pytest_cache
