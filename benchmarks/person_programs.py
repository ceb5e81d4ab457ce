"""The language benchmarks' two programs over the person schema (benchmarks/person_schema.json):
one ``gen`` constrained by the schema, and one unconstrained ``gen`` of a given length
(``ignore_eos``), the matched-length peer of the first. Both greedy."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SCHEMA_TEXT = json.dumps(json.loads((Path(__file__).resolve().parent / "person_schema.json")
                                    .read_text()))


def person_programs() -> tuple[Any, Any]:
    """``(constrained, free)``, each called as ``program.run_batch([{"prompt": ..., "budget":
    max_tokens}, ...])``."""
    import sgdsl as sgl

    @sgl.function
    def constrained(s, prompt: str, budget: int):
        s += prompt
        s += sgl.gen("out", max_tokens=budget, json_schema=SCHEMA_TEXT, temperature=0.0)

    @sgl.function
    def free(s, prompt: str, budget: int):
        s += prompt
        s += sgl.gen("out", max_tokens=budget, ignore_eos=True, temperature=0.0)
    return constrained, free
