#!/usr/bin/env bash
# One GPU session on a machine without network (the H200 runs of results/h200 were made with it):
# install the carried wheels, check the machine, run the GPU tests, run a grid through Snakemake
# with the local profile, compare timings with do_bench, and pack what was written into $OUT.
#   benchmarks/gpu_session.sh GRID OUTPUT_DIR SECONDS_FOR_THE_GRID [GPU_SLOTS]
set -u
grid=${1:-h200}; outdir=${2:-results/h200}; budget=${3:-300}; slots=${4:-4}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# `python` in the rules: the interpreter that has torch (a wrapper, since a symlink would lose its venv)
# (rm first: writing through a link left by an earlier session would overwrite the interpreter itself)
mkdir -p /tmp/bin && rm -f /tmp/bin/python && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > /tmp/bin/python && chmod +x /tmp/bin/python
export PATH=/tmp/bin:/tmp/site/bin:$PATH PYTHONPATH=/tmp/site:$PWD/workflow
{
  nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv
  timeout 120 python -c "import torch, triton, inspect; from torch.nn.attention.varlen import varlen_attn as f; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'triton', triton.__version__); print('varlen_attn', inspect.signature(f))"
  timeout 120 /usr/bin/time -f "torch import + CUDA init: %e s" python -c "import torch; torch.zeros(1, device='cuda')"
} 2>&1 | tee "$out/machine.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 python -m pytest tests/gpu -q -p no:cacheprovider -rs 2>&1 | tail -40 | tee "$out/gpu_tests.txt"
fi
start=$(date +%s)
timeout -s INT "$budget" snakemake --profile profiles/local --cores "$(nproc)" --resources gpu="$slots" \
  --config "run=[$grid]" "output_dir=$outdir" > "$out/snakemake.log" 2>&1
echo "snakemake exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/machine.txt"
python -m attnbench regenerate --grids "$grid" --overrides "{\"output_dir\": \"$outdir\"}" 2>&1 | tail -3 | tee -a "$out/machine.txt"
if [ -f "$outdir/tables/cells.csv" ]; then
  timeout 120 python benchmarks/do_bench_compare.py --cells "$outdir/tables/cells.csv" --out "$outdir/tables/do_bench_compare.csv" 2>&1 | tee "$out/do_bench.txt"
fi
tar czf "$out/results.tgz" "$outdir" --exclude="$outdir/logs" 2>/dev/null
tar czf "$out/logs.tgz" "$outdir/logs" 2>/dev/null
ls -la "$out"
