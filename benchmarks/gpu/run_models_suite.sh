#!/bin/bash
# Issue 12 suite (MoE, FP8 weights, FP8 KV cache, dense batch-1 decode), one device call per
# PART (each fits the 10-minute call):
#   1 = GPU kernel tests, decode GEMM / MoE microbench, decode-step profiles, runner-level A
#   2 = GPU model tests, decode-step profile, batch-1 decode through the Engine (A) for
#       Llama-3.1-8B bf16 / fp8, Qwen3-30B-A3B bf16, Mixtral-8x7B fp8
#   3 = new-kernel GPU tests; offline: B bf16 vs fp8 weights, B and D with fp8 KV vs bf16 KV,
#       Mixtral-8x7B fp8 offline
#   4 = Qwen3-30B-A3B offline vs HF generate_batch (E; HF on HF_NUM prompts)
#   5 = B bf16 vs fp8 weights and D bf16 vs fp8 KV in one call, A fp8, Mixtral fp8 offline
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
T=tests/runtime
cd benchmarks/gpu
A="timeout 110 python3 bench_a_decode.py --modes triton+graphs"
E="timeout 80 python3 bench_a_decode.py --modes engine"
case "${PART:-1}" in
1)
  (cd ../.. && timeout 150 python3 -m pytest $T/kernels/test_fused_moe.py $T/kernels/test_fp8_matmul.py \
    $T/kernels/test_triton_backend.py $T/kernels/test_decode_attention.py $T/kernels/test_extend_attention.py \
    $T/kernels/test_prefix_decode_attention.py -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -8)
  timeout 100 python3 bench_linear_kernels.py 2>&1 | tee $OUT/linear.log | tail -22
  timeout 80 python3 profile_decode.py 2>&1 | tee $OUT/profile_bf16.log | tail -29
  timeout 100 python3 profile_decode.py --model qwen3-30b-a3b --top 24 2>&1 | tee $OUT/profile_qwen3moe.log | tail -39
  $A --quantization fp8 2>&1 | tee $OUT/a_llama_fp8.log | tail -4
  $A --model mixtral-8x7b --quantization fp8 2>&1 | tee $OUT/a_mixtral_fp8.log | tail -4
  ;;
2)
  (cd ../.. && timeout 120 python3 -m pytest $T/kernels -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -4)
  timeout 80 python3 profile_decode.py 2>&1 | tee $OUT/profile_bf16.log | tail -29
  $E 2>&1 | tee $OUT/a_llama_bf16.log | tail -4
  $E --quantization fp8 2>&1 | tee $OUT/a_llama_fp8.log | tail -4
  $E --model qwen3-30b-a3b 2>&1 | tee $OUT/a_qwen3moe.log | tail -4
  $E --model mixtral-8x7b --quantization fp8 2>&1 | tee $OUT/a_mixtral_fp8.log | tail -4
  ;;
3)
  (cd ../.. && timeout 150 python3 -m pytest $T/kernels/test_fp8_matmul.py $T/kernels/test_fused_moe.py \
    $T/kernels/test_elementwise.py $T/kernels/test_triton_backend.py -q -p no:cacheprovider 2>&1 \
    | tee $OUT/pytest.log | tail -4)
  B="timeout 130 python3 bench_b_offline.py"
  $B 2>&1 | tee $OUT/b_bf16.log | tail -4
  $B --quantization fp8 2>&1 | tee $OUT/b_fp8.log | tail -4
  $B --kv-cache-dtype fp8_e4m3 2>&1 | tee $OUT/b_kv_fp8.log | tail -4
  timeout 80 python3 bench_d_prefix.py --cache-on-only 2>&1 | tee $OUT/d_kv_bf16.log | tail -4
  timeout 80 python3 bench_d_prefix.py --cache-on-only --kv-cache-dtype fp8_e4m3 2>&1 | tee $OUT/d_kv_fp8.log | tail -4
  timeout 100 python3 bench_b_offline.py --model mixtral-8x7b --quantization fp8 --num 256 \
    --max-running 256 2>&1 | tee $OUT/b_mixtral_fp8.log | tail -4
  ;;
4)  # E: Qwen3-30B-A3B offline, ours (256 prompts) vs HF generate_batch (HF_NUM prompts)
  timeout 560 python3 bench_e_vs_hf.py --model qwen3-30b-a3b --hf-num ${HF_NUM:-32} \
    --mem-fraction ${MEM_FRACTION:-0.8} 2>&1 \
    | tee $OUT/e_qwen3moe.log | tail -9
  ;;
5)  # final: offline bf16 vs fp8 weights and D bf16 vs fp8 KV in one call, A fp8, Mixtral offline
  timeout 150 python3 bench_b_offline.py 2>&1 | tee $OUT/b_bf16.log | tail -4
  timeout 130 python3 bench_b_offline.py --quantization fp8 2>&1 | tee $OUT/b_fp8.log | tail -4
  timeout 60 python3 bench_d_prefix.py --cache-on-only 2>&1 | tee $OUT/d_kv_bf16.log | tail -4
  timeout 60 python3 bench_d_prefix.py --cache-on-only --kv-cache-dtype fp8_e4m3 2>&1 | tee $OUT/d_kv_fp8.log | tail -4
  $E --quantization fp8 2>&1 | tee $OUT/a_llama_fp8.log | tail -4
  timeout 100 python3 bench_b_offline.py --model mixtral-8x7b --quantization fp8 --num 256 \
    --max-running 256 2>&1 | tee $OUT/b_mixtral_fp8.log | tail -4
  ;;
esac
