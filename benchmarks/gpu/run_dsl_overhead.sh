#!/bin/bash
# Device call: DSL overhead (issue 4) on the GPU: the benchmark, then the coalescer timeline.
set -o pipefail
source benchmarks/gpu/device_env.sh
M="--model benchmarks/gpu/configs/qwen2.5-0.5b --load-format dummy --grammar-backend none"
nproc; python3 -c "import torch; print(torch.cuda.get_device_name())"
timeout 200 python3 benchmarks/bench_dsl_overhead.py $M --passes ${PASSES:-30} 2>&1 | tee $OUT/dsl.log | tail -3
timeout 150 python3 benchmarks/profile_dsl.py $M 2>&1 | tee $OUT/profile_dsl.log | tail -4
