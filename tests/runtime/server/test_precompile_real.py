"""``POST /precompile`` on the real server (runtime/server/native.py): each constraint's
verdict, compiled once and found by later requests; the compiles land in the grammar disk
cache folder given by ``--grammar-cache-dir``."""
from __future__ import annotations

import json
import signal

from .conftest import start_real_server, stop_real_server

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"]}
CONSTRAINTS = [{"json_schema": SCHEMA}, {"regex": r"(yes|no)-[0-9]{3}"},
               {"ebnf": 'root ::= "ab" | "c" root'}]
INVALID = [{"regex": "(unclosed"}, {"json_schema": {"type": "nosuchtype"}}]


def test_precompile_route(tiny_model_dir, tmp_path):
    served = start_real_server("--model", str(tiny_model_dir), "--load-format", "dummy",
                               "--max-total-tokens", "2048", "--grammar-cache-dir",
                               str(tmp_path))
    try:
        with served.client() as client:
            before = client.get("/get_server_info").json()["grammar_compiles"]  # warm-up's
            r = client.post("/precompile", json={"constraints": CONSTRAINTS + INVALID})
            assert r.status_code == 200, r.text
            assert [x["ok"] for x in r.json()["results"]] == [True] * 3 + [False] * 2
            assert client.post("/precompile", json={"schemas": []}).status_code == 400
            compiled = client.get("/get_server_info").json()["grammar_compiles"]
            assert compiled == before + 3
            r = client.post("/generate", json={"text": "Answer:", "sampling_params": {
                "json_schema": json.dumps(SCHEMA), "max_new_tokens": 24, "temperature": 0}})
            assert r.status_code == 200, r.text
            assert client.get("/get_server_info").json()["grammar_compiles"] == compiled
            assert client.get("/debug/check_idle_integrity").status_code == 200
            metrics = client.get("/metrics").text  # the counters reach Prometheus too
            assert f"sgdsl_engine_grammar_compiles {float(compiled)}" in metrics
            assert "sgdsl_engine_grammar_disk_cache_misses" in metrics
    finally:
        code = stop_real_server(served)
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the SIGTERM it handled
    assert len(list(tmp_path.rglob("*.grammar"))) == compiled
