#!/bin/bash
# Dense serving suite (one device call): GPU kernel/scheduler/sampler/runner tests, attention
# kernel microbench, C (nano-vllm, overlap on/off), D (shared prefix, radix cache on/off),
# A (batch-1 decode: runner and Engine, overlap on/off), in-process scheduler profile.
# Replaces the per-call scripts run_second.sh ... run_seventh.sh (their union; see git history).
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T=tests/runtime
timeout 120 python3 -m pytest $T/kernels $T/scheduler/test_overlap_gpu.py $T/layers/test_sampler_gpu.py \
  $T/model/test_runner_cuda.py -q -x -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -3
cd benchmarks/gpu
timeout 60 python3 bench_kernels.py 2>&1 | tee $OUT/kernels.log | tail -12
timeout 110 python3 bench_c_nanovllm.py --overlap both 2>&1 | tee $OUT/bench_c.log | tail -5
timeout 150 python3 bench_d_prefix.py 2>&1 | tee $OUT/bench_d.log | tail -7
timeout 100 python3 bench_a_decode.py --modes triton+graphs,engine,engine-sync 2>&1 | tee $OUT/bench_a.log | tail -7
timeout 50 python3 profile_scheduler.py --runner model --model qwen2.5-0.5b --n 256 --inp 512 --out 256 2>&1 | tee $OUT/profile.log | tail -2
