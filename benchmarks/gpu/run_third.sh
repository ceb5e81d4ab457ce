#!/bin/bash
# Device call 3: kernel microbench (split heuristic), B and E (ours vs HF generate_batch).
set -o pipefail
source benchmarks/gpu/device_env.sh
cd benchmarks/gpu
timeout 60 python3 bench_kernels.py 2>&1 | tee $OUT/kernels.log | tail -11
timeout 200 python3 bench_b_offline.py 2>&1 | tee $OUT/bench_b.log | tail -6
timeout 330 python3 bench_e_vs_hf.py 2>&1 | tee $OUT/bench_e.log | tail -9
