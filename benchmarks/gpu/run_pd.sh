#!/bin/bash
# Issue 27's GPU benchmark (nvidia-h100-x2): prefill/decode disaggregation (prefill server on
# GPU 0, decode server on GPU 1, `sgdsl router --pd-disaggregation`) vs two colocated replicas
# behind `sgdsl router`, a dummy Llama-3.1-8B, a mixed workload at a fixed request rate:
# long prompts (8192 in, 64 out) and chat turns (512 in, 256 out), 15% long. Prints TTFT/ITL
# p50/p99 per class, total throughput and the pd/colocated ratios. Usage (device tool, carry
# [".whl"]):
#   bash benchmarks/gpu/run_pd.sh            # rate 4 req/s, 60 s of arrivals
#   bash benchmarks/gpu/run_pd.sh --rate 8   # extra arguments go to bench_pd.py
#   bash benchmarks/gpu/run_pd.sh --modes pd,pd-gloo,colocated   # + PD over the gloo transfer
# Every server's scheduler steps are traced ($OUT/trace, summarized in the output: the decode
# server's launch-to-launch gaps and its slowest iterations).
# If NCCL between the two server processes misbehaves, the host-staged gloo path:
#   bash benchmarks/gpu/run_pd.sh --server-args "--disaggregation-transfer-backend gloo"
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "commit $COMMIT"
# PD_TAG names this run's log and traces (two runs in one call: PD_TAG=r8 ...)
TAG=${PD_TAG:+-$PD_TAG}
timeout ${PD_TIMEOUT:-570} python3 benchmarks/gpu/bench_pd.py \
  --model benchmarks/gpu/configs/llama-3.1-8b --load-format dummy --rate 4 --duration 60 \
  --trace $OUT/trace$TAG "$@" 2>&1 | tee $OUT/pd$TAG.log | grep -v '^\[dp' | tail -100
