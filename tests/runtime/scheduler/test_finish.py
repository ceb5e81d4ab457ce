"""FinishChecker: stop strings that span many byte-level tokens are caught."""
from types import SimpleNamespace

from transformers import AutoTokenizer

from sgdsl.runtime.model.embedded import embedded_model_path
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.finish import FinishChecker


def _req(ids: list[int], **params) -> SimpleNamespace:
    return SimpleNamespace(output_ids=ids, sampling_params=SamplingParams(**params))


def test_multibyte_stop_string_spanning_more_tokens_than_characters() -> None:
    tok = AutoTokenizer.from_pretrained(str(embedded_model_path()))
    stop = "世界，再"
    ids = tok.encode("hello there " + stop, add_special_tokens=False)
    assert len(tok.encode(stop, add_special_tokens=False)) > len(stop)  # the case that matters
    checker = FinishChecker([2], lambda t: tok.decode(t))
    # Check token by token, as the scheduler does: the match must be found exactly once complete.
    reasons = [checker.check(_req(ids[:i], stop=(stop,), max_new_tokens=64))
               for i in range(1, len(ids) + 1)]
    assert reasons[-1] == {"type": "stop", "matched": stop}
    assert all(r is None for r in reasons[:-1])


def test_eos_waits_for_min_new_tokens_and_length_finishes() -> None:
    checker = FinishChecker([2], None)
    assert checker.check(_req([5, 2], min_new_tokens=3, max_new_tokens=8)) is None
    assert checker.check(_req([5, 6, 2], min_new_tokens=3, max_new_tokens=8)) == {
        "type": "stop", "matched": 2}
    assert checker.check(_req([5, 6, 7], max_new_tokens=3)) == {"type": "length", "length": 3}
