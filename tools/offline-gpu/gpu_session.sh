#!/usr/bin/env bash
# One GPU session on a machine without network (how results/h200 was made): install the carried
# wheels, check the machine, then the steps named in STEPS, each bounded by its own time budget;
# what a step does not finish is simply missing (run it again to resume: Snakemake runs only the
# cells without a record). Everything written goes under OUTPUT_DIR, packed into $OUT at the end.
#   STEPS="verify cp sparse kernels dobench" tools/offline-gpu/gpu_session.sh [OUTPUT_DIR]
# with ATTNBENCH_GIT_COMMIT=<the local HEAD> ATTNBENCH_GIT_DIRTY=0|1 in front: the records name that commit
# (the machine's copy of .git is older than the tree it receives)
# Steps (budgets in seconds, from the environment):
#   verify   CP correctness matrix with NCCL on all the machine's GPUs (VERIFY_WORLD): SDPA local kernels (T_VERIFY), FlashAttention
#            (fa2, fa3; T_VERIFY), then FlexAttention on every CP mask (T_VERIFY_FLEX; it compiles per
#            mask), into OUTPUT_DIR/cp_verify; VERIFY="sdpa flash" (any of sdpa, flash, flex, dkv: Ring P2P
#            (and USP, LoongTrain where they have a ring) with dK/dV sent in bf16) runs those
#   cp       the h200_cp grid (T_CP) in stages of cell lengths (CP_STAGES, "|" between stages;
#            default 64K tokens per GPU and the 1-GPU references first, then 128K, then 16K)
#   cpemu    the h200_cp_emulated grid (T_CPEMU, one GPU enough) in stages of total lengths (CPEMU_STAGES;
#            default worlds 2, 4, 8 at 64K tokens per rank: 131072|262144|524288)
#   cpemurows  the h200_cp_emulated cells at 8K-32K tokens per rank, worlds 2 and 4 (T_CPEMUROWS): the
#            CP model's per-call terms at the rows per rank its 64K cells cannot tell apart (stages of total
#            lengths CPEMUROWS_STAGES, default 16384 32768|65536|131072)
#   emuseries  benchmarks/cp_emulate_series.sh (issue 33's target; EMUSERIES_BEFORE: a tree of the code
#            before a change) started detached from a copy of this tree in /tmp/emuseries, so that it
#            outlives the call: this call and every next one with this step (made at once, while the
#            machine stays up) wait for it up to T_EMUSERIES s and copy what it wrote so far into
#            OUTPUT_DIR/cp_emulate/series/ (EMU_RESUME=1: it starts from what that folder holds, each
#            run keeping its finished (method, mask, world) runs)
#   comm     the NCCL communication benchmark of the CP model (rule comm_bench) on all the GPUs
#   sparse   the h200_sparse grid (T_SPARSE) in stages of lengths: 32K (and the 16K paper cells), 64K,
#            128K, 96K, each with its dense references (SPARSE_STAGES; SPARSE_OPTS="--kernels K.."),
#            after checking that this torch draws the records' block layouts (OUTPUT_DIR/pytest_layouts.txt)
#   cpx8     the h200_cp_x8 grid, 4 and 8 GPUs (T_CPX8), on a machine of 8
#   kernels  the h200 grid (T_KERNELS)        dobench  benchmarks/do_bench_compare.py (T_DOBENCH)
#   grids    the grids named in GRIDS, one after the other (T_GRIDS each)
#   vendor   the vendors' own benchmarks (benchmarks/vendor_calibration.py, T_VENDOR) into OUTPUT_DIR/vendor
#   idle     the same calls timed settled, after idle and cold (vendor_calibration.py idle-vs-settled, T_IDLE)
#            into OUTPUT_DIR/vendor/idle_vs_settled.txt
#   paired   the h200_paired grid, or the one PAIRED_GRID names (h100_paired on an H100; T_PAIRED):
#            the missing cells in order of the time the records of the same
#            points estimate, smallest first, as many as fit the budget (`attnbench records --budget-s`),
#            in one Snakemake run; every call measures whole cells and brings them back
#            (take_call_results.sh), the next call goes on with the next smallest; PAIRED_SKIP="KERNEL..."
#            leaves out the kernels whose library comes in a later call
#   sweep    the h200_sweep grid, shortest lengths first (T_SWEEP), then its busy share and cells per
#            GPU-minute (benchmarks/harness_throughput.py) into OUTPUT_DIR/throughput/
#   gputests the GPU tests (T_GPUTESTS; GPUTESTS="pytest arguments", quotes kept) into OUTPUT_DIR/pytest_gpu.txt
#   fa2build build FlashAttention-2's subset (envs/build_flash_attn.sh, T_FA2BUILD) from the carried
#            sdist .src/flash_attn-2.8.3.post2.tar.gz, then FA2's GPU test on that wheel: its log and
#            the test's into OUTPUT_DIR/build_fa2.log and pytest_gpu_fa2_built.txt, the wheel to $OUT
#   bsa      build Block-Sparse-Attention (envs/build_block_sparse_attn.sh) from the carried source
#            tarball .src/block_sparse_attn-src.tar.gz into /tmp/site, unless installed; its wheel
#            goes to $OUT (carry it in .whl/ next time) and its log to OUTPUT_DIR/build_bsa.log
#   sparsebench  benchmarks/sparse_bwd_bench.py (T_SPARSEBENCH; SPARSEBENCH="its options") into
#            OUTPUT_DIR/sparse_bwd_bench.{txt,json}, its best setting per block into
#            OUTPUT_DIR/sparse_bwd_tuned.json (copy it to workflow/attnbench/kernels/triton_bsa_tuned.json)
#   regen    tables and figures of the H200 grids (else only the tidy table, for dobench)
#   builds   build the kernels named in BUILDS (default "flash_attn_3 flashmask": envs/build_NAME.sh from the
#            carried .src/NAME-src.tar.gz) one after the other in the background, detached and at nice 19, so
#            that they outlive this call and the GPU steps run meanwhile (BUILD_JOBS compile jobs, default 12);
#            every call on the same machine then installs each wheel once its build is done
#            (/tmp/built/NAME.done holds the exit status; logs in OUTPUT_DIR/build_NAME.log) and brings it back
# A wheel over what one call carries travels in parts, one call after the other while the machine
# stays up: .parts/NAME.whl.partK-of-N (split -n N), gathered in /tmp/parts and installed once
# all N are there. .whl/flashinfer_aot/MODULE/MODULE.so (prebuilt FlashInfer kernels) are copied
# into the installed flashinfer's data/aot (once it is installed), which it loads instead of compiling.
set -u
outdir=${1:-results/h200}
steps=${STEPS:-verify cp sparse kernels dobench}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# a Triton autotuner's choice (vsa_triton's forward tries 6 settings: 20-80 s of the GPU at 128K) kept
# on disk for this machine, keyed by kernel, GPU and shape: one tuning per shape, not one per worker
export TRITON_CACHE_AUTOTUNING=1
# A call made right after another on the same machine finds the last call's /tmp/site, and may carry
# other files (or only the wheels not installed yet) instead of the wheels again.
# install WHEEL...: into /tmp/site, or the folder TARGET names
install() { timeout 300 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${TARGET:-/tmp/site}" "$@"; }
# gather FIRST: NAME from its parts NAME.partK-of-N (FIRST is part 1), once all N are beside it
gather() {
  local whole=${1%.part1-of-*} n=${1##*-of-} have
  have=$(ls "$whole".part*-of-"$n" | wc -l)
  if [ "$have" -ne "$n" ]; then echo "$(basename "$whole"): $have of $n parts here so far"; return 1; fi
  for i in $(seq 1 "$n"); do cat "$whole.part$i-of-$n"; done > "$whole"
}
if ls .whl/*.whl > /dev/null 2>&1; then
  # .whl/ stays on the machine between calls (ignored paths are kept): install it once
  carried=$(cd .whl && ls -l -- *.whl | md5sum)
  if [ "$(cat /tmp/site/.carried 2> /dev/null)" = "$carried" ]; then
    echo "the wheels of .whl/ are installed already"
  else
    install .whl/*.whl || exit 1
    # one pip --target run keeps one top-level include/ of the wheels it installs (greenlet's
    # headers replaced cudnn-frontend's C++ headers, which TE's build needs): the frontend again, alone
    if ls .whl/nvidia_cudnn_frontend-*.whl > /dev/null 2>&1; then install .whl/nvidia_cudnn_frontend-*.whl || exit 1; fi
    echo "$carried" > /tmp/site/.carried
  fi
elif [ ! -d /tmp/site/snakemake ]; then
  echo "no wheels carried (.whl) and none installed by an earlier call (/tmp/site)"; exit 1
fi
if ls .parts/*.part* > /dev/null 2>&1; then
  mkdir -p /tmp/parts && cp .parts/*.part* /tmp/parts/
  # /tmp/parts keeps every earlier call's parts: install each wheel once (a later reinstall of one
  # of TransformerEngine's wheels alone would replace the folder the three share, below)
  for first in /tmp/parts/*.part1-of-*; do
    whole=${first%.part1-of-*}
    [ -f "$whole.installed" ] && continue
    case $(basename "$whole") in transformer_engine*) gather "$first"; continue ;; esac
    gather "$first" && install "$whole" && touch "$whole.installed" && echo "installed $(basename "$whole") from parts"
  done
fi
# TransformerEngine's three wheels (transformer_engine, transformer_engine_cu13 from parts,
# transformer_engine_torch) write into one folder, transformer_engine/, which each pip --target run
# replaces whole: kept as they come, then installed again together in one run once all three are here
mkdir -p /tmp/te_wheels && cp .whl/transformer_engine*.whl /tmp/parts/transformer_engine*.whl /tmp/te_wheels/ 2> /dev/null
if [ "$(ls /tmp/te_wheels/*.whl 2> /dev/null | wc -l)" -eq 3 ] && [ ! -f /tmp/te_wheels/.installed ]; then
  install /tmp/te_wheels/*.whl && touch /tmp/te_wheels/.installed && echo "installed TransformerEngine: $(cd /tmp/te_wheels && ls -- *.whl | tr '\n' ' ')"
fi
# a later pip --target run of a wheel with scripts (onnx's) replaces /tmp/site/bin whole, and
# with it Snakemake's entry point: put one back
if [ -d /tmp/site/snakemake ] && [ ! -x /tmp/site/bin/snakemake ]; then
  mkdir -p /tmp/site/bin && printf '#!/bin/sh\nexec python3 -m snakemake "$@"\n' > /tmp/site/bin/snakemake &&
    chmod +x /tmp/site/bin/snakemake && echo "Snakemake's entry point written again (/tmp/site/bin/snakemake)"
fi
# kept in /tmp until flashinfer itself is installed (its parts may come in later calls)
[ -d .whl/flashinfer_aot ] && mkdir -p /tmp/flashinfer_aot && cp -r .whl/flashinfer_aot/. /tmp/flashinfer_aot/
if [ -d /tmp/flashinfer_aot ] && [ -d /tmp/site/flashinfer/data ]; then
  mkdir -p /tmp/site/flashinfer/data/aot && cp -r /tmp/flashinfer_aot/. /tmp/site/flashinfer/data/aot/
fi
export FLASHINFER_WORKSPACE_BASE=/tmp  # its JIT cache, kept while the machine stays up
# FlashAttention-4 and its CuTe DSL share top-level folders with FA2 (flash_attn) and with each other
# (nvidia_cutlass_dsl): one pip call installs them into their own folder, whose flash_attn/cute then
# replaces the older copy FA2's wheel ships. They come in .fa4*/ folders, over calls made one after
# the other, gathered in /tmp/fa4: wheels, and the DSL's 92 MB library wheel unpacked as a tar.xz in
# parts (NAME.tar.xz.partK-of-N, 61 MiB in all), unpacked over the installed wheels.
for d in .fa4*/; do [ -d "$d" ] && mkdir -p /tmp/fa4 && cp "$d"* /tmp/fa4/; done
first=$(ls /tmp/fa4/*.tar.xz.part1-of-* 2> /dev/null | head -1)
if [ ! -d /tmp/site_fa4/flash_attn/cute ] && [ -n "$first" ] && gather "$first"; then
  rm -rf /tmp/site_fa4
  TARGET=/tmp/site_fa4 install /tmp/fa4/*.whl && tar xJf "${first%.part1-of-*}" -C /tmp/site_fa4 &&
    echo "installed FlashAttention-4: $(cd /tmp/fa4 && ls -- *.whl "$(basename "${first%.part1-of-*}")" | tr '\n' ' ')"
fi
# every call: installing FA2's wheel again (a new .whl/) brings its old copy back
if [ -d /tmp/site_fa4/flash_attn/cute ] && [ -d /tmp/site/flash_attn ]; then
  rm -rf /tmp/site/flash_attn/cute && cp -r /tmp/site_fa4/flash_attn/cute /tmp/site/flash_attn/
fi
# the DSL's .pth (which puts dsl_packages on sys.path) is not read from PYTHONPATH
fa4path=""; [ -d /tmp/site_fa4 ] && fa4path=/tmp/site_fa4:/tmp/site_fa4/nvidia_cutlass_dsl/dsl_packages:
# `python` in the rules is the interpreter that has torch: a wrapper script (a symlink would lose its
# venv; rm first: writing through a link left by an earlier session would overwrite the interpreter)
mkdir -p /tmp/bin && rm -f /tmp/bin/python && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/bin/python && chmod +x /tmp/bin/python
export PATH=/tmp/bin:/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$fa4path$PWD/workflow
# the wheels a build here wrote, into $OUT/built_wheels.tar (a '+' in a wheel's name, as in a local
# version, does not come back as a file of its own); take_call_results.sh keeps them in .gpu_cache/
bring_back_wheels() { (cd "$1" && tar rf "$out/built_wheels.tar" -- *.whl); }
log() { echo "[$(date +%T)] $*" | tee -a "$out/session.txt"; }
# Each call receives this machine's tree anew: records an earlier call on this machine wrote and
# that were not brought back into the tree it carries are put back (never over the tree's own),
# so that a call made at once after another does not measure the same cells again (2026-12-07: two
# calls of h200_calibration each measured the first call's 16 cells again)
kept=/tmp/kept_records/$outdir
if [ -d "$kept/cells" ]; then
  tree=$PWD/$outdir
  n=$(cd "$kept" && find cells points -name '*.json' 2> /dev/null | while read -r f; do
    [ -e "$tree/$f" ] || { mkdir -p "$tree/$(dirname "$f")" && cp "$f" "$tree/$f" && echo; }
  done | wc -l)
  log "records of earlier calls on this machine put back: $n"
fi
# the kernels built in the background (step builds) by this call or an earlier one on this machine
for done in /tmp/built/*.done; do
  [ -f "$done" ] || continue
  name=$(basename "$done" .done)
  cp "/tmp/built/$name.log" "$outdir/build_$name.log" 2> /dev/null
  [ -f "/tmp/built/$name.installed" ] && continue
  if [ "$(cat "$done")" = 0 ] && install /tmp/built/"$name"/*.whl; then
    touch "/tmp/built/$name.installed" && bring_back_wheels "/tmp/built/$name"
    log "installed the $name wheel built here: $(cd "/tmp/built/$name" && ls -- *.whl) ($(grep -h '^Built in' "/tmp/built/$name.log"))"
  else
    log "the $name build failed (exit $(cat "$done")): $(tail -2 "/tmp/built/$name.log" | head -1)"
    touch "/tmp/built/$name.installed"
  fi
done
listed() { case " $2 " in *" $1 "*) return 0;; esac; return 1; }  # listed WORD "LIST"
has() { listed "$1" "$steps"; }
{
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total,clocks.max.sm,power.limit --format=csv
  timeout 120 python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
} 2>&1 | tee -a "$out/session.txt"
gpus=$(nvidia-smi -L | grep -c '^GPU ')
mkdir -p "$outdir/cp_verify"

# missing_cells GRID SECONDS "LENGTHS" "RECORDS OPTIONS" [snakemake arguments]: the grid's cells of
# these lengths (and `attnbench records` options) that have no current record yet (missing or
# outdated: attnbench.pipeline.currency), in one Snakemake run
missing_cells() {
  local name=$1 left=$2 lengths=$3 opts=$4 targets; shift 4
  targets=$(python -m attnbench records --grids "$name" --seqlen $lengths $opts --config "output_dir=$outdir")
  [ -n "$targets" ] || return 0
  log "$name S in {$lengths} $opts: $(echo "$targets" | wc -l) cells, ${left} s left"
  # the targets before --config, which would take them for more config entries
  timeout -s INT "$left" snakemake $targets --profile profiles/local --cores "$(nproc)" "$@" \
    --config "run=[$name]" "output_dir=$outdir" >> "$out/snakemake_$name.log" 2>&1
  log "$name S in {$lengths}: exit $? ($(grep -c ' done (' "$out/snakemake_$name.log") cells finished so far)"
}

# staged GRID BUDGET "LENGTHS|LENGTHS..." "RECORDS OPTIONS" [snakemake arguments]: missing_cells
# stage after stage of lengths while more than 30 s of the budget is left
staged() {
  local name=$1 budget=$2 stages_text=$3 opts=$4 t0 left lengths stages; shift 4
  t0=$(date +%s)
  IFS='|' read -ra stages <<< "$stages_text"
  for lengths in "${stages[@]}"; do
    left=$((budget - ($(date +%s) - t0)))
    [ "$left" -gt 30 ] || break
    missing_cells "$name" "$left" "$lengths" "$opts" "$@"
  done
}

grid() {  # grid NAME BUDGET [extra snakemake arguments]
  local name=$1 budget=$2; shift 2
  log "$name grid (${budget} s)"
  timeout -s INT "$budget" snakemake --profile profiles/local --cores "$(nproc)" "$@" \
    --config "run=[$name]" "output_dir=$outdir" > "$out/snakemake_$name.log" 2>&1
  log "$name exit $? ($(grep -c ' done (' "$out/snakemake_$name.log") cells finished)"
}

if has verify && [ "$gpus" -ge 2 ]; then
  verify() {  # verify NAME BUDGET [verify arguments]
    local name=$1 budget=$2; shift 2
    # every GPU of the machine (VERIFY_WORLD fewer); beyond 2 the files are named by world size
    local world=${VERIFY_WORLD:-$gpus}
    [ "$world" -eq 2 ] || name="${name}_w$world"
    log "cp verify $name (NCCL, $world ranks, ${budget} s)"
    timeout "$budget" python -m attnbench.run.launch --nproc-per-node "$world" --gpus-per-node "$world" -- \
      python -m attnbench.cp.verify --device cuda --head-dim 64 --tokens-per-rank 256 --timeout-s 30 \
      --out "$outdir/cp_verify/$name.jsonl" "$@" > "$outdir/cp_verify/$name.log" 2>&1
    log "cp verify $name exit $?: $(grep -E '^world' "$outdir/cp_verify/$name.log")"
  }
  listed sdpa "${VERIFY:-sdpa flash flex}" && verify sdpa "${T_VERIFY:-90}" --kernels sdpa_flash sdpa_cudnn
  listed flash "${VERIFY:-sdpa flash flex}" && verify flash "${T_VERIFY:-90}" --kernels fa2 fa3
  listed flex "${VERIFY:-sdpa flash flex}" && verify flex "${T_VERIFY_FLEX:-240}" --kernels flex
  # dK/dV travelling the ring in bf16 (cp.dkv_comm_dtype: input), fp32 sums kept on every rank
  listed dkv "${VERIFY:-sdpa flash flex}" && verify dkv_input "${T_VERIFY:-90}" --kernels sdpa_cudnn fa2 \
    --methods ring_p2p usp loongtrain --dkv-comm-dtype input
fi
if has bsa; then
  if PYTHONPATH=/tmp/site python3 -c "import block_sparse_attn" 2> /dev/null; then
    log "block_sparse_attn is installed already"
  else
    log "building block_sparse_attn (${T_BSA:-540} s)"
    timeout "${T_BSA:-540}" bash envs/build_block_sparse_attn.sh --source .src/block_sparse_attn-src.tar.gz \
      --python python3 --out-dir /tmp/bsa_dist > "$outdir/build_bsa.log" 2>&1
    log "build exit $?: $(tail -3 "$outdir/build_bsa.log" | head -1)"
    ls /tmp/bsa_dist/*.whl > /dev/null 2>&1 && install /tmp/bsa_dist/*.whl && bring_back_wheels /tmp/bsa_dist
  fi
fi
if has fa2build; then  # envs/build_flash_attn.sh on this machine, then FA2's GPU test on its wheel
  log "building flash-attn from its sdist (${T_FA2BUILD:-480} s)"
  rm -rf /tmp/fa2_dist /tmp/site_fa2build
  timeout "${T_FA2BUILD:-480}" bash envs/build_flash_attn.sh --sdist .src/flash_attn-2.8.3.post2.tar.gz \
    --python python3 --out-dir /tmp/fa2_dist > "$outdir/build_fa2.log" 2>&1
  log "build exit $?: $(tail -1 "$outdir/build_fa2.log")"
  if ls /tmp/fa2_dist/*.whl > /dev/null 2>&1; then
    bring_back_wheels /tmp/fa2_dist
    TARGET=/tmp/site_fa2build install /tmp/fa2_dist/*.whl
    { PYTHONPATH=/tmp/site_fa2build:$PYTHONPATH python -c "import flash_attn; print('flash_attn', flash_attn.__version__, 'from', flash_attn.__file__)"
      PYTHONPATH=/tmp/site_fa2build:$PYTHONPATH timeout 240 python -m pytest -q -p no:cacheprovider \
        tests/gpu/test_gpu_kernels.py -k "fa2 and not sparse"; } > "$outdir/pytest_gpu_fa2_built.txt" 2>&1
    log "FA2 GPU test on the built wheel: $(tail -1 "$outdir/pytest_gpu_fa2_built.txt")"
  fi
fi
if has builds && [ ! -f /tmp/built/started ]; then
  # the scripts and sources copied first: the next call replaces this tree while they run
  mkdir -p /tmp/built/envs /tmp/built/src && cp envs/*.sh envs/*.py /tmp/built/envs/ && cp .src/*-src.tar.gz /tmp/built/src/ &&
    touch /tmp/built/started
  log "building in the background: ${BUILDS:-flash_attn_3 flashmask}"
  setsid nice -n 19 bash -c 'for name in $0; do
      bash /tmp/built/envs/build_$name.sh --source /tmp/built/src/$name-src.tar.gz --python python3 \
        --out-dir /tmp/built/$name --jobs "$1" > /tmp/built/$name.log 2>&1
      echo $? > /tmp/built/$name.done
    done' "${BUILDS:-flash_attn_3 flashmask}" "${BUILD_JOBS:-12}" > /dev/null 2>&1 < /dev/null &
fi
if has gputests; then
  log "GPU tests (${T_GPUTESTS:-240} s)"
  # pytest's arguments as a shell would split them: GPUTESTS='tests/gpu -k "vsa or flashinfer"'
  eval "tests=(${GPUTESTS:-tests/gpu tests/cp/test_cp_kernels.py})"
  timeout "${T_GPUTESTS:-240}" python -m pytest -q -p no:cacheprovider "${tests[@]}" \
    > "$outdir/pytest_gpu.txt" 2>&1
  log "GPU tests exit $?: $(tail -1 "$outdir/pytest_gpu.txt")"
fi
if has sweep; then  # four cells per GPU at once: three start up (imports) while one measures
  t0=$(date +%s) since=$(date -u +%Y-%m-%dT%H:%M:%S+00:00) budget=${T_SWEEP:-480} stamp=$(date -u +%H%M)
  mkdir -p "$outdir/throughput"
  # the driver's own busy samples, beside the records' account (harness_throughput.py --nvml)
  nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 500 \
    > "$outdir/throughput/nvml_$stamp.csv" 2>/dev/null & nvml=$!
  # one Snakemake run (kernel cells run shortest first: their rule's priority); SWEEP_STAGES="a b"
  # SWEEP_OPTS: `attnbench records` options limiting every stage's cells (--kernels fa3, say)
  # runs the lengths in separate Snakemake runs instead
  all_lengths="1024 2048 4096 8192 16384 32768 65536"
  for lengths in ${SWEEP_FIRST:+"${SWEEP_FIRST_LENGTHS:-$all_lengths}"} ${SWEEP_STAGES:-"$all_lengths"}; do
    left=$((budget - ($(date +%s) - t0)))
    [ "$left" -gt 30 ] || break
    # SWEEP_FIRST: `attnbench records` options naming cells to run before all others (--kernels, --masks)
    missing_cells h200_sweep "$left" "$lengths" "${SWEEP_FIRST:-${SWEEP_OPTS:-}}" --resources gpu=$((4 * gpus)) --scheduler greedy
    SWEEP_FIRST=''
  done
  kill "$nvml" 2>/dev/null
  python benchmarks/harness_throughput.py "$outdir/cells/h200_sweep" --gpus "$gpus" --wall-s $(($(date +%s) - t0)) \
    --since "$since" --nvml "$outdir/throughput/nvml_$stamp.csv" --json "$outdir/throughput/h200_sweep_$stamp.json" \
    2>&1 | tee -a "$out/session.txt"
fi
if has paired; then  # the smallest estimated cells first, what fits the budget (tools/offline-gpu/README.md)
  budget=${T_PAIRED:-480} paired=${PAIRED_GRID:-h200_paired}
  if [ -f .paired_calls/order.tsv ]; then  # the plan made before the calls (paired_plan.sh)
    # the planned cells without a record, in the plan's order, while their estimates fit the
    # budget less a minute; PAIRED_SKIP="KERNEL..." leaves out kernels not installed yet
    targets=$(awk -v room="$((budget - 60))" -v skip=" ${PAIRED_SKIP:-} " '{
        k = $2; sub(/.*\/kernel\//, "", k); sub(/\/.*/, "", k)
        if (index(skip, " " k " ") || (getline line < $2) > 0) { close($2); next }
        if (sum + $1 > room) exit
        sum += $1; print $2 }' .paired_calls/order.tsv)
  else  # planned here from the records of the same points in the tree
    targets=$(python -m attnbench records --grids "$paired" --budget-s "$((budget - 60))" \
      --config "output_dir=$outdir")
  fi
  if [ -n "$targets" ]; then
    log "$paired: $(echo "$targets" | wc -l) cells, estimated to fit $((budget - 60)) s (${budget} s budget)"
    timeout -s INT "$budget" snakemake $targets --profile profiles/local --cores "$(nproc)" \
      --resources gpu=$((4 * gpus)) --scheduler greedy --config "run=[$paired]" "output_dir=$outdir" \
      >> "$out/snakemake_$paired.log" 2>&1
    log "$paired exit $?: $(ls "$outdir"/cells/"$paired"/kernel/*/*/*.json 2> /dev/null | wc -l) records"
  fi
fi
if has comm && [ "$gpus" -ge 2 ]; then  # the CP model's measured network (docs/cp-model.md)
  log "comm_bench on $gpus GPUs (${T_COMM:-120} s)"
  timeout "${T_COMM:-120}" snakemake "$outdir/comm/cuda_n$gpus.json" --profile profiles/local --cores "$(nproc)" \
    --config "output_dir=$outdir" > "$out/snakemake_comm.log" 2>&1
  log "comm_bench exit $?"
fi
if has cp && [ "$gpus" -ge 2 ]; then  # the cells one session most needs first; what is left runs next time
  staged h200_cp "${T_CP:-300}" "${CP_STAGES:-65536 131072|262144|16384 32768}" ""
fi
# every rank of 2-, 4- and 8-rank worlds emulated on one GPU, smallest worlds first
has cpemu && staged h200_cp_emulated "${T_CPEMU:-300}" "${CPEMU_STAGES:-131072|262144|524288}" ""
# the same grid's cells at 8K-32K tokens per rank (the CP model's per-call terms across rows)
has cpemurows && staged h200_cp_emulated "${T_CPEMUROWS:-300}" \
  "${CPEMUROWS_STAGES:-16384 32768|65536|131072}" ""
if has emuseries; then
  if [ ! -f /tmp/emuseries/started ]; then
    mkdir -p /tmp/emuseries/tree && cp -r benchmarks workflow config.yaml /tmp/emuseries/tree/
    # EMU_RESUME=1: the series goes on from what the tree's earlier calls brought back
    [ -n "${EMU_RESUME:-}" ] && mkdir -p /tmp/emuseries/out && cp "$outdir/cp_emulate/series/"*.{json,txt,log} /tmp/emuseries/out/ 2> /dev/null
    before=""; [ -n "${EMUSERIES_BEFORE:-}" ] && cp -r "$EMUSERIES_BEFORE" /tmp/emuseries/before && before=/tmp/emuseries/before
    setsid nohup bash /tmp/emuseries/tree/benchmarks/cp_emulate_series.sh /tmp/emuseries/out $before \
      > /tmp/emuseries/driver.log 2>&1 < /dev/null &
    touch /tmp/emuseries/started && log "emulated series started (before: ${before:-none})"
  fi
  t0=$(date +%s)
  while [ ! -f /tmp/emuseries/out/done ] && [ $(($(date +%s) - t0)) -lt "${T_EMUSERIES:-480}" ]; do sleep 5; done
  mkdir -p "$outdir/cp_emulate/series" && cp /tmp/emuseries/out/* "$outdir/cp_emulate/series/" 2> /dev/null
  log "emulated series: $(tail -1 /tmp/emuseries/out/series.log)$([ -f /tmp/emuseries/out/done ] && echo ', all done')"
fi
# 4 and 8 GPUs (grid h200_cp_x8), on 8 GPUs: two 4-GPU cells run side by side
has cpx8 && [ "$gpus" -ge 8 ] && grid h200_cp_x8 "${T_CPX8:-540}" --resources gpu="$gpus"
# kernel cells: three per GPU at once, each imports and starts while another holds the GPU
if has sparse; then  # in stages of lengths (SPARSE_STAGES, "|" between), each with its dense references
  # This machine's torch must draw the blocks the committed records were measured on (a grid
  # point's kernels share one layout, whichever session measured them): a few seconds of CPU
  if timeout 120 python -m pytest -q -p no:cacheprovider tests/test_sparse_masks.py \
      -k "top_k_blocks or h200_records" > "$outdir/pytest_layouts.txt" 2>&1; then
    log "layouts: this torch draws the records' blocks ($(tail -1 "$outdir/pytest_layouts.txt"))"
    # SPARSE_OPTS: `attnbench records` options (--kernels K...) limiting the cells run
    staged h200_sparse "${T_SPARSE:-150}" \
      "${SPARSE_STAGES:-7232 14592 16384 23168 29312 32768|46336 58624 65536|92672 117248 131072|43904 69504 87936 98304}" \
      "${SPARSE_OPTS:-}" --resources gpu=$((3 * gpus))
  else
    log "layouts: this torch does not draw the records' blocks; h200_sparse not run ($outdir/pytest_layouts.txt)"
  fi
fi
has kernels && grid h200 "${T_KERNELS:-240}" --resources gpu=$((3 * gpus))
# any grids by name (GRIDS="h100_calibration ..."), T_GRIDS s each; two GPU jobs per GPU: a point
# job imports while another measures (each claims its GPU after its imports)
if has grids; then
  for g in ${GRIDS:-}; do grid "$g" "${T_GRIDS:-480}" --resources gpu=$((2 * gpus)); done
fi
# the vendors' own benchmarks (benchmarks/vendor_calibration.py) from the carried
# .src/vendor_bench.tar.gz, into OUTPUT_DIR/vendor/ (T_VENDOR s)
# the same calls timed settled, after idle and cold (benchmarks/vendor_calibration.py idle-vs-settled):
# what explains a gap between our numbers and the vendors' by the clocks each ran at (T_IDLE s)
if has idle; then
  log "idle-vs-settled (${T_IDLE:-150} s)"
  mkdir -p "$outdir/vendor"
  timeout "${T_IDLE:-150}" python benchmarks/vendor_calibration.py idle-vs-settled \
    > "$outdir/vendor/idle_vs_settled.txt" 2>&1
  log "idle-vs-settled: exit $?"
fi
if has vendor && [ -f .src/vendor_bench.tar.gz ]; then
  mkdir -p /tmp/vendor && tar xzf .src/vendor_bench.tar.gz -C /tmp/vendor
  log "the vendors' benchmarks (${T_VENDOR:-300} s)"
  timeout "$((${T_VENDOR:-300} + 60))" python benchmarks/vendor_calibration.py run --vendor /tmp/vendor/vendor_bench \
    --out "$outdir/vendor" --budget-s "${T_VENDOR:-300}" ${VENDOR_OPTS:-} >> "$out/session.txt" 2>&1
  log "vendor benchmarks: exit $?"
fi

if has sparsebench; then
  log "sparse backward bench (${T_SPARSEBENCH:-240} s)"
  timeout "${T_SPARSEBENCH:-240}" python benchmarks/sparse_bwd_bench.py ${SPARSEBENCH:-} \
    --json "$outdir/sparse_bwd_bench.json" --write-tuned "$outdir/sparse_bwd_tuned.json" \
    > "$outdir/sparse_bwd_bench.txt" 2>&1
  log "sparse bench exit $?: $(tail -1 "$outdir/sparse_bwd_bench.txt")"
fi

# tables and figures are drawn afterwards from the records (make figures), not in device time
if has regen; then
  timeout 120 python -m attnbench regenerate --grids h200 h200_sparse h200_cp h200_sweep --config "output_dir=$outdir" 2>&1 | tail -5 | tee -a "$out/session.txt"
elif has dobench; then
  python -m attnbench collect --root "$outdir/cells" --out "$outdir/tables/cells.csv" | tail -1
fi
if has dobench && [ -f "$outdir/tables/cells.csv" ]; then
  log "do_bench"
  timeout "${T_DOBENCH:-120}" python benchmarks/do_bench_compare.py --cells "$outdir/tables/cells.csv" \
    --impls fa3 fa2 sdpa_cudnn sdpa_flash flex --seqlen 8192 --grid h200_sweep \
    --out "$outdir/tables/do_bench_compare_sweep.csv" 2>&1 | tee -a "$out/session.txt"
fi
log "pack"
# FlashInfer's kernels compiled in this call (a minute or more each), as MODULE/MODULE.so: carried in
# .whl/flashinfer_aot/ they are loaded instead of compiled again (take_call_results.sh keeps them)
fi_cache=$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer
built=$(cd "$fi_cache" 2> /dev/null && ls -- */*/cached_ops/*/*.so 2> /dev/null)
if [ -n "$built" ]; then
  mkdir -p /tmp/fi_pack && for so in $built; do
    m=$(basename "$(dirname "$so")"); [ -f "/tmp/flashinfer_aot/$m/$m.so" ] && continue
    mkdir -p "/tmp/fi_pack/$m" && cp "$fi_cache/$so" "/tmp/fi_pack/$m/"
  done
  if [ -n "$(ls /tmp/fi_pack)" ]; then  # in 15 MiB parts (a file over 16 MiB does not come back)
    tar czf /tmp/flashinfer_aot.tgz -C /tmp/fi_pack . && split -b 15M -d -a 1 /tmp/flashinfer_aot.tgz "$out/flashinfer_aot.tgz.part"
    log "FlashInfer modules built here: $(ls /tmp/fi_pack | tr '\n' ' ')($(du -h /tmp/flashinfer_aot.tgz | cut -f1))"
    # a later call on this machine has them already
    mkdir -p /tmp/flashinfer_aot && cp -r /tmp/fi_pack/. /tmp/flashinfer_aot/
  fi
  rm -rf /tmp/fi_pack /tmp/flashinfer_aot.tgz
fi
# built wheels over what one file brings back (16 MiB) come back in parts
if [ -f "$out/built_wheels.tar" ] && [ "$(stat -c %s "$out/built_wheels.tar")" -gt 15728640 ]; then
  split -b 15M -d -a 1 "$out/built_wheels.tar" "$out/built_wheels.tar.part" && rm "$out/built_wheels.tar"
fi
tar czf "$out/results.tgz" --exclude="$outdir/logs" "$outdir" 2>/dev/null
# for the next call on this machine (above)
mkdir -p "$kept" && for d in cells points; do [ -d "$outdir/$d" ] && cp -r "$outdir/$d" "$kept/"; done
tar czf "$out/logs.tgz" "$outdir/logs" 2>/dev/null
ls -la "$out"
