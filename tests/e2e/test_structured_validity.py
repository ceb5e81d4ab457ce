"""Every output produced under a constraint is valid: the JSON-schema suite (216 schemas), a
set of real-world schemas (JSONSchemaBench's GitHub/Kubernetes/Snowplow/JsonSchemaStore/
function-calling collections plus hand-written ones, ``data/schemas/realworld``), the regex suite
and the EBNF suite, on the embedded model, with both grammar backends.

One engine per grammar backend (xgrammar: the session's default engine), and every suite request (JSON, regex, EBNF) sent
to it at once, in one ``gather``, so the scheduler batches them all (max_running_requests is
the default 256: one wave). A schema a backend cannot enforce must be rejected at admission
(InvalidRequestError naming json_schema): those are counted and listed in the output, as are
outputs cut by max_new_tokens (finish reason "length").
"""
from __future__ import annotations

import asyncio
import ast
import json
import re
from pathlib import Path

import jsonschema
import pytest

from sgdsl.runtime.errors import (ConstraintViolationError, InvalidRequestError,
                                  OverloadedError)
from sgdsl.runtime.grammar.schema.validator import validator_class

pytestmark = pytest.mark.slow
DATA = Path(__file__).parents[1] / "data" / "schemas"
SCHEMAS = [json.loads(p.read_text()) for p in sorted((DATA / "json").glob("*.json"))]
MAX_TOKENS = 48
# Share of the suite a backend may reject as unsupported: outlines-core ignores numeric bounds
# (minimum/maximum), so every schema using them is rejected there unless it is a small integer
# range (spelled as an enum): 77 of 216 in the last run;
# xgrammar 3: uniqueItems on string items; allOf, if/then/else, dependentRequired, contains and
# small-domain uniqueItems are rewritten by the normalizer, see runtime/grammar/schema/).
MAX_REJECTED = {"xgrammar": 0.06, "outlines": 0.55}
REGEXES = json.loads((DATA / "regex_suite.json").read_text())
EBNFS = json.loads((DATA / "ebnf_suite.json").read_text())
REALWORLD_NAMES = json.loads((DATA / "realworld_e2e.json").read_text())
REALWORLD = {n: json.loads((DATA / "realworld" / f"{n}.json").read_text()) for n in REALWORLD_NAMES}
# Real-world schemas each backend must admit (of len(REALWORLD)); raise it when admission
# improves, so over-rejection regresses visibly. Every rejection must name keyword and path.
# outlines: 17 at bdba302, 20 with numeric bounds (outlines_bounds.py)
MIN_ADMITTED = {"xgrammar": 26, "outlines": 19}  # xgrammar: 27 compiled at bdba302


def _prompt(task: str) -> str:
    return (f"<|im_start|>user\n{task}<|im_end|>\n<|im_start|>assistant\n")


@pytest.fixture(scope="module", params=["xgrammar", "outlines"])
def engine(request):
    # NOTE: the suite's shared engines (tests/conftest.py): one model load and one set of
    # compile workers less on the CI box per backend. xgrammar: the session's default
    # Engine(); the real-world schemas the compile-burst test compiled on it are found in its
    # cache. outlines: ``outlines_engine``, whose compile waits are never refused (~280
    # distinct compiles are sent at once here, a test of validity, not of overload); its
    # deadline bounds a compile's own CPU work, not its wait for a worker.
    eng = request.getfixturevalue("embedded_engine" if request.param == "xgrammar"
                                  else "outlines_engine")
    eng.backend_name = request.param
    return eng


def _requests() -> list[tuple[str, dict]]:
    """(prompt, sampling params): the JSON suite, then the regex suite, then the EBNF suite."""
    reqs = [(_prompt(f"Give an example JSON value for '{s['title']}'."),
             {"json_schema": json.dumps(s), "max_new_tokens": MAX_TOKENS, "temperature": 0})
            for s in SCHEMAS]
    reqs += [(_prompt(f"Write text matching {r}"),
              {"regex": r, "max_new_tokens": MAX_TOKENS, "temperature": 0}) for r in REGEXES]
    reqs += [(_prompt(f"Write an example of {e['name']}"),
              {"ebnf": e["ebnf"], "max_new_tokens": MAX_TOKENS, "temperature": 0.7, "seed": 1})
             for e in EBNFS]
    reqs += [(_prompt(f"Give an example JSON value for '{s.get('title', n)}'."),
              {"json_schema": json.dumps(s), "max_new_tokens": MAX_TOKENS, "temperature": 0.7,
               "seed": 1}) for n, s in REALWORLD.items()]
    return reqs


@pytest.fixture(scope="module")
def results(engine) -> list:
    """Every suite request's result (or its InvalidRequestError), all sent concurrently."""
    async def one(p, sp):
        while True:
            try:
                return await engine.async_generate(p, sp)
            except OverloadedError as e:  # a long compile queue (the shared default engine
                await asyncio.sleep(e.retry_after)  # refuses waits past 60 s): as a client would
            except (InvalidRequestError, ConstraintViolationError) as e:
                return e

    async def go():
        return await asyncio.gather(*(one(p, sp) for p, sp in _requests()))
    return asyncio.run(go())


def test_json_schema_suite(engine, results):
    assert len(SCHEMAS) >= 200
    results = results[:len(SCHEMAS)]
    rejected, truncated, valid, format_only = [], [], 0, []
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for schema, res in zip(SCHEMAS, results):
        assert not isinstance(res, ConstraintViolationError), (schema["title"], str(res))
        if isinstance(res, InvalidRequestError):
            assert res.field == "json_schema" and str(res), schema["title"]
            rejected.append(f"{schema['title']}: {res}")
            continue
        if res["meta_info"]["finish_reason"]["type"] == "length":
            truncated.append(schema["title"])
            continue
        assert res["meta_info"]["finish_reason"]["type"] == "stop", res["meta_info"]
        value = json.loads(res["text"])  # must parse
        jsonschema.validate(value, schema)  # must validate (format is an annotation here)
        try:
            jsonschema.validate(value, schema, format_checker=checker)
        except jsonschema.ValidationError as e:  # grammar formats are approximations: listed
            format_only.append(f"{schema['title']}: {e.message}")
        valid += 1
    name = engine.backend_name
    print(f"\n[{name}] {len(SCHEMAS)} schemas: {valid} valid, {len(truncated)} cut at "
          f"{MAX_TOKENS} tokens, {len(rejected)} rejected at admission")
    for line in rejected:
        print(f"  rejected: {line}")
    for line in format_only:
        print(f"  format checker disagrees: {line}")
    print(f"  truncated: {truncated}")
    assert len(rejected) <= MAX_REJECTED[name] * len(SCHEMAS)
    assert valid >= 0.6 * (len(SCHEMAS) - len(rejected))


def _check_ebnf(entry: dict, text: str) -> bool:
    if "regex" in entry:
        return re.fullmatch(entry["regex"], text) is not None
    if entry["check"] == "json":
        json.loads(text)
        return True
    if entry["check"] == "arith":
        ast.parse(text, mode="eval")
        return bool(re.fullmatch(r"[0-9+\-*/()]+", text))
    depth = 0
    for c in text:
        depth += 1 if c == "(" else -1
        if depth < 0:
            return False
    return depth == 0 and set(text) <= {"(", ")"}


def test_regex_and_ebnf_suites(engine, results):
    regexes, ebnfs = REGEXES, EBNFS
    results = results[len(SCHEMAS):len(SCHEMAS) + len(regexes) + len(ebnfs)]
    assert len(results) == len(regexes) + len(ebnfs)
    rejected, done = [], 0
    for i, res in enumerate(results):
        label = regexes[i] if i < len(regexes) else ebnfs[i - len(regexes)]["name"]
        if isinstance(res, InvalidRequestError):
            rejected.append(f"{label}: {res}")
            continue
        if res["meta_info"]["finish_reason"]["type"] == "length":
            continue
        if i < len(regexes):
            assert re.fullmatch(regexes[i], res["text"]), (label, res["text"])
        else:
            assert _check_ebnf(ebnfs[i - len(regexes)], res["text"]), (label, res["text"])
        done += 1
    print(f"\n[{engine.backend_name}] regex+ebnf: {done} valid of {len(results)}; "
          f"rejected: {rejected}")
    assert not any(r.startswith(tuple(regexes)) for r in rejected)  # regexes always compile
    if engine.backend_name == "xgrammar":
        assert not rejected
    else:  # outlines: only recursive grammars, each with a message saying so
        assert all("recursive" in r for r in rejected) and len(rejected) <= 3
    assert done >= 0.7 * len(results)


# A rejection must name a keyword and its JSON path ("json_schema keyword 'X' at #/..."), or a
# limit/deadline that is not about a keyword.
_NAMED = re.compile(r"keyword '[^']+' at #|did not compile within|exceeds the limit|"
                    r"backend enforces json_schema \w+ up to .* \(at #|backend cannot enforce "
                    r"json_schema keyword '[^']+' \(at #")


def test_realworld_schemas(engine, results):
    results = results[len(SCHEMAS) + len(REGEXES) + len(EBNFS):]
    assert len(results) == len(REALWORLD) >= 25
    counts = {"valid": 0, "invalid": 0, "cut": 0}
    rejected = []
    for (name, schema), res in zip(REALWORLD.items(), results):
        if isinstance(res, ConstraintViolationError):  # caught by the backstop: still a bug
            counts["invalid"] += 1
            print(f"  INVALID (caught): {name}: {res}")
            continue
        if isinstance(res, InvalidRequestError):
            assert res.field == "json_schema" and _NAMED.search(str(res)), (name, str(res))
            rejected.append(f"{name}: {res}")
            continue
        if res["meta_info"]["finish_reason"]["type"] == "length":
            counts["cut"] += 1
            continue
        validator_class(schema)(schema).validate(json.loads(res["text"]))
        counts["valid"] += 1
    name = engine.backend_name
    admitted = len(REALWORLD) - len(rejected)
    print(f"\n[{name}] {len(REALWORLD)} real-world schemas: {admitted} admitted, {counts}")
    for line in rejected:
        print(f"  rejected: {line[:300]}")
    assert counts["invalid"] == 0
    assert admitted >= MIN_ADMITTED[name]


def test_bad_grammar_is_a_400_and_others_finish(engine):
    async def go():
        bad = engine.async_generate("x", {"ebnf": "root ::= nothing_defined",
                                          "max_new_tokens": 4})
        good = engine.async_generate(_prompt("Pick yes or no."),
                                     {"regex": "(yes|no)", "max_new_tokens": 4})
        return await asyncio.gather(bad, good, return_exceptions=True)
    bad, good = asyncio.run(go())
    assert isinstance(bad, InvalidRequestError) and bad.field == "ebnf" and bad.status == 400
    assert good["text"] in ("yes", "no")
    engine.check_idle_integrity()
