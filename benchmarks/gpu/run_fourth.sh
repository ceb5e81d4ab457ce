#!/bin/bash
# Device call 4 (scheduler hot path + overlap): GPU correctness through the scheduler, the
# in-process scheduler profile, C (overlap on/off), D (cache on/off), A (runner and Engine).
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T=tests/runtime
timeout 120 python3 -m pytest $T/kernels $T/scheduler/test_overlap_gpu.py $T/layers/test_sampler_gpu.py \
  -q -x -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -4
cd benchmarks/gpu
timeout 110 python3 bench_c_nanovllm.py --overlap both 2>&1 | tee $OUT/bench_c.log | tail -6
timeout 180 python3 bench_d_prefix.py 2>&1 | tee $OUT/bench_d.log | tail -8
timeout 90 python3 bench_a_decode.py --modes triton+graphs,engine,engine-sync 2>&1 | tee $OUT/bench_a.log | tail -7
timeout 50 python3 profile_scheduler.py --runner model --model qwen2.5-0.5b --n 256 --inp 512 --out 256 2>&1 | tee $OUT/profile.log | tail -3
