#!/bin/bash
# The TP decode chain's switches (tp-chain) on 4 GPUs, in one device call of <= BUDGET seconds
# (default 295): correctness first, then the timings, each job under its own `timeout`, full
# logs in $OUT/*.log, the lines that matter on stdout.
#   bash benchmarks/gpu/run_tp_chain.sh
#  1. (~60 s, side by side) the barrier-free all-reduce on GPUs 0-1 (test_custom_all_reduce.py:
#     sums vs NCCL, 300 chained calls in graphs), the kernels' bits on GPU 2 (test_pdl.py: PDL
#     and SGDSL_GEMV_PRE give the same bits; test_lamport_kernel.py: the spin variants),
#     the pair epilogues on GPU 3 (test_gemv_pairs.py)
#  2. (~70 s) test_tp_models.py: the chain's switches all on vs as first built, same tokens at
#     TP=4 (logits within bf16 rounding), and PDL's bits at TP=4
#  3. (~60 s) bench_tp_chain.py 8B TP=4: every variant on one loaded model (GPU time per token)
#  4. (~80 s) bench_tp_chain.py 70B TP=4: base, the new chain, and more blocks before the wait
#  5. (what is left) bench_tp.py 8B TP=1 and TP=4 through the Engine with every switch on
#     (new-pre4-early: SGDSL_GEMV_PRE=4, SGDSL_GEMV_PAIRS_PRE=4, SGDSL_PDL_TRIGGER=early)
# A job with less than its minimum left is skipped (said in the output).
set -o pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/device_env.sh
BUDGET=${BUDGET:-295}
OUT=${OUT:-/tmp/tp_chain_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null
echo "commit $COMMIT, budget ${BUDGET}s"

job() {  # NAME WANT_S MIN_S CMD...: CMD under `timeout` (<= WANT_S and what the budget has left)
  local name=$1 want=$2 min=$3; shift 3
  local left=$((BUDGET - SECONDS))
  if ((left < min)); then echo "SKIP $name: ${left}s left, it needs >= ${min}s"; return; fi
  local t=$((want < left ? want : left))
  echo "--- $name: start at ${SECONDS}s, limit ${t}s"
  timeout -k 10 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name: rc $rc at ${SECONDS}s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
}

show() {  # NAME PATTERN: the log's lines that matter
  [ -e "$OUT/$1.log" ] && grep -E "$2" "$OUT/$1.log" | tail -${3:-30}
}

PYTEST="python3 -m pytest -q -p no:cacheprovider"
K=tests/runtime/kernels
D=tests/runtime/distributed
(export CUDA_VISIBLE_DEVICES=0,1; job t_allreduce 90 40 $PYTEST -m gpu $D/test_custom_all_reduce.py) &
(export CUDA_VISIBLE_DEVICES=2; job t_kernels 90 40 $PYTEST $K/test_pdl.py $K/test_lamport_kernel.py) &
(export CUDA_VISIBLE_DEVICES=3; job t_pairs 90 40 $PYTEST $K/test_gemv_pairs.py) &
wait
job t_models 110 60 $PYTEST -m gpu -s $D/test_tp_models.py -k "chain or pdl_same"
job chain_8b 90 45 python3 benchmarks/gpu/bench_tp_chain.py --tp 4 --model llama-3.1-8b \
  --variants base,ar,ar+epi,early,new,new-pre4,new-early,new-pre4-early --rounds 2 --steps 200
job chain_70b 110 70 python3 benchmarks/gpu/bench_tp_chain.py --tp 4 --model llama-3.1-70b \
  --variants base,ar+epi,new-pre4,new-pre8x8,new-pre4-early --rounds 2 --steps 40
job engine 100 60 python3 benchmarks/gpu/bench_tp.py --runs 8b-tp1,8b-tp4 --pdl on --chain new-pre4-early

for t in t_allreduce t_kernels t_pairs t_models; do
  echo "=== $t"; show $t "passed|failed|error|Error|skipped|max \|new" 8
done
for b in chain_8b chain_70b engine; do
  echo "=== $b"; show $b "^\||^## |copy|Error|error" 30
done
echo "done at ${SECONDS}s"
