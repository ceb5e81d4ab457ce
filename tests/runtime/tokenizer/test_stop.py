"""Stop-string tests on the embedded tokenizer: matches that span tokens (incl. multi-byte
characters), a bounded decode window, streaming holdback (streamed text is always a prefix of the
final text) and trimming."""
from __future__ import annotations

import pytest

from sgdsl.runtime.tokenizer.detokenizer import IncrementalDetokenizer
from sgdsl.runtime.tokenizer.stop import StopStringMatcher, StopStringTrimmer, trim_at_stop

from .conftest import CountingTokenizer


def first_match(matcher: StopStringMatcher, ids: list[int]) -> tuple[int, str | None]:
    """Run the matcher after each token like the scheduler; (tokens generated, matched)."""
    for n in range(1, len(ids) + 1):
        hit = matcher.check(ids[:n])
        if hit is not None:
            return n, hit
    return len(ids), None


CASES = [
    ("The answer is 42.\n\nQuestion: what next?", ["\n\nQuestion"]),
    ("Hello 😀 world 😀 again", ["😀 wor"]),
    ("你好世界，再见世界", ["世界，再"]),
    ("abc def ghi", ["zzz", "f gh", "ghi"]),
]


@pytest.mark.parametrize("text,stops", CASES)
def test_matcher_fires_on_the_token_that_completes_the_stop(tokenizer, text, stops) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    n, hit = first_match(StopStringMatcher(tokenizer, stops), ids)
    assert hit is not None and hit in stops
    done = tokenizer.decode(ids[:n])
    assert hit in done and hit not in tokenizer.decode(ids[: n - 1])
    assert done.find(hit) == min(done.find(s) for s in stops if s in done)


def test_matcher_spanning_tokens_and_no_false_match(tokenizer) -> None:
    ids = tokenizer.encode("one two three four", add_special_tokens=False)
    stop = "o thr"
    assert any(stop not in tokenizer.decode([i]) for i in ids)  # spans at least two tokens
    assert first_match(StopStringMatcher(tokenizer, [stop]), ids)[1] == stop
    assert first_match(StopStringMatcher(tokenizer, ["five"]), ids) == (len(ids), None)
    assert StopStringMatcher(tokenizer, []).check(ids) is None


def test_matcher_decodes_only_a_tail_window(tokenizer) -> None:
    ids = tokenizer.encode("lorem ipsum dolor sit amet " * 30, add_special_tokens=False)
    counting = CountingTokenizer(tokenizer)
    matcher = StopStringMatcher(counting, ["END!"])
    assert first_match(matcher, ids)[1] is None
    assert max(counting.lengths) == len("END!") + 2 < len(ids)


def run_stream(tokenizer, text: str, stops: list[str], no_stop_trim: bool = False):
    """Scheduler matcher + detokenizer + trimmer, one token per step. Returns (chunks, trimmer)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    matcher = StopStringMatcher(tokenizer, stops)
    detok = IncrementalDetokenizer(tokenizer)
    trimmer = StopStringTrimmer(stops, no_stop_trim=no_stop_trim)
    chunks: list[str] = []
    matched = None
    for n in range(1, len(ids) + 1):
        chunks.append(trimmer.push(detok.add(ids[n - 1:n])))
        matched = matcher.check(ids[:n])
        if matched:
            break
    chunks.append(trimmer.finish(matched, tail=detok.flush()))
    return chunks, trimmer


@pytest.mark.parametrize("text,stops", CASES)
def test_streamed_text_is_always_a_prefix_of_the_trimmed_final(tokenizer, text, stops) -> None:
    chunks, trimmer = run_stream(tokenizer, text, stops)
    final = trimmer.text
    cut = min(text.find(s) for s in stops if s in text)
    assert final == text[:cut]
    assert "".join(chunks) == final == trimmer.emitted
    so_far = ""
    for c in chunks:
        so_far += c
        assert final.startswith(so_far) and "\ufffd" not in c


def test_no_stop_trim_keeps_the_stop_string(tokenizer) -> None:
    text = "The answer is 42.\n\nQuestion: what next?"
    chunks, trimmer = run_stream(tokenizer, text, ["\n\nQuestion"], no_stop_trim=True)
    assert "".join(chunks) == trimmer.text and trimmer.text.startswith("The answer is 42.\n\nQuestion")


def test_holdback_releases_a_prefix_that_does_not_complete() -> None:
    t = StopStringTrimmer(["abc", "xyz"])
    assert t.push("hello ab") == "hello "
    assert t.push("d") == "abd"
    assert t.push(" xy") == " "
    assert t.push("z tail") == "" and t.stopped
    assert t.finish("xyz") == "" and t.text == "hello abd "


def test_stop_inside_one_delta_trims_following_text() -> None:
    t = StopStringTrimmer(["STOP"])
    assert t.push("fooSTOPbar") == "foo"
    assert t.push("more") == ""
    assert t.text == "foo" and t.emitted == "foo"


def test_finish_trims_at_the_schedulers_match_in_the_tail() -> None:
    t = StopStringTrimmer(["\n\n"])
    assert t.push("line\n") == "line"
    assert t.finish("\n\n", tail="\nrest") == "" and t.text == "line"
    t = StopStringTrimmer([])
    assert t.push("a") == "a" and t.finish(2, tail="b") == "b" and t.text == "ab"
    t = StopStringTrimmer(["ab"])
    assert t.push("xa") == "x" and t.finish(None) == "a" and t.text == "xa"


def test_trim_at_stop() -> None:
    assert trim_at_stop("abc<END>def", "<END>") == "abc"
    assert trim_at_stop("abc<END>def", "<END>", no_stop_trim=True) == "abc<END>def"
    assert trim_at_stop("abc", None) == "abc" and trim_at_stop("abc", "zz") == "abc"
