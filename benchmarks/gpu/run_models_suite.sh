#!/bin/bash
# Issue 12 suite (MoE, FP8 weights, FP8 KV cache, dense batch-1 decode), one device call per
# PART: 1 = GPU kernel tests, decode GEMM/MoE microbench, decode-step profile, batch-1 decode of
# every model (runner level); 2 = through the Engine: batch-1 decode and offline throughput
# (bf16 vs fp8 weights, Qwen3-30B-A3B vs HF generate_batch, fp8 KV on workloads D and B).
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
T=tests/runtime
cd benchmarks/gpu
A="timeout 110 python3 bench_a_decode.py --modes triton+graphs"
if [ "${PART:-1}" = 1 ]; then
  (cd ../.. && timeout 150 python3 -m pytest $T/kernels/test_fused_moe.py $T/kernels/test_fp8_matmul.py \
    $T/kernels/test_triton_backend.py $T/kernels/test_decode_attention.py $T/kernels/test_extend_attention.py \
    $T/kernels/test_prefix_decode_attention.py -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -8)
  timeout 100 python3 bench_linear_kernels.py 2>&1 | tee $OUT/linear.log | tail -22
  timeout 80 python3 profile_decode.py 2>&1 | tee $OUT/profile_bf16.log | tail -29
  timeout 100 python3 profile_decode.py --model qwen3-30b-a3b --top 24 2>&1 | tee $OUT/profile_qwen3moe.log | tail -39
  $A --quantization fp8 2>&1 | tee $OUT/a_llama_fp8.log | tail -4
  $A --model mixtral-8x7b --quantization fp8 2>&1 | tee $OUT/a_mixtral_fp8.log | tail -4
fi
