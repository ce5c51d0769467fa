# ddtk course kit. `make help` lists the targets.
# the interpreter .venv is made from: Debian's optimised python3.11 where it can build one
# (scripts/pick_python.sh says why and what it measured), else python3.11 or python3
PYTHON ?= $(shell bash scripts/pick_python.sh)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ddtk-installed
BUILD_DEPS := $(VENV)/.ddtk-build-deps
EXTRAS ?= ray,course,dev,horovod,deepspeed,tensorflow,profiling,book,monitoring
PYTEST_ARGS ?=
# pytest-xdist workers: 2 overlaps tests that wait with tests that compute, in the groups
# of tests/scheduling.py; 0 runs every test in this process, in order
TEST_JOBS ?= 2

.DEFAULT_GOAL := help
.PHONY: help lab test course book horovod horovod-wheel debs browser hub-proxy venv lint bench gpu-check lock clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-8s %s\n", $$1, $$2}'

# What Horovod's build needs (torch with its setuptools, numpy, cmake) goes in first, so
# that its compile (horovod-wheel) can run beside the install of everything else: that
# install finds them at the locked versions and leaves them alone.
$(BUILD_DEPS): requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock torch numpy cmake packaging
	@touch $@

$(STAMP): pyproject.toml requirements.lock $(BUILD_DEPS)
	$(BIN)/python -m pip install --quiet -c requirements.lock -e ".[$(EXTRAS)]"
	@touch $@

venv: $(STAMP) ## create .venv and install ddtk with every extra, at the locked versions

# Only the cached wheel: `make test` runs it beside the install; `make horovod` builds it too if missing.
horovod-wheel: $(BUILD_DEPS)
	bash scripts/build_horovod.sh --wheel-only $(BIN)/python

horovod: venv ## build Horovod 0.28.1 for this torch (cached wheel: seconds after the first time)
	bash scripts/build_horovod.sh $(BIN)/python

DEBS := chromium shellcheck iperf3 bwrap strace  # commands; bwrap comes in Debian's bubblewrap
DEBS_BARE := prometheus  # without recommends: Debian's prometheus recommends node-exporter, smartmontools and 200 MB more
debs: ## Debian packages the tests use: chromium (the quiz's browser test), shellcheck (deploy/ scripts), iperf3 (lecture 04), bubblewrap and strace (the grading sandbox), prometheus and promtool (monitoring); apt-get as root
	@missing=$$(for p in $(DEBS); do command -v $$p >/dev/null || echo $$p | sed 's/^bwrap$$/bubblewrap/'; done); \
	bare=$$(for p in $(DEBS_BARE); do command -v $$p >/dev/null || echo $$p; done); \
	test -z "$$missing$$bare" || { test "$$(id -u)" = 0 \
		&& { test -z "$$missing" || DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; } \
		&& { test -z "$$bare" || DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$bare >/dev/null; }; } \
		|| echo "missing and not root: run 'sudo apt-get install $$missing $$bare' (their tests are skipped)"

browser: debs

# configurable-http-proxy for the local JupyterHub (deploy/jupyterhub/jupyterhub_config.py),
# every npm package pinned by the lock file; a stamp, since npm dates the files it unpacks to 1985
HUB_PROXY := .cache/hub-proxy/.installed
$(HUB_PROXY): deploy/jupyterhub/proxy/package.json deploy/jupyterhub/proxy/package-lock.json
	@if command -v npm >/dev/null; then \
		mkdir -p $(@D) && cp $^ $(@D)/ \
		&& npm ci --prefix $(@D) --no-audit --no-fund --loglevel=error >/dev/null && touch $@ \
		|| echo "npm ci of configurable-http-proxy failed (the class-day test is skipped)"; \
	else echo "npm is missing: install Node.js 20+ and npm (the class-day test is skipped)"; fi

hub-proxy: $(HUB_PROXY) ## configurable-http-proxy 5.3.0 (npm, the chart's proxy) into .cache/hub-proxy, for the local JupyterHub

lab: venv ## install everything and start JupyterLab on lecture 01 (root or not; URL printed)
	$(BIN)/ddtk course lab

test: ## run the whole test suite, notebooks and the browser test included (FRESH=1: no stored runs)
	@# the Python install (network), the Horovod compile (CPU), the Debian packages (disk) and the hub's proxy (npm) overlap
	@$(MAKE) --no-print-directory -j3 venv horovod-wheel debs hub-proxy
	@$(MAKE) --no-print-directory horovod
	@# DeepSpeed compiles its CPU shared-memory op on first use (ddtk/frameworks/deepspeed_ops.py):
	@# build it in the background, beside the tests; a job that needs it first waits on DeepSpeed's lock
	@mkdir -p build && ($(BIN)/python -m ddtk.frameworks.deepspeed_ops > build/deepspeed-ops.log 2>&1 &)
	@# bytecode for every rank, kernel and worker process to load (PYTHONDONTWRITEBYTECODE=1 stops imports writing it)
	$(BIN)/python -m compileall -q -j 0 ddtk tests >/dev/null
	@# build/executed/ keeps executed notebooks by code, parameters and environment (ddtk/course/executions.py)
	@if [ -n "$(FRESH)" ]; then rm -rf build/executed; fi
	DDTK_REQUIRE=horovod,browser,hub,shellcheck,netns,iperf3,prometheus,monitoring $(BIN)/python -m pytest -n $(TEST_JOBS) tests course --ignore=tests/site --nbval-lax --durations=25 $(PYTEST_ARGS)
	@# the course site, from the notebooks the run above executed (build/executed/notebooks), and its test
	$(BIN)/ddtk course book
	DDTK_REQUIRE=browser,book DDTK_TEST_TIMES=build/test-times-site.json $(BIN)/python -m pytest tests/site $(PYTEST_ARGS)

book: venv ## the course site in build/book/_build/html, from the notebooks make test executed
	$(BIN)/ddtk course book

course: venv ## execute every notebook headless into build/executed/
	$(BIN)/ddtk course run

lint: venv ## ruff, and notebook hygiene (no outputs, labs up to date, parameters cells)
	$(BIN)/ruff check .
	$(BIN)/ddtk course check

bench: venv ## every benchmark, each against its peer or formula (JSON + PNG in build/bench/)
	$(BIN)/ddtk bench collectives --json build/bench/collectives.json --plot build/bench/collectives.png
	$(BIN)/ddtk bench dp --json build/bench/dp.json --plot build/bench/dp.png
	$(BIN)/ddtk bench compression --json build/bench/compression.json --plot build/bench/compression.png
	$(BIN)/ddtk bench tp --json build/bench/tp.json --plot build/bench/tp.png
	$(BIN)/ddtk bench pipeline --json build/bench/pipeline.json --plot build/bench/pipeline.png
	$(BIN)/ddtk bench zero --json build/bench/zero.json --plot build/bench/zero.png
	$(BIN)/ddtk bench precision --json build/bench/precision.json --plot build/bench/precision.png
	$(BIN)/ddtk bench memory --json build/bench/memory.json --plot build/bench/memory.png
	$(BIN)/ddtk bench checkpoint --json build/bench/checkpoint.json --plot build/bench/checkpoint.png
	$(BIN)/ddtk bench frameworks --json build/bench/frameworks.json --plot build/bench/frameworks.png
	$(BIN)/ddtk bench profiler --json build/bench/profiler.json --plot build/bench/profiler.png
	$(BIN)/ddtk bench network --json build/bench/network.json --plot build/bench/network.png

gpu-check: venv ## every GPU path once (NCCL, CUDA AMP, GPU traces, ZeRO, notebooks), ~8 min on one H100; records docs/benchmarks.md's GPU section
	$(BIN)/python -m ddtk.bench.gpu_check --record $(GPU_CHECK_ARGS)

lock: venv ## rewrite requirements.lock and environment.yml from .venv
	$(BIN)/python scripts/lock.py

clean: ## remove build outputs (keeps .venv and the Horovod wheel cache)
	rm -rf build .pytest_cache .ruff_cache
