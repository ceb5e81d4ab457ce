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
# images (bench_vlm.py): the transformers image processors decode and resize with PIL
python -m pip download "${args[@]}" pillow==13.0.0
# the embedded model's GGUF conversion (bench_speculative_real.py; a pure-Python wheel)
python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d .whl gguf==0.19.0
# the server and the official clients, for benchmarks through `sgdsl serve` (the device has
# httpx, anyio, h11, uvloop and aiohttp already); the versions the tests run here
python -m pip download "${args[@]}" \
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.7.1 orjson==3.10.18 \
  openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 anthropic==2.14.0 docstring-parser==0.18.0 \
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 opentelemetry-api==1.45.2 anyio==4.16.0 \
  typing-extensions==4.16.0
du -sh .whl
