# Sourced by the multi-job device scripts (run_tp_chain.sh, run_issue30_x4.sh): `job` runs one
# command under its own `timeout` within the script's BUDGET seconds (SECONDS counts from the
# script's start), its full log in $OUT/NAME.log, so a call of < 600 s never overruns and a job
# cut short still leaves what it measured.

job() {  # NAME WANT_S MIN_S CMD...: CMD under `timeout` (<= WANT_S x LIMIT_SCALE and what the
  # budget has left); a job with less than MIN_S left is skipped
  local name=$1 want=$(($2 * ${LIMIT_SCALE:-1})) min=$3; shift 3
  local left=$((BUDGET - SECONDS))
  if ((left < min)); then echo "SKIP $name: ${left}s left, it needs >= ${min}s"; return; fi
  local t=$((want < left ? want : left))
  echo "--- $name: start at ${SECONDS}s, limit ${t}s"
  # -k: a job's process group (replicas, routers, TP ranks) gets 15 s to go after SIGTERM
  timeout -k 15 "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "--- $name: rc $rc at ${SECONDS}s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
}
