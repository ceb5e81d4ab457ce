#!/bin/bash
# Download, on this (networked) machine, the wheels the device machine lacks into .whl/ (git-
# ignored); device calls then pass carry: [".whl"] and start with `source
# benchmarks/gpu/device_env.sh`, which installs them. The device has torch, triton and
# transformers but no network; it runs CPython 3.12 on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/../.."
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64
           manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl)
for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
# grammar backends (xgrammar needs apache-tvm-ffi and pydantic), the server's zmq, the
# runtime's timed regex search, and jsonschema for the normalizer's output check
python -m pip download "${args[@]}" \
  xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 outlines-core==0.2.14 \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
  pyzmq==27.3.0 regex==2026.5.9 \
  jsonschema==4.26.0 referencing==0.37.0 rpds-py==0.30.0 attrs==26.1.0 \
  jsonschema-specifications==2025.9.1
du -sh .whl
