#!/bin/bash
# Device call 5 (cascade decode attention for shared prefixes): GPU tests, kernel microbench
# (D-shaped decode plain vs cascade), D (cache on/off), C and A (checks for regressions).
# Run from a clean export of the commit: `git archive HEAD | tar -x -C .k2tree`.
set -o pipefail
source benchmarks/gpu/device_env.sh
T=tests/runtime
timeout 120 python3 -m pytest $T/kernels $T/scheduler/test_overlap_gpu.py $T/layers/test_sampler_gpu.py \
  -q -x -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -4
cd benchmarks/gpu
timeout 60 python3 bench_kernels.py 2>&1 | tee $OUT/kernels.log | tail -12
timeout 200 python3 bench_d_prefix.py 2>&1 | tee $OUT/bench_d.log | tail -8
timeout 90 python3 bench_c_nanovllm.py 2>&1 | tee $OUT/bench_c.log | tail -5
timeout 90 python3 bench_a_decode.py --modes triton+graphs,engine 2>&1 | tee $OUT/bench_a.log | tail -6
