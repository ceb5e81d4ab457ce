#!/bin/bash
# Offline throughput suite (one device call): B (1000 x 1024/256, Llama-3.1-8B) and E (256 x
# 1024/256, ours vs HF transformers generate_batch in the same call).
set -o pipefail
source benchmarks/gpu/device_env.sh
cd benchmarks/gpu
timeout 200 python3 bench_b_offline.py 2>&1 | tee $OUT/bench_b.log | tail -6
timeout 330 python3 bench_e_vs_hf.py 2>&1 | tee $OUT/bench_e.log | tail -9
