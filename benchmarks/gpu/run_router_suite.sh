#!/bin/bash
# Issue 30's router workloads, one per device call (each under ~8 minutes): cost_aware vs
# round_robin vs cache_aware over the same replicas of a dummy Llama-3.1-8B, 2 rounds each,
# ratios printed against round_robin. Usage (device tool, carry [".whl"]):
#   bash benchmarks/gpu/run_router_suite.sh fits     # nvidia-h100-x2: dp=2, KV holds everything
#   bash benchmarks/gpu/run_router_suite.sh kv       # nvidia-h100-x2: dp=2, --max-total-tokens 60000
#   bash benchmarks/gpu/run_router_suite.sh dp4      # nvidia-h100-x4: dp=4
#   bash benchmarks/gpu/run_router_suite.sh dp2tp2   # nvidia-h100-x4: dp=2 x tp=2, the fits shape
# Extra arguments go to bench_router.py (e.g. --policies 'cost_aware:decode_token_weight=4,round_robin').
set -o pipefail
source benchmarks/gpu/device_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
echo "commit $COMMIT"
# ROUTER_MODEL="--tiny" (+ small shapes as extra arguments, which win): a CPU dry run of a workload
MODEL=${ROUTER_MODEL:-"--model benchmarks/gpu/configs/llama-3.1-8b --load-format dummy"}
# 4 client processes: one asyncio+httpx client spent 17-19 CPU s per 24-30 s dp=4 round (H200),
# near a core, which capped every policy alike.
RUN="python3 benchmarks/bench_router.py $MODEL --rounds 2 --question-len 128 --system-prompt-len 2048 --client-procs 4"
# ROUTER_TIMEOUT=0: no time limit of its own (a caller's `timeout` then kills the whole process
# group; a nested `timeout` would start a group of its own that the caller's could not reach).
[ "${ROUTER_TIMEOUT:-560}" != 0 ] && RUN="timeout ${ROUTER_TIMEOUT:-560} $RUN"
case "$1" in
  fits)   $RUN --dp 2 --groups 64 --prompts-per-group 16 --output-len 256 --concurrency 256 "${@:2}" ;;
  kv)     $RUN --dp 2 --groups 48 --prompts-per-group 16 --output-len 128 --concurrency 128 \
            --server-args "--max-total-tokens 60000" "${@:2}" ;;
  dp4)    $RUN --dp 4 --groups 128 --prompts-per-group 8 --output-len 128 --concurrency 256 "${@:2}" ;;
  dp2tp2) $RUN --dp 2 --tp 2 --groups 64 --prompts-per-group 16 --output-len 256 --concurrency 256 "${@:2}" ;;
  *) echo "usage: $0 fits|kv|dp4|dp2tp2 [bench_router.py options]"; exit 2 ;;
esac 2>&1 | tee $OUT/router_$1.log | grep -v '^\[dp' | tail -30
