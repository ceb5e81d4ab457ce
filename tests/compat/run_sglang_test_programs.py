"""Run SGLang's own frontend test programs (``sglang.test.test_programs``) through SGLang's own
client (``sglang.RuntimeEndpoint``) against a running ``sgdsl serve``: the wire-compatibility
check of issue 11, by hand, since SGLang is not a dependency.

    pip install --no-deps sglang==0.5.5 && pip install pybase64 aiohttp pillow dill sentencepiece
    sgdsl serve --port 30000 &
    python tests/compat/run_sglang_test_programs.py http://127.0.0.1:30000 [test_name ...]

(``test_stream_logprobs`` is in later programs: sglang==0.5.23 with ``pip install pybase64 pillow
msgspec aiohttp`` runs it; it passed, with test_stream, test_regex and test_decode_json_regex.)

Prints PASS/FAIL per program with the reason. With the embedded SmolLM2-135M, the expected
failures are answer quality (few_shot_qa, decode_int, react), programs for OpenAI only
(completion_speculative reads ``token_usage``), and ones needing what a closed machine lacks
(hellaswag_select downloads its data; image_qa needs ``example_image.png`` and a vision model).
"""
from __future__ import annotations

import inspect
import sys
import time
import traceback


def main(argv: list[str]) -> int:
    import sglang as sgl
    from sglang.test import test_programs

    backend = sgl.RuntimeEndpoint(argv[0])
    backend.endpoint = backend  # what sgl.Runtime exposes (test_gen_min_new_tokens reads it)
    sgl.set_default_backend(backend)
    names = argv[1:] or sorted(n for n in dir(test_programs) if n.startswith("test_"))
    passed = 0
    for name in names:
        fn = getattr(test_programs, name)
        kwargs = {"check_answer": False} if "check_answer" in inspect.signature(fn).parameters else {}
        t0 = time.perf_counter()
        try:
            fn(**kwargs)
        except Exception as exc:  # noqa: BLE001 - report every program, whatever failed
            where = traceback.format_exc().strip().splitlines()[-3:]
            print(f"FAIL {name} ({time.perf_counter() - t0:.1f} s): {type(exc).__name__}: "
                  f"{str(exc)[:200]}\n    " + " | ".join(where)[:600], flush=True)
            continue
        passed += 1
        print(f"PASS {name} ({time.perf_counter() - t0:.1f} s)", flush=True)
    print(f"{passed}/{len(names)} passed")
    return 0 if passed == len(names) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
