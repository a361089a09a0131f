#!/usr/bin/env bash
# Kernel wheels built on the GPU machine side by side, detached so that they outlive the call that
# starts them, and brought back by the calls made right after it (the machine stays up while calls
# follow each other within ~30 s).
#   tools/offline-gpu/build_wheels.sh start "NAME[:JOBS] ..."   builds envs/build_NAME.sh from
#       .src/NAME-src.tar.gz, all at once at nice 19, each with JOBS compile jobs (default 8); the
#       build scripts' own variables (FA3_HEAD_DIMS, FA3_FP8, FA3_MLA, FFA_HEAD_DIMS, ...) pass through
#   tools/offline-gpu/build_wheels.sh collect WAIT_S
#       waits up to WAIT_S s for the builds still running, then puts each finished wheel not brought
#       back yet into $OUT as NAME.whl.partK-of-N (15 MiB parts; at most 7 files and 60 MiB a call,
#       whole wheels only: the rest comes with the next collect) and every build's log into
#       build_logs.tgz
# Here, after the call: tools/offline-gpu/take_built_wheels.sh FILES_AT keeps them in
# tools/offline-gpu/built/.
set -u
work=/tmp/built_wheels
out=${OUT:-/tmp/out}
mkdir -p "$out"

start() {
  if [ -f "$work/started" ]; then echo "builds already started on this machine: $(cat "$work/started")"; return 0; fi
  mkdir -p "$work/envs" "$work/src"
  # the scripts and sources copied first: the next call replaces this tree while they build
  cp envs/*.sh envs/*.py "$work/envs/"
  for entry in $1; do
    name=${entry%%:*} jobs=${entry#*:}
    [ "$jobs" = "$entry" ] && jobs=8
    [ -f "envs/build_$name.sh" ] || { echo "no envs/build_$name.sh"; return 1; }
    cp ".src/$name-src.tar.gz" "$work/src/" || return 1
    setsid nice -n 19 bash -c 'start=$(date +%s)
      bash "$0/envs/build_$1.sh" --source "$0/src/$1-src.tar.gz" --python python3 --out-dir "$0/$1" --jobs "$2" > "$0/$1.log" 2>&1
      rc=$?; echo "Built in $(( $(date +%s) - start )) s (exit $rc)" >> "$0/$1.log"; echo $rc > "$0/$1.done"' \
      "$work" "$name" "$jobs" > /dev/null 2>&1 < /dev/null &
    echo "started $name with $jobs jobs"
  done
  echo "$1" > "$work/started"
}

collect() {
  local wait_s=$1 t0 files=0 bytes=0 limit_files=7 limit_bytes=$((60 * 1048576))
  t0=$(date +%s)
  for name in $(cat "$work/started" 2> /dev/null); do
    name=${name%%:*}
    while [ ! -f "$work/$name.done" ] && [ $(( $(date +%s) - t0 )) -lt "$wait_s" ]; do sleep 5; done
  done
  for name in $(cat "$work/started" 2> /dev/null); do
    name=${name%%:*}
    if [ ! -f "$work/$name.done" ]; then echo "$name: still building ($(tail -c 300 "$work/$name.log" | tr '\n' ' '))"; continue; fi
    [ -f "$work/$name.brought" ] && { echo "$name: brought back by an earlier call"; continue; }
    if [ "$(cat "$work/$name.done")" != 0 ]; then echo "$name: build failed: $(tail -3 "$work/$name.log" | tr '\n' ' ')"; continue; fi
    for whl in "$work/$name"/*.whl; do
      size=$(stat -c %s "$whl") n=$(( ($(stat -c %s "$whl") + 15728639) / 15728640 ))
      if [ $((files + n)) -gt $limit_files ] || [ $((bytes + size)) -gt $limit_bytes ]; then
        echo "$name: $(basename "$whl") waits for the next collect (this call's files are full)"; continue 2
      fi
      # a '+' (a local version) does not come back in a file name: NAME.whl.partK-of-N, the wheel's name inside
      split -n "$n" -d -a 1 "$whl" "$out/$name.whl.part"
      for k in $(seq 0 $((n - 1))); do mv "$out/$name.whl.part$k" "$out/$name.whl.part$((k + 1))-of-$n"; done
      basename "$whl" > "$work/$name.name"
      files=$((files + n)) bytes=$((bytes + size))
      echo "$name: $(basename "$whl") ($((size / 1048576)) MiB in $n parts), $(grep -h '^Built in' "$work/$name.log")"
    done
    touch "$work/$name.brought"
  done
  # the logs, and the wheels' real names (take_built_wheels.sh reads them)
  (cd "$work" && tar czf "$out/build_logs.tgz" -- *.log *.name 2> /dev/null)
}

case "${1:-}" in
  start) start "${2:?start needs the names}" ;;
  collect) collect "${2:-0}" ;;
  *) echo "usage: $0 start \"NAME[:JOBS] ...\" | collect WAIT_S" >&2; exit 2 ;;
esac
