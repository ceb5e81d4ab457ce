#!/bin/bash
# Issue 30's 4-GPU rows that never ran on a GPU, in two device calls of < 600 s each on the same
# 4-GPU machine (nvidia-h100-x4, carry [".whl"]); full logs in $OUT/*.log, a summary on stdout.
#   bash benchmarks/gpu/run_issue30_x4.sh router   # ~480 s (estimate; at most ~575 s):
#     phase 1 (~215 s), side by side: router `kv` (dp=2 on GPUs 0-1, KV-limited, 2 rounds)
#                          | bench_ep.py EP=2 vs TP=2 (Qwen3-30B-A3B on GPUs 2-3)
#                          | the EP and PP GPU tests (tiny fp32 models, all 4 GPUs, ~1 min)
#     phase 2 (~140 s): router `dp4` (dp=4, DP4_ROUNDS=1 round; 2 take ~215 s)
#     phase 3 (~115 s): router `dp2tp2` (dp=2 x tp=2, the fits shape at 32 groups, 1 round)
#   bash benchmarks/gpu/run_issue30_x4.sh models   # up to ~575 s:
#     bench_ep.py TP=4, EP=4, EP=4 all_reduce mode (Qwen3-30B-A3B; <= 280 s), then bench_pp.py
#     TP=4, PP=2 x TP=2, PP=2 x TP=2 without micro-batches (70B; the rest): the first two
#     layouts of each are the rows issue 30 asks for (~200 s each job), the third fills time
#   bash benchmarks/gpu/run_issue30_x4.sh all      # one call: the same jobs, acceptance rows
#     first (kv | ep2 | tests, dp4, ep4, pp, dp2tp2); ~850 s of work, so what does not fit the
#     budget is cut short or skipped (said in the output)
# Every job has its own `timeout` (its whole process group: replicas, routers and TP ranks go
# with it) and the script keeps to BUDGET seconds in all (default 560): a job starting late gets
# what is left, one with less than its minimum left is skipped. The router and layout scripts
# print each round / layout as it finishes, so a job cut short still shows what it measured.
set -o pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/device_env.sh
BUDGET=${BUDGET:-$([ -n "$SMOKE" ] && echo 3600 || echo 560)}
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null
echo "commit $COMMIT, $(nproc) cores, budget ${BUDGET}s"

gpus_idle() {  # wait (<= 20 s) until every GPU is back to < 2 GiB used: the next job sizes its
  # KV from free memory, and a killed job's processes may still be exiting (memory, not the
  # process list: a container's nvidia-smi may not see its own processes)
  command -v nvidia-smi > /dev/null || return 0
  local used
  for _ in $(seq 20); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    ((${used:-0} < 2048)) && return
    sleep 1
  done
  echo "warning: a GPU still has ${used} MiB in use after 20 s"
}

source benchmarks/gpu/budget_jobs.sh  # job NAME WANT_S MIN_S CMD...

summary() {  # NAME: the measured lines of a job's full log (a router job's: router_NAME.log)
  local log=$OUT/$1.log
  [ -e "$OUT/router_$1.log" ] && log=$OUT/router_$1.log
  [ -e "$log" ] || return 0
  echo "=== $1 ($log)"
  grep -v '^\[dp\|Warning\|warn(\|it/s\]\|^\s*$\|return func\|^  warnings' "$log" | tail -${TAIL:-24}
}

# Router runs: run_router_suite.sh's workloads, its full log in $OUT/router_WORKLOAD.log
# (ROUTER_TIMEOUT=0: this job's timeout governs).
router() {  # WORKLOAD WANT MIN [bench_router.py options]
  local name=$1 want=$2 min=$3; shift 3
  job "$name" "$want" "$min" env ROUTER_TIMEOUT=0 bash benchmarks/gpu/run_router_suite.sh "$name" "$@" $SMOKE_ROUTER
}
EP2="python3 benchmarks/gpu/bench_ep.py --layouts tp2,ep2 --num 128 --out-len 128 --decode-len 64"
# The layouts past the second run while the job's time lasts (each row prints as it finishes).
EP4="python3 benchmarks/gpu/bench_ep.py --layouts ${EP4_LAYOUTS:-tp4,ep4,ep4-allreduce} --num 256
  --out-len 128 --decode-len 64"
PP="python3 benchmarks/gpu/bench_pp.py --layouts ${PP_LAYOUTS:-tp4,pp2-tp2,pp2-tp2-whole} --num 64
  --out-len 128 --decode-len 64"
TESTS="tests/runtime/distributed"
# SMOKE=1: the whole script on CPU (tiny models, gloo, a few tokens; the GPU tests skip), to
# check its jobs, limits and logs before a device call.
if [ -n "$SMOKE" ]; then
  export ROUTER_MODEL="--tiny" OMP_NUM_THREADS=1 LIMIT_SCALE=${LIMIT_SCALE:-4}
  SMOKE_ROUTER="--groups 3 --prompts-per-group 4 --system-prompt-len 96 --question-len 8
    --output-len 4 --concurrency 8 --rounds 1 --warmup 1"
  EP2+=" --smoke"; EP4+=" --smoke"; PP+=" --smoke"
fi

phase1() {  # the KV-limited router on GPUs 0-1 while GPUs 2-3 run EP=2 vs TP=2; the GPU tests beside
  (export CUDA_VISIBLE_DEVICES=0,1; router kv 250 150) &
  (export CUDA_VISIBLE_DEVICES=2,3; job ep2 220 120 $EP2) &
  job test_ep_gpu 150 60 python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS/test_ep_models.py &
  job test_pp_gpu 150 60 python3 -m pytest -q -m gpu -p no:cacheprovider $TESTS/test_pp_models.py &
  wait
  gpus_idle
}

router_phase() {
  phase1
  router dp4 200 90 --rounds ${DP4_ROUNDS:-1}; gpus_idle
  router dp2tp2 170 90 --rounds 1 --groups 32
  for n in test_ep_gpu test_pp_gpu; do TAIL=6 summary $n; done
  for n in kv ep2 dp4 dp2tp2; do summary $n; done
}

models_phase() {
  job ep4 280 150 $EP4; gpus_idle
  job pp 270 160 $PP
  for n in ep4 pp; do summary $n; done
}

case "$1" in
  router) router_phase ;;
  models) models_phase ;;
  all)
    phase1
    router dp4 200 90 --rounds 1; gpus_idle
    job ep4 200 150 $EP4; gpus_idle
    job pp 260 160 $PP; gpus_idle
    router dp2tp2 170 90 --rounds 1 --groups 32 --policies cost_aware,round_robin
    for n in test_ep_gpu test_pp_gpu; do TAIL=6 summary $n; done
    for n in kv ep2 dp4 ep4 pp dp2tp2; do summary $n; done ;;
  *) echo "usage: $0 router|models|all"; exit 2 ;;
esac
echo "done at ${SECONDS}s"
