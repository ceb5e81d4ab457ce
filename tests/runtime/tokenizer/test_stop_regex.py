"""stop_regex: the scheduler's check (decoded tail, first token that completes a match), the
streaming holdback (no text a pattern could still match is shown) and the final trim."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.finish import FinishChecker
from sgdsl.runtime.tokenizer.detokenizer import IncrementalDetokenizer
from sgdsl.runtime.tokenizer.stop import StopStringTrimmer, trim_at_stop
from sgdsl.runtime.tokenizer.stop_regex import (StopRegexTimeout, first_match, partial_start,
                                                 regex_window)


def _run(tokenizer, text: str, patterns: list[str], no_stop_trim: bool = False):
    """Scheduler check + detokenizer + trimmer, one token per step, as the runtime does."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    checker = FinishChecker([], lambda t: tokenizer.decode(t))
    params = SamplingParams(stop_regex=tuple(patterns), max_new_tokens=len(ids) + 1,
                            no_stop_trim=no_stop_trim)
    detok = IncrementalDetokenizer(tokenizer)
    trimmer = StopStringTrimmer((), no_stop_trim, params.stop_regex)
    chunks, reason = [], None
    for n in range(1, len(ids) + 1):
        chunks.append(trimmer.push(detok.add(ids[n - 1:n])))
        reason = checker.check(SimpleNamespace(output_ids=ids[:n], sampling_params=params))
        if reason is not None:
            break
    matched = reason["matched"] if reason else None
    chunks.append(trimmer.finish(matched, tail=detok.flush()))
    return chunks, trimmer, reason


@pytest.mark.parametrize("text,patterns,final", [
    ("The answer is 42 and more", [r"\d+"], "The answer is "),
    ("Step one. Step two. Step three", [r"two\.", r"Step t\w+"], "Step one. "),
    ("name: Ada\nage: 36\n", [r"age:\s*\d"], "name: Ada\n"),
    ("价格是 100 元，谢谢", [r"\d{3}\s*元"], "价格是 "),
    ("nothing to see here", [r"\d"], "nothing to see here"),
])
def test_stream_and_final_text_cut_at_the_first_match(tokenizer, text, patterns, final) -> None:
    chunks, trimmer, reason = _run(tokenizer, text, patterns)
    assert trimmer.text == final == "".join(chunks)
    so_far = ""
    for c in chunks:  # every streamed prefix is a prefix of the final text
        so_far += c
        assert final.startswith(so_far)
    if final != text:
        assert reason["type"] == "stop" and reason["matched"] in patterns
        assert trim_at_stop(text, reason["matched"], stop_regex=tuple(patterns)) == final
    else:
        assert reason is None


def test_no_stop_trim_keeps_the_match(tokenizer) -> None:
    chunks, trimmer, reason = _run(tokenizer, "total: 1234 units", [r"\d+"], no_stop_trim=True)
    assert reason == {"type": "stop", "matched": r"\d+"}
    assert "".join(chunks) == trimmer.text and trimmer.text.startswith("total: 1")


def test_holdback_releases_text_once_a_match_is_ruled_out() -> None:
    t = StopStringTrimmer((), stop_regex=(r"END\d",))
    assert t.push("so far EN") == "so far "
    assert t.push("Dx more") == "ENDx more"
    assert t.push(" END") == " "
    assert t.push("7 after") == "" and t.stopped and t.text == "so far ENDx more "


def test_window_helpers() -> None:
    assert regex_window([r"abc"], 100) == 4 * 3 + 2
    assert regex_window([r"a\d+"], 57) == 57  # unbounded: the whole output
    assert regex_window([r"x{2,5}"], 3) == 3
    assert first_match("a1 b22", [r"b\d+", r"\d"]) == (1, r"\d")
    assert partial_start("value = 12", [r"\d+;"], 0) == len("value = ")
    assert partial_start("value", [r"\d+;"], 0) == len("value")


@pytest.mark.parametrize("value,reason", [
    ("((", "not a valid regular expression"), ([""], "non-empty"), ([3], "non-empty")])
def test_bad_patterns_are_refused_naming_the_field(value, reason) -> None:
    with pytest.raises(InvalidRequestError, match=reason) as err:
        SamplingParams.from_dict({"stop_regex": value})
    assert err.value.field == "stop_regex"


def test_sglang_sampling_fields() -> None:
    p = SamplingParams.from_dict({"stop_regex": r"\n\n", "sampling_seed": 7, "stream_interval": 4,
                                  "custom_params": None, "logit_bias": None})
    assert p.stop_regex == (r"\n\n",) and p.seed == 7
    for key, value in (("structural_tag", '{"x": 1}'), ("logit_bias", {"5": 1.0})):
        with pytest.raises(InvalidRequestError, match="not supported") as err:
            SamplingParams.from_dict({key: value})
        assert err.value.field == key


def test_backtracking_pattern_fails_its_request_within_the_time_bound() -> None:
    """``re`` needs ~3 s for (a|aa)+$ on 34 a's and a b, doubling per character; the scheduler's
    search gives up at SEARCH_TIMEOUT_S and fails that request alone with a 400."""
    text = "a" * 40 + "b"
    checker = FinishChecker([], lambda ids: "".join(chr(i) for i in ids))
    params = SamplingParams(stop_regex=(r"(a|aa)+$",), max_new_tokens=100)
    req = SimpleNamespace(output_ids=[ord(c) for c in text], sampling_params=params)
    reason = checker.check(req)
    assert reason["type"] == "abort" and reason["status"] == 400
    assert reason["field"] == "stop_regex" and "(a|aa)+$" in reason["message"]
    with pytest.raises(StopRegexTimeout):
        first_match(text, [r"(a|aa)+$"])
    # the main process's streaming and final trims stay within the bound too
    trimmer = StopStringTrimmer((), stop_regex=(r"(a|aa)+$",))
    trimmer.push(text)
    trimmer.finish(None)
    assert trim_at_stop(text, r"(a|aa)+$", stop_regex=(r"(a|aa)+$",)) == text


def test_linear_patterns_do_not_trip_the_bound_on_long_outputs() -> None:
    text = "word " * 20000 + "END7"  # 100k characters: a linear search takes ~1 ms
    assert first_match(text, [r"END\d", r"\w+\s+END"]) == (len(text) - 9, r"\w+\s+END")
