#!/bin/bash
# tp-step (issue 30): the decode step's work outside the graph, on 4 GPUs, one device call of
# <= BUDGET seconds (default 570); each job under its own `timeout`, full logs in $OUT/*.log,
# the lines that matter on stdout. A job with less than its minimum left is skipped.
#   bash benchmarks/gpu/run_tp_step.sh
#     1. side by side (~150 s): GPUs 0-1 the tests (the step kernels compiled, whole steps =
#        the plain graphs at TP=1 and TP=2 with the ranks' ids checked, the overlap test);
#        GPU 2 bench_tp.py 8B TP=1 with the step as now (new) and as before (old)
#     2. (~150 s) 8B TP=4, new and old
#     3. (~150 s) 70B TP=4, new
#     then each row's us/token and TP=4 / TP=1 (new over new, old over old); each row's device
#     timeline (rank 0: the graph's time, the time between two graphs, the host's share)
#   bash benchmarks/gpu/run_tp_step.sh ab     (4 GPUs, ~380 s, no tests) 8B TP=1 and TP=4 with
#     the step as before first, then as now (--step old,new: the reverse of the first run's
#     order, which had old TP=4 at 540.7 tok/s where the last session measured 584.5; at TP=4
#     also nolocal: the logits all-gathered for the greedy pick), each with its device
#     timeline: how much of the Engine's token is graph, between graphs, host
#   bash benchmarks/gpu/run_tp_step.sh tp2    (2 GPUs, ~170 s) 8B TP=1 and TP=2 (issue 30's
#     TP=2 >= 1.6x TP=1 row, not measured since efe1938), new, with timelines
#   SMOKE=1 bash benchmarks/gpu/run_tp_step.sh [MODE]   (a CPU check of the plumbing)
set -o pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/device_env.sh
BUDGET=${BUDGET:-570}
OUT=${OUT:-/tmp/tp_step_out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader 2>/dev/null
echo "commit $COMMIT, budget ${BUDGET}s"

source benchmarks/gpu/budget_jobs.sh  # job NAME WANT_S MIN_S CMD...

PYTEST="python3 -m pytest -q -p no:cacheprovider"
BENCH="python3 benchmarks/gpu/bench_tp.py --pdl on --chain all --timeline $OUT/timeline"
if [ -n "$SMOKE" ]; then
  PYTEST+=" --collect-only"
  BENCH="echo would run: $BENCH"
fi

case "${1:-all}" in
  all)
    (export CUDA_VISIBLE_DEVICES=0,1; job tests 160 60 $PYTEST -s \
      tests/runtime/kernels/test_decode_step_kernels.py \
      tests/runtime/scheduler/test_step_graphs_gpu.py tests/runtime/scheduler/test_overlap_gpu.py) &
    (export CUDA_VISIBLE_DEVICES=2; job tp1 160 90 $BENCH --runs 8b-tp1 --step new,old) &
    wait
    job tp4 160 90 $BENCH --runs 8b-tp4 --step new,old
    job tp4_70b 170 100 $BENCH --runs 70b-tp4 --step new ;;
  ab)
    job tp1 150 90 $BENCH --runs 8b-tp1 --step old,new
    job tp4 230 100 $BENCH --runs 8b-tp4 --step old,nolocal,new ;;
  tp2)
    job tp1 150 90 $BENCH --runs 8b-tp1 --step new
    job tp2 160 80 $BENCH --runs 8b-tp2 --step new ;;
  *) echo "usage: $0 [all|ab|tp2]"; exit 2 ;;
esac

[ -e "$OUT/tests.log" ] && { echo "=== tests"; grep -E "passed|failed|rror|skipped" "$OUT/tests.log" | tail -8; }
for b in tp1 tp2 tp4 tp4_70b; do
  [ -e "$OUT/$b.log" ] || continue
  echo "=== $b"; grep -E "^\||copy|rror|us/token|timeline" "$OUT/$b.log" | tail -14
done
# TP=4 over TP=1 across the two runs (bench_tp prints each row as a Python list)
python3 - "$OUT" <<'EOF'
import ast, pathlib, re, sys
rows = {}
for name in ("tp1", "tp2", "tp4", "tp4_70b"):
    path = pathlib.Path(sys.argv[1]) / f"{name}.log"
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("['llama"):
            row = ast.literal_eval(line)
            rows[row[0]] = row
for name, row in rows.items():
    m = re.match(r"(llama-3.1-\w+) TP=(\d+) .*step=(\w+)", name)
    if not m:
        continue
    one = next((r for n, r in rows.items() if n.startswith(f"{m[1]} TP=1 ")
                and n.endswith(f"step={m[3]}")), None)
    ratio = f", {row[1] / one[1]:.3f}x TP=1 ({m[3]})" if one and m[2] != "1" else ""
    print(f"{name}: {row[1]:.1f} tok/s = {1e6 / row[1]:.0f} us/token, "
          f"{row[5]:.3f} of the copy floor{ratio}")
EOF
echo "done at ${SECONDS}s"
