#!/usr/bin/env bash
# One GPU session on a machine without network (how results/h200 was made): install the carried
# wheels, check the machine, run the context-parallel correctness matrix with NCCL, run the GPU
# grids through Snakemake with the local profile, compare timings with do_bench, pack into $OUT.
# Every step is bounded; what a step does not finish is simply missing (run it again to resume:
# Snakemake runs only the cells without a record).
#   benchmarks/gpu_session.sh [OUTPUT_DIR]        (budgets in seconds: T_VERIFY T_CP T_GRIDS)
set -u
outdir=${1:-results/h200}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# `python` in the rules is the interpreter that has torch: a wrapper script (a symlink would lose its
# venv; rm first: writing through a link left by an earlier session would overwrite the interpreter)
mkdir -p /tmp/bin && rm -f /tmp/bin/python && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/bin/python && chmod +x /tmp/bin/python
export PATH=/tmp/bin:/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD/workflow
log() { echo "[$(date +%T)] $*" | tee -a "$out/session.txt"; }
{
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv
  timeout 120 python -c "import torch, triton, inspect; from torch.nn.attention.varlen import varlen_attn as f; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(), 'triton', triton.__version__, 'gpus', torch.cuda.device_count()); print('varlen_attn', inspect.signature(f))"
} 2>&1 | tee -a "$out/session.txt"
gpus=$(nvidia-smi -L | grep -c '^GPU ')
if [ "$gpus" -ge 2 ]; then
  log "cp verify (NCCL, 2 ranks)"
  timeout "${T_VERIFY:-60}" python -m attnbench.launch --nproc-per-node 2 --gpus-per-node 2 -- \
    python -m attnbench.cp.verify --device cuda --kernels sdpa_flash sdpa_cudnn --head-dim 64 --tokens-per-rank 256 --out "$out/cp_verify.jsonl" > "$out/cp_verify.log" 2>&1
  log "cp verify exit $?"
  log "h200_cp grid"
  timeout -s INT "${T_CP:-110}" snakemake --profile profiles/local --cores "$(nproc)" \
    --config "run=[h200_cp]" "output_dir=$outdir" > "$out/snakemake_cp.log" 2>&1
  log "h200_cp exit $?"
fi
log "h200 + h200_sparse grids"
# three cells per GPU at once: each imports and starts while another holds the GPU (claim after import)
timeout -s INT "${T_GRIDS:-220}" snakemake --profile profiles/local --cores "$(nproc)" --resources gpu=$((3 * gpus)) \
  --config "run=[h200,h200_sparse]" "output_dir=$outdir" > "$out/snakemake_kernels.log" 2>&1
log "grids exit $?"
timeout 60 python -m attnbench regenerate --grids h200 h200_sparse h200_cp --overrides "{\"output_dir\": \"$outdir\"}" 2>&1 | tail -5 | tee -a "$out/session.txt"
if [ -f "$outdir/tables/cells.csv" ]; then
  log "do_bench"
  timeout 45 python benchmarks/do_bench_compare.py --cells "$outdir/tables/cells.csv" \
    --out "$outdir/tables/do_bench_compare.csv" 2>&1 | tee -a "$out/session.txt"
fi
log "pack"
tar czf "$out/results.tgz" --exclude="$outdir/logs" "$outdir" 2>/dev/null
tar czf "$out/logs.tgz" "$outdir/logs" 2>/dev/null
ls -la "$out"
