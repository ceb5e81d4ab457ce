#!/bin/bash
# Batch-1 decode, Llama-3.1-8B bf16 and fp8 weights on one GPU (issue 12, section 3): GPU tests
# of the decode kernels, the decode-GEMM sweep, the decode-step profile, and Engine decode tok/s
# of this tree against BASE (another tree's root, e.g. a copy of main before a change) in the
# same call, with this tree's benchmark script on both. From the tree's root, one device call:
#   BASE=../tree-before PART=N bash benchmarks/gpu/run_batch1_decode.sh
#   1 = kernel tests, chained GEMM sweep (its picks then used by this tree's Engine runs),
#       Engine bf16/fp8 of both trees, bf16 decode-step profile
#   2 = kernel + model GPU tests, the sweep again (its picks used by this tree's Engine runs),
#       Engine bf16/fp8 of both trees, fp8 decode-step profile
#   4 = fusion + sampler GPU tests, greedy argmax timing, the norm-fusion sweep (its table
#       used by this tree's Engine runs, SGDSL_GEMV_FUSION=1), Engine fp8/bf16 of this tree and
#       MAIN (another tree's root: e.g. main before the change)
#   5 = epilogue + decode attention GPU tests, the pair-tile sweep (its table used by this
#       tree's runs), Engine fp8/bf16 of this tree and BASE, fp8 step profiles of both, batch-1
#       attention variants; every step inside a deadline (DEADLINE s, default 380), logs in
#       $OUT/logs.tgz (the files that come back are few)
#   6 = Engine fp8 then bf16 of this tree and BASE only, inside DEADLINE (default 380) s
set -o pipefail
source benchmarks/gpu/device_env.sh
NEW=$PWD
BASE=${BASE:-$PWD}
T=tests/runtime/kernels
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader

LOGS=${LOGS:-$OUT}

engine() {  # engine TREE LABEL [ARGS]: bench_a_decode.py --modes engine on TREE's runtime
  local tree=$1 label=$2
  shift 2
  [ ${ENGINE_LIMIT:-90} -gt 0 ] || { echo "skipped engine $label (deadline)"; return; }
  for d in runtime backends templates; do [ -e $tree/sgdsl/$d ] || ln -s ../$d $tree/sgdsl/$d; done
  PYTHONPATH=/tmp/site:$tree:$NEW/benchmarks/gpu timeout ${ENGINE_LIMIT:-90} python3 \
    $NEW/benchmarks/gpu/bench_a_decode.py --modes engine --repeat ${REPEAT:-1} "$@" 2>&1 \
    | tee $LOGS/a_$label.log | grep "^\['engine" | sed "s/^/$label /"
}

left() {  # left LIMIT: LIMIT, or the seconds left before DEADLINE if fewer (0: skip the step)
  local rest=$(( ${DEADLINE:-380} - SECONDS ))
  [ $rest -lt $1 ] && echo $(( rest > 15 ? rest : 0 )) || echo $1
}

profile() {  # profile TREE LABEL: the fp8 decode-step profile on TREE's runtime
  local lim=$(left 50)
  [ $lim -gt 0 ] || { echo "skipped profile $2 (deadline)"; return; }
  PYTHONPATH=/tmp/site:$1:$NEW/benchmarks/gpu timeout $lim python3 \
    $NEW/benchmarks/gpu/profile_decode.py --quantization fp8 --steps 10 --top 16 \
    --sequence 24 > $LOGS/profile_$2.log 2>&1
  grep -A 10 "decode step summary" $LOGS/profile_$2.log | sed "s/^/$2 /"
}

# the chained GEMM sweep's table (limit $1 s), then fp8 and bf16 Engine runs of both trees
sweep_then_engines() {
  (cd benchmarks/gpu && timeout $1 python3 sweep_gemv.py --table $OUT/tiles.json 2>&1 \
    | tee $OUT/sweep.log | tail -9)
  [ -f $OUT/tiles.json ] && export SGDSL_DECODE_GEMM_TABLE=$OUT/tiles.json
  engine $NEW new_fp8 --quantization fp8
  engine $BASE base_fp8 --quantization fp8
  engine $NEW new_bf16
  engine $BASE base_bf16
}

case "${PART:-1}" in
1)  # tune: the chained GEMM sweep writes its best pick per shape; the Engine runs use it
  timeout 100 python3 -m pytest $T/test_gemv.py $T/test_fp8_matmul.py $T/test_elementwise.py \
    $T/test_skinny_gemm.py -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log | tail -2
  sweep_then_engines 170
  (cd benchmarks/gpu && timeout 70 python3 profile_decode.py --sequence 24 2>&1 \
    | tee $OUT/profile_bf16.log | tail -3)
  ;;
2)  # confirm: GPU tests, the sweep's table in this tree's Engine runs, an fp8 step profile
  timeout 120 python3 -m pytest $T/test_gemv.py $T/test_fp8_matmul.py $T/test_elementwise.py \
    $T/test_triton_backend.py $T/test_decode_attention.py $T/test_gpu_model.py \
    tests/runtime/model/test_runner_cuda.py -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log \
    | tail -2
  sweep_then_engines 110
  (cd benchmarks/gpu && timeout 40 python3 bench_kernels.py --batch1 2>&1 \
    | tee $OUT/attn_batch1.log | tail -12)
  (cd benchmarks/gpu && timeout 60 python3 profile_decode.py --quantization fp8 --sequence 12 \
    2>&1 | tee $OUT/profile_fp8.log | tail -3)
  ;;
4)  # the norm-fusion tiles from a sweep, then this tree (fusion on) against MAIN
  timeout 90 python3 -m pytest $T/test_gemv.py $T/test_gemv_fusion.py \
    tests/runtime/layers/test_sampler_gpu.py -q -p no:cacheprovider 2>&1 | tee $OUT/pytest.log \
    | tail -3
  (cd benchmarks/gpu && timeout 30 python3 bench_argmax.py 2>&1 | tee $OUT/argmax.log | tail -2)
  (cd benchmarks/gpu && timeout 120 python3 sweep_norm_gemv.py --table $OUT/tiles.json 2>&1 \
    | tee $OUT/sweep_norm.log | tail -30)
  [ -f $OUT/tiles.json ] && export SGDSL_DECODE_GEMM_TABLE=$OUT/tiles.json
  for q in fp8 bf16; do
    args=$([ $q = fp8 ] && echo --quantization fp8)
    SGDSL_GEMV_FUSION=1 engine $NEW new_$q $args
    engine ${MAIN:-$PWD} main_$q $args
  done
  ;;
5)  # epilogues + decode attention merge (this tree) against BASE, inside DEADLINE seconds
  mkdir -p $LOGS
  echo "trees: new $(cat COMMIT 2>/dev/null) at $NEW, base $(git -C $BASE rev-parse --short HEAD) at $BASE"
  timeout $(left 100)s python3 -m pytest $T/test_gemv_pairs.py $T/test_decode_attention.py \
    $T/test_prefix_decode_attention.py $T/test_gemv_fusion.py -q -p no:cacheprovider \
    -k "not test_model_decode_fused_vs_separate" > $LOGS/pytest.log 2>&1
  tail -4 $LOGS/pytest.log
  (cd benchmarks/gpu && timeout $(left 60)s python3 sweep_gemv_pairs.py --table $OUT/pairs.json \
    > $LOGS/sweep_pairs.log 2>&1; tail -25 $LOGS/sweep_pairs.log)
  table=$([ -f $OUT/pairs.json ] && echo $OUT/pairs.json)
  for q in fp8 bf16; do
    args=$([ $q = fp8 ] && echo --quantization fp8)
    SGDSL_DECODE_GEMM_TABLE=$table ENGINE_LIMIT=$(left 70) engine $NEW new_$q $args
    ENGINE_LIMIT=$(left 70) engine $BASE base_$q $args
  done
  SGDSL_DECODE_GEMM_TABLE=$table profile $NEW new
  profile $BASE base
  lim=$(left 25)
  [ $lim -gt 0 ] && (cd benchmarks/gpu && timeout $lim python3 bench_kernels.py --batch1 \
    > $LOGS/attn_batch1.log 2>&1; tail -12 $LOGS/attn_batch1.log)
  tar -czf $OUT/logs.tgz -C $LOGS . 2>/dev/null
  echo "elapsed ${SECONDS}s"
  ;;
6)  # Engine runs only: this tree against BASE, fp8 then bf16, each timed
  mkdir -p $LOGS
  echo "trees: new $(cat COMMIT 2>/dev/null) at $NEW, base $(git -C $BASE rev-parse --short HEAD) at $BASE"
  for q in fp8 bf16; do
    args=$([ $q = fp8 ] && echo --quantization fp8)
    for side in new base; do
      tree=$([ $side = new ] && echo $NEW || echo $BASE)
      lim=$(left 70)
      [ $lim -ge 30 ] || lim=0
      t0=$SECONDS
      ENGINE_LIMIT=$lim engine $tree ${side}_$q $args
      echo "  ${side}_$q: $((SECONDS - t0)) s"
    done
  done
  tar -czf $OUT/logs.tgz -C $LOGS . 2>/dev/null
  echo "elapsed ${SECONDS}s"
  ;;
esac
