#!/bin/bash
# The TP decode chain's switches (tp-chain) on 4 GPUs, one device call of <= BUDGET seconds
# (default 295) per mode; each job under its own `timeout`, full logs in $OUT/*.log, the lines
# that matter on stdout. A job with less than its minimum left is skipped (said so).
#   bash benchmarks/gpu/run_tp_chain.sh sweep
#     1. (~60 s, side by side) the barrier-free all-reduce on GPUs 0-1 (test_custom_all_reduce:
#        sums vs NCCL, 300 chained calls in graphs); the kernels' bits on GPU 2 (test_pdl: PDL,
#        the weight blocks before the wait, the early trigger, attention's prefetch; the
#        all-reduce kernel's spin variants); the pair epilogues on GPU 3 (test_gemv_pairs)
#     2. (~60 s) test_tp_models -k chain: every switch on vs as first built at TP=4: same tokens
#     3. (~100 s) bench_tp_chain.py 8B TP=4: the variants on one loaded model (GPU us per token)
#     4. (what is left, >= 60 s) the same at 70B TP=4, fewer variants
#   bash benchmarks/gpu/run_tp_chain.sh engine [VARIANT]   (default VARIANT: all)
#   bash benchmarks/gpu/run_tp_chain.sh final
#     the variants not yet measured on a GPU (the early trigger, attention's prefetch, both)
#     against main's defaults at 8B TP=4, each checked for the same logits bits; then
#     bench_tp.py 8B TP=1 + TP=4 and 70B TP=4 through the Engine with the fastest of them
#   SMOKE=1 bash benchmarks/gpu/run_tp_chain.sh sweep|final   (a CPU check of the plumbing)
#     bench_tp.py through the Engine (the issue's rows): 8B TP=1, 8B TP=4 and 70B TP=4 with
#     the variant's switches (bench_tp_chain.VARIANTS), then 8B TP=4 as main had it (base)
set -o pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/device_env.sh
BUDGET=${BUDGET:-295}
OUT=${OUT:-/tmp/tp_chain_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null
echo "commit $COMMIT, mode ${1:-sweep}, budget ${BUDGET}s"

source benchmarks/gpu/budget_jobs.sh  # job NAME WANT_S MIN_S CMD...

show() {  # NAME PATTERN [LINES]: the log's lines that matter
  [ -e "$OUT/$1.log" ] && grep -E "$2" "$OUT/$1.log" | tail -"${3:-30}"
}

PYTEST="python3 -m pytest -q -p no:cacheprovider"
K=tests/runtime/kernels
D=tests/runtime/distributed
CHAIN="python3 benchmarks/gpu/bench_tp_chain.py --tp 4 --rounds 2"
STEPS_8B=200 STEPS_70B=30
# SMOKE=1: the script's plumbing on a CPU (tests collected only, the sweeps on a tiny model)
if [ -n "$SMOKE" ]; then
  PYTEST+=" --collect-only"
  CHAIN="python3 benchmarks/gpu/bench_tp_chain.py --tiny --tp 2 --rounds 1"
  STEPS_8B=2 STEPS_70B=1
  export OMP_NUM_THREADS=1
fi

sweep() {
  (export CUDA_VISIBLE_DEVICES=0,1; job t_allreduce 90 40 $PYTEST -m gpu $D/test_custom_all_reduce.py) &
  (export CUDA_VISIBLE_DEVICES=2; job t_kernels 90 40 $PYTEST $K/test_pdl.py $K/test_lamport_kernel.py) &
  (export CUDA_VISIBLE_DEVICES=3; job t_pairs 90 40 $PYTEST $K/test_gemv_pairs.py) &
  wait
  job t_models 75 45 $PYTEST -m gpu -s $D/test_tp_models.py -k chain
  # each new variant compiles its kernels once (first round); the rounds print as they end
  job chain_8b 120 60 $CHAIN --model llama-3.1-8b --steps $STEPS_8B \
    --variants base,ar+epi,early,attn,new-pre4,all
  job chain_70b 110 50 $CHAIN --model llama-3.1-70b --steps $STEPS_70B --rounds 1 \
    --variants base,ar+epi,all,all-pre8x8
  for t in t_allreduce t_kernels t_pairs t_models; do
    echo "=== $t"; show $t "passed|failed|rror|skipped|max \|new" 8
  done
  for b in chain_8b chain_70b; do
    echo "=== $b"; show $b "^\||^## |^round|copy|rror" 40
  done
}

final() {  # the variants not yet measured, against main's defaults (new), then the Engine rows
  # with the fastest of them that kept the bits (bench_tp_chain --json)
  job chain_8b 130 60 $CHAIN --model llama-3.1-8b --steps $STEPS_8B \
    --variants new,new-early,new-attn,all,new-pre4-early --json "$OUT/chain_8b.json"
  local best
  best=$(python3 -c "import json; print(json.load(open('$OUT/chain_8b.json'))['best'])" \
         2> /dev/null || echo new)
  echo "=== chain_8b (fastest with the same bits: $best)"; show chain_8b "^\||^## |^round|copy|rror" 40
  [ -n "$SMOKE" ] && return
  job engine_8b 150 80 python3 benchmarks/gpu/bench_tp.py --runs 8b-tp1,8b-tp4 --pdl on \
    --chain "$best"
  job engine_70b 150 70 python3 benchmarks/gpu/bench_tp.py --runs 70b-tp4 --pdl on --chain "$best"
  for b in engine_8b engine_70b; do
    echo "=== $b"; show $b "^\||^## |copy|rror" 20
  done
}

engine() {
  local v=${1:-all}
  job engine_new 200 120 python3 benchmarks/gpu/bench_tp.py --runs 8b-tp1,8b-tp4,70b-tp4 \
    --pdl on --chain "$v"
  job engine_base 80 50 python3 benchmarks/gpu/bench_tp.py --runs 8b-tp4 --pdl on --chain base
  for b in engine_new engine_base; do
    echo "=== $b"; show $b "^\||^## |copy|rror" 20
  done
}

case "${1:-sweep}" in
  sweep) sweep ;;
  final) final ;;
  engine) engine "$2" ;;
  *) echo "usage: $0 sweep|final|engine [VARIANT]"; exit 2 ;;
esac
echo "done at ${SECONDS}s"
