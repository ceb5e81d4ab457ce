"""``sse_data``: orjson for chunks that hold no non-finite float (native streams without
logprobs), the same JSON value as ``json.dumps`` writes; ``json.dumps`` where orjson would
change or refuse the value."""
from __future__ import annotations

import json
import math

from sgdsl.runtime.server.sse import sse_data


def _value(event: bytes) -> object:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:-2])


def test_a_plain_chunk_is_the_same_json_value_either_way():
    chunk = {"text": "héllo 世界 \u2028 \"q\"", "output_ids": list(range(300)),
             "meta_info": {"id": "r1", "finish_reason": None, "e2e_latency": 0.125,
                           "cached_tokens_details": {1: 3}}, "delta": "界"}
    fast, plain = sse_data(chunk, may_hold_nonfinite=False), sse_data(chunk)
    assert _value(fast) == _value(plain)


def test_what_orjson_would_change_or_refuse_stays_with_json():
    logprobs = {"meta_info": {"output_token_logprobs": [[-math.inf, 5, None]]}}
    assert b"-Infinity" in sse_data(logprobs)  # the default: json's spelling, as before
    huge = {"output_ids": [2 ** 70]}  # past 64 bits: orjson refuses, json writes it
    assert _value(sse_data(huge, may_hold_nonfinite=False)) == huge
