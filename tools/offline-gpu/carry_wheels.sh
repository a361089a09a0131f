#!/usr/bin/env bash
# Fill .whl/ with what tools/offline-gpu/gpu_session.sh installs on a GPU machine that has no network:
# Snakemake and its plugins (the pins of envs/requirements-cpu.txt, minus what the GPU image already
# has), ninja (for the subset builds), plus any extra wheel files named as arguments (FlashAttention
# wheels built elsewhere, fa3-fwd), plus what earlier GPU calls built, kept in .gpu_cache/.
# Compiled wheels are fetched for CPython 3.12 on manylinux x86_64 (the GPU image), the rest built here.
#   [PINS="name==version ..."] [BASE=0] tools/offline-gpu/carry_wheels.sh [EXTRA.whl ...]; then run with carry [".whl"]
# PINS: more packages from PyPI (the sparse kernels' libraries); BASE=0: only those and the EXTRA
# files, for a later call on a machine that has the Snakemake set already. Empties .whl/ first; fails
# when .whl/ and the working tree pass the 64 MiB a call carries.
set -eu
dest=.whl
python=${PYTHON:-python3}
# in the GPU image already (listed here), or not needed there (PuLP: the sessions use --scheduler greedy)
image="numpy pandas pyyaml jinja2 requests psutil wrapt matplotlib seaborn pytest torch triton markupsafe
packaging pillow contourpy cycler fonttools kiwisolver pyparsing python-dateutil tzdata certifi idna
urllib3 charset-normalizer filelock fsspec networkx sympy mpmath typing-extensions iniconfig pluggy
pygments pulp"
rm -rf "$dest" && mkdir -p "$dest"  # each call carries only what this command puts there
norm() { echo "$1" | tr 'A-Z_' 'a-z-'; }
# fetch PIN: its wheel for CPython 3.12 on the GPU image's glibc (2.39), else built here (pure Python)
fetch() {
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64 \
    --platform manylinux_2_35_x86_64 --platform any -d "$dest" "$1" 2> /dev/null ||
    "$python" -m pip wheel --quiet --no-deps -w "$dest" "$1"
}
if [ "${BASE:-1}" != 0 ]; then
  grep -E '^[A-Za-z]' envs/requirements-cpu.txt | while IFS= read -r pin; do
    name=$(norm "${pin%%==*}")
    case " $(echo $image) " in *" $name "*) continue;; esac
    fetch "$pin"
  done
  # ninja: the subset builds (gpu_session.sh steps fa2build, bsa) compile in parallel only with it
  fetch ninja
  # what earlier sessions' machines built (tools/offline-gpu/take_call_results.sh keeps it): no build next time
  ls .gpu_cache/wheels/*.whl > /dev/null 2>&1 && cp .gpu_cache/wheels/*.whl "$dest/"
  # and those kept in the repository by an earlier session (take_call_results.sh)
  ls tools/offline-gpu/built/*.whl > /dev/null 2>&1 && cp -n tools/offline-gpu/built/*.whl "$dest/"
  [ -d .gpu_cache/flashinfer_aot ] && mkdir -p "$dest/flashinfer_aot" && cp -r .gpu_cache/flashinfer_aot/. "$dest/flashinfer_aot/"
fi
for pin in ${PINS:-}; do fetch "$pin"; done
for extra in "$@"; do cp "$extra" "$dest/"; done
ls "$dest"/*.whl | wc -l | xargs echo "wheels in $dest:"
# A call carries the working tree (tracked and untracked, not ignored) with its carry paths, 64 MiB
# in all: say whether this .whl/ fits (and .src/ too, for a call that builds Block-Sparse-Attention).
# Each file counted as in a tar archive (a 512-byte header, the bytes padded to 512), not as its bytes
# alone: the device refused a call of 62.9 MiB of bytes whose tree, 3,400 small files, takes 43 MiB
# that way (2026-12-03).
mib() { awk '{s += 512 + int(($1 + 511) / 512) * 512} END {printf "%.1f", s / 1048576}'; }
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2> /dev/null | mib)
whl=$(find "$dest" -type f -printf '%s\n' | mib)
src=$( (find .src -type f -printf '%s\n' 2> /dev/null || echo 0) | mib)
total=$(awk -v t="$tree" -v w="$whl" 'BEGIN {print t + w}')
echo "a call carrying $dest: tree $tree MiB + $dest $whl MiB = $total MiB of 64 (with .src/ $src MiB more)"
if awk -v s="$total" 'BEGIN {exit !(s > 64)}'; then
  echo "carry_wheels.sh: over the 64 MiB one call carries; leave a wheel out (an EXTRA or a PIN this call does not need) or carry it in a later call" >&2
  exit 1
fi
