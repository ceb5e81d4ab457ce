#!/bin/bash
# One device call: install, GPU kernel + model tests, kernel microbench, workload A (runner level).
set -o pipefail
export PYTHONUNBUFFERED=1
# The device copy of the tree is disposable: map the package folders the way setup.py does.
for d in runtime backends templates; do [ -e sgdsl/$d ] || ln -s ../$d sgdsl/$d; done
export PYTHONPATH=$PWD:$PWD/benchmarks/gpu
python3 -c "import sgdsl.runtime, torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv
timeout 240 python3 -m pytest tests/runtime/kernels -q -x 2>&1 | tee $OUT/pytest.log | tail -15
cd benchmarks/gpu
timeout 120 python3 bench_kernels.py 2>&1 | tee $OUT/kernels.log | tail -14
timeout 200 python3 bench_a_decode.py 2>&1 | tee $OUT/bench_a.log | tail -12
