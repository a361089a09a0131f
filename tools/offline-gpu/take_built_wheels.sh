#!/usr/bin/env bash
# After a call that ran `build_wheels.sh collect`: the wheels it brought back, put together from
# their parts under their own names into tools/offline-gpu/built/ (tracked: later sessions carry
# them instead of building again), and the build logs into .gpu_cache/build_logs/.
#   tools/offline-gpu/take_built_wheels.sh FILES_AT
set -euo pipefail
at=$1 built=tools/offline-gpu/built
[ -f "$at/build_logs.tgz" ] || { echo "no build_logs.tgz in $at" >&2; exit 1; }
mkdir -p .gpu_cache/build_logs "$built"
tar xzf "$at/build_logs.tgz" -C .gpu_cache/build_logs
for first in "$at"/*.whl.part1-of-*; do
  [ -f "$first" ] || continue
  name=$(basename "${first%.whl.part1-of-*}") n=${first##*-of-}
  whl=$(cat ".gpu_cache/build_logs/$name.name")
  for k in $(seq 1 "$n"); do cat "$at/$name.whl.part$k-of-$n"; done > "$built/$whl"
  python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).testzip() is None or sys.exit("corrupt")' "$built/$whl"
  echo "kept $built/$whl ($(du -h "$built/$whl" | cut -f1)); $(grep -h '^Built in' ".gpu_cache/build_logs/$name.log")"
done
