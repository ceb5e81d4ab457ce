#!/bin/bash
# Device call 7: after the max_running fix under overlap: GPU tests, D (engine), D breakdown
# (in-process), C, A through the Engine, B (regression check). From a clean export of HEAD.
set -o pipefail
source benchmarks/gpu/device_env.sh
T=tests/runtime
timeout 100 python3 -m pytest $T/kernels/test_prefix_decode_attention.py $T/kernels/test_gpu_model.py \
  $T/scheduler/test_overlap_gpu.py -q -x -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -3
cd benchmarks/gpu
timeout 150 python3 bench_d_prefix.py 2>&1 | tee $OUT/bench_d.log | tail -7
timeout 100 python3 profile_d.py 2>&1 | tee $OUT/profile_d.log | tail -9
timeout 70 python3 bench_c_nanovllm.py 2>&1 | tee $OUT/bench_c.log | tail -4
timeout 70 python3 bench_a_decode.py --modes engine 2>&1 | tee $OUT/bench_a.log | tail -4
timeout 100 python3 bench_b_offline.py 2>&1 | tee $OUT/bench_b.log | tail -4
