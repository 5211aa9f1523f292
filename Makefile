# Two commands on a fresh machine with Python 3.11+:
#   make run    the whole workflow on the bundled demo (results/index.html)
#   make test   the test suite
# Both create .venv with the pinned dependencies (requirements.lock) when it is missing.

PYTHON ?= python3
VENV   := .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
CORES  ?= all
# Test processes (pytest-xdist; "auto": one per core). Each test file runs whole in one
# process, so a file's shared fixtures (a tiny workflow run) are built once. 0: one process.
TEST_WORKERS ?= auto
# Jobs call `python -m locusformer`: the venv's python must come first on PATH.
export PATH := $(BIN):$(PATH)

.PHONY: run test lint lock clean

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements.lock -e ".[dev,scvi,workflow]"
	touch $(STAMP)

# The SLURM executor plugin (the slurm extra) runs `scontrol show config` at every Snakemake
# start; where a SLURM client is installed without a reachable controller, that waits out
# the plugin's 10 s timeout before the first job. The local executor never uses SLURM, so
# an empty configuration (unless one is set) makes scontrol fail at once.
run: $(STAMP)
	SLURM_CONF=$${SLURM_CONF-/dev/null} $(BIN)/snakemake --cores $(CORES)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/snakefmt --check workflow
	$(BIN)/snakemake --lint

lock: $(STAMP)
	$(BIN)/python -m pip freeze --exclude-editable | sed 's/+cpu$$//' > requirements.lock.new
	mv requirements.lock.new requirements.lock

# The workflow's outputs (its rules' benchmark tables are in logs/benchmarks/). The benchmark
# scripts' own outputs in benchmarks/out/ are results of experiments: clean leaves them.
clean:
	rm -rf results logs .snakemake
