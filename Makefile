# Two commands on a fresh Debian machine with Python >= 3.11:
#   make run    create .venv if missing, install the pinned dependencies, run the default grid
#   make test   the same environment, every test
# Then `. .venv/bin/activate` puts snakemake on PATH. In this folder plain `snakemake` runs with
# profiles/local (through profiles/default), and `snakemake --profile slurm` (or `local`) finds
# profiles/slurm through the link ./slurm: Snakemake looks a profile name up in the current folder.
PYTHON ?= python3
VENV ?= .venv
CORES ?= 2
# GPU cells run at once: profiles/local counts this machine's GPUs (nvidia-smi); GPUS=N overrides.
GPUS ?=
BIN := $(abspath $(VENV))/bin
export PATH := $(BIN):$(PATH)
SNAKEMAKE := $(BIN)/snakemake

.PHONY: run test durations lint format figures report dry-run clean-results

$(VENV)/.installed: envs/requirements-cpu.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is needed, found " + sys.version'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r envs/requirements-cpu.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

run: $(VENV)/.installed
	$(SNAKEMAKE) --profile profiles/local --cores $(CORES) $(if $(GPUS),--resources gpu=$(GPUS))

# Two stages: the main stage, every test but the Slurm cluster's and the slow modules' (the
# `slow` marker follows measured seconds: tests/durations.py); then those (each Slurm test starts a
# throwaway cluster). Every test's seconds kept in .pytest-durations-STAGE.tsv, the slowest printed;
# `make durations` makes them the measurement the marker follows (tests/durations.tsv).
test: $(VENV)/.installed
	@t0=$$(date +%s); $(BIN)/python -m pytest -m "not slurm and not slow" --durations-path .pytest-durations-main.tsv; \
	  main=$$?; echo "main stage: $$(( $$(date +%s) - t0 )) s"; head -16 .pytest-durations-main.tsv; \
	  echo "CPU time so far (this shell, then its children: user system):"; times; \
	  t1=$$(date +%s); $(BIN)/python -m pytest -m "slurm or slow" --durations-path .pytest-durations-slow.tsv; \
	  slow=$$?; echo "second stage (Slurm cluster, slow modules): $$(( $$(date +%s) - t1 )) s"; \
	  head -16 .pytest-durations-slow.tsv; \
	  echo "CPU time of both stages (this shell, then its children: user system):"; times; \
	  [ $$main -eq 0 ] && { [ $$slow -eq 0 ] || [ $$slow -eq 5 ]; }

durations:
	$(BIN)/python tests/durations.py .pytest-durations-main.tsv .pytest-durations-slow.tsv

# Style and Snakemake's house rules, from the pinned envs/requirements-lint.txt (.ci/run runs it
# before the tests); `make format` rewrites what the checks would flag.
PY_PATHS := workflow tests benchmarks
SMK_PATHS := Snakefile workflow/rules

$(VENV)/.lint-installed: envs/requirements-lint.txt $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -r envs/requirements-lint.txt
	touch $@

lint: $(VENV)/.lint-installed
	$(BIN)/snakefmt --check $(SMK_PATHS)
	$(BIN)/ruff check $(PY_PATHS)
	$(BIN)/ruff format --check $(PY_PATHS)
	$(SNAKEMAKE) --lint

format: $(VENV)/.lint-installed
	$(BIN)/ruff check --fix $(PY_PATHS)
	$(BIN)/ruff format $(PY_PATHS)
	$(BIN)/snakefmt $(SMK_PATHS)

# Tidy table, tables, figures and their captions again from the records on disk (no cell runs);
# `make report` also writes the HTML report (<output_dir>/report.html, or REPORT=path).
# Other grids, your own file of settings, settings over it (as snakemake --configfile / --config):
#   make figures GRIDS="h200_sweep" CONFIG="output_dir=results/h200"
#   make report CONFIGFILE=mine.yaml
REGENERATE = $(BIN)/python -m attnbench regenerate $(if $(CONFIGFILE),--configfile $(CONFIGFILE)) \
	$(if $(GRIDS),--grids $(GRIDS)) $(if $(CONFIG),--config $(CONFIG)) --jobs $(CORES)

figures: $(VENV)/.installed
	$(REGENERATE)

report: $(VENV)/.installed
	$(REGENERATE) --report $(REPORT)

dry-run: $(VENV)/.installed
	$(SNAKEMAKE) --profile profiles/local --cores $(CORES) $(if $(GPUS),--resources gpu=$(GPUS)) -n
