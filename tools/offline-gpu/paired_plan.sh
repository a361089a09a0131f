#!/usr/bin/env bash
# The plan of the h200_paired grid's calls, here before any call (no GPU needed): the missing cells,
# smallest estimated first (from the records of the same points on disk), cut into calls of CALL_S
# seconds of estimated device time less a minute of start-up (the budget gpu_session.sh's `paired`
# step gives each call), each call's record paths written to .paired_calls/callNN.txt (carry that
# folder: the calls then need no records to plan from, and the tree can travel slim, slim_tree.sh),
# then `snakemake -n` of the first call's cells: a dry run of what it runs.
#   CALL_S=480 tools/offline-gpu/paired_plan.sh [OUTPUT_DIR]
set -eu
outdir=${1:-results/h200}
call_s=${CALL_S:-480}
python=${PYTHON:-.venv/bin/python}
"$python" -m attnbench check-config --config "output_dir=$outdir" "run=[h200_paired]"
"$python" -m attnbench records --grids h200_paired --calls "$((call_s - 60))" --calls-dir .paired_calls \
  --config "output_dir=$outdir"
first=$("$python" -m attnbench records --grids h200_paired --budget-s "$((call_s - 60))" --config "output_dir=$outdir")
echo "dry run of call 1 ($(echo "$first" | wc -l) cells):"
PATH=$(dirname "$python"):$PATH snakemake $first -n --profile profiles/local --cores 2 \
  --config "run=[h200_paired]" "output_dir=$outdir" 2>&1 | grep -A12 "^Job stats" | head -14
