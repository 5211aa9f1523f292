#!/usr/bin/env bash
# One lease of a GPU machine, in one command: the CUDA tests, whether CUDA training
# repeats for a seed, and the GPU benchmark. Each part has its own time limit, so that a
# slow part still leaves the others' results. Logs and JSON go to $OUT.
#
#   OUT=/tmp/device bash benchmarks/device_check.sh
#
# Runs under the machine's own python3 and PyTorch (no install): the CUDA tests need only
# torch, numpy, pandas, pyarrow, tqdm and scikit-learn (tests/test_cuda.py).
# On an H200 (docs/notes/2026-12-04.md) each training of the tests took ~30 s: the tests need ~4
# minutes, the whole script ~8. Start the call with timeout_s 600.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/device_check}
mkdir -p "$OUT"
{
    nvidia-smi -L
    python3 -V
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    nproc
} > "$OUT/env.txt" 2>&1
timeout "${TEST_LIMIT:-330}" python3 -m pytest --noconftest -p no:cacheprovider \
    tests/test_cuda.py -rA -s --durations=20 > "$OUT/test_cuda.log" 2>&1
echo "pytest exit status $?" >> "$OUT/test_cuda.log"
timeout "${REPEAT_LIMIT:-70}" python3 benchmarks/cuda_repeat.py --json "$OUT/cuda_repeat.json" \
    > "$OUT/cuda_repeat.log" 2>&1
timeout "${BENCH_LIMIT:-130}" python3 benchmarks/gpu_bench.py --repeats 10 --epochs 3 \
    --tokens 256 1024 4096 16384 --json "$OUT/gpu_bench.json" > "$OUT/gpu_bench.log" 2>&1
cat "$OUT/env.txt"
tail -n 40 "$OUT/test_cuda.log" "$OUT/cuda_repeat.log" "$OUT/gpu_bench.log"
