#!/usr/bin/env bash
# After one call of gpu_session.sh: take what it wrote into this tree, before the next call (a call
# sees only the local tree, and the machine is given back after ~30 s idle, so this has to be quick).
#   tools/offline-gpu/take_call_results.sh FILES_AT [OUTPUT_DIR]
# FILES_AT: the folder the device put the call's $OUT files in (results.tgz among them). It
# - unpacks results.tgz over OUTPUT_DIR (default results/h200): the call started from this tree, so
#   what it holds is this tree's files plus the call's new ones;
# - copies a tuned Triton backward the call measured (OUTPUT_DIR/sparse_bwd_tuned.json) to where the
#   kernel reads it, so that the next call's cells run it;
# - removes the records this call added that say `unavailable` because a library was not installed
#   (its wheel comes in a later call), so that those cells run again; records already here stay;
# - keeps what the machine built, for later sessions, in .gpu_cache/ (ignored): the wheels of
#   built_wheels.tar in .gpu_cache/wheels/, FlashInfer's compiled modules (flashinfer_aot.tgz.partN)
#   in .gpu_cache/flashinfer_aot/; tools/offline-gpu/carry_wheels.sh puts both into .whl/.
set -euo pipefail
at=$1 outdir=${2:-results/h200}
[ -f "$at/results.tgz" ] || { echo "no results.tgz in $at" >&2; exit 1; }
tmp=$(mktemp -d)
tar xzf "$at/results.tgz" -C "$tmp"
[ -d "$tmp/$outdir" ] || { echo "results.tgz holds no $outdir" >&2; exit 1; }
before=$(mktemp)
find "$outdir/cells" -name '*.json' 2> /dev/null | sort > "$before"
cp -r "$tmp/$outdir/." "$outdir/"
rm -rf "$tmp"
if [ -f "$outdir/sparse_bwd_tuned.json" ]; then
  cp "$outdir/sparse_bwd_tuned.json" workflow/attnbench/kernels/triton_bsa_tuned.json
  echo "the Triton backward's tuned settings: workflow/attnbench/kernels/triton_bsa_tuned.json"
fi
find "$outdir/cells" -name '*.json' | sort | comm -13 "$before" - | python3 -c '
import json, sys
from pathlib import Path

removed = 0
for line in sys.stdin:
    f = Path(line.strip())
    r = json.loads(f.read_text())
    if r.get("status") == "unavailable" and "is not installed" in (r.get("status_reason") or ""):
        f.unlink()
        removed += 1
print(f"removed {removed} new records of libraries not installed in that call")
'
rm -f "$before"
# one tar, or its parts (gpu_session.sh splits one over 15 MiB)
wheels_tar=$at/built_wheels.tar
if ls "$at"/built_wheels.tar.part* > /dev/null 2>&1; then
  wheels_tar=$(mktemp) && cat "$at"/built_wheels.tar.part* > "$wheels_tar"
fi
if [ -f "$wheels_tar" ]; then
  mkdir -p .gpu_cache/wheels && tar xf "$wheels_tar" -C .gpu_cache/wheels
  # kept in the repository too (a later session starts without .gpu_cache/): slim_tree.sh keeps
  # them out of a call's tree, carry_wheels.sh carries them in .whl/
  mkdir -p tools/offline-gpu/built && tar xf "$wheels_tar" -C tools/offline-gpu/built
  echo "built wheels kept: $(tar tf "$wheels_tar" | tr '\n' ' ')"
fi
if ls "$at"/flashinfer_aot.tgz.part* > /dev/null 2>&1; then
  mkdir -p .gpu_cache/flashinfer_aot && cat "$at"/flashinfer_aot.tgz.part* | tar xz -C .gpu_cache/flashinfer_aot
  echo "FlashInfer modules kept: $(ls .gpu_cache/flashinfer_aot | tr '\n' ' ')"
fi
