#!/bin/bash
# Device call 2: GPU tests, kernel microbench, A (runner level), C and D (engine level).
set -o pipefail
source benchmarks/gpu/device_env.sh
timeout 200 python3 -m pytest tests/runtime/kernels -q -x 2>&1 | tee $OUT/pytest.log | tail -4
cd benchmarks/gpu
timeout 60 python3 bench_kernels.py 2>&1 | tee $OUT/kernels.log | tail -11
timeout 100 python3 bench_a_decode.py --modes triton+graphs,triton 2>&1 | tee $OUT/bench_a.log | tail -6
timeout 150 python3 bench_c_nanovllm.py 2>&1 | tee $OUT/bench_c.log | tail -6
timeout 220 python3 bench_d_prefix.py 2>&1 | tee $OUT/bench_d.log | tail -9
