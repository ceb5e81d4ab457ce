"""FinishChecker: decides after each sampled token whether a request is done.

Order of checks (SGLang semantics): below ``min_new_tokens`` nothing but the length limit stops a
request; then EOS (unless ``ignore_eos``), ``stop_token_ids``, stop strings (which may span
tokens: the tail of the output is decoded), stop regexes (matched on a decoded tail long enough
for their longest match), and finally ``max_new_tokens``.
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..tokenizer.stop import stop_window
from ..tokenizer.stop_regex import StopRegexTimeout, first_match, regex_window
from .req import Req


class FinishChecker:
    def __init__(self, eos_token_ids: Sequence[int],
                 decode: Callable[[list[int]], str] | None) -> None:
        self.eos = frozenset(eos_token_ids)
        self.decode = decode

    def check(self, req: Req) -> dict | None:
        """Finish reason for the request's newest token, or None to keep going."""
        params = req.sampling_params
        n_out = len(req.output_ids)
        if n_out >= params.min_new_tokens and n_out:
            token = req.output_ids[-1]
            if (token in self.eos and not params.ignore_eos) or token in params.stop_token_ids:
                return {"type": "stop", "matched": token}
            if params.stop:
                matched = self._stop_string(req)
                if matched is not None:
                    return {"type": "stop", "matched": matched}
            if params.stop_regex and self.decode is not None:
                return self._stop_regex(req, n_out) or self._length(req, n_out)
        return self._length(req, n_out)

    @staticmethod
    def _length(req: Req, n_out: int) -> dict | None:
        params = req.sampling_params
        if n_out >= params.max_new_tokens:
            return {"type": "length", "length": params.max_new_tokens}
        return None

    def _stop_regex(self, req: Req, n_out: int) -> dict | None:
        patterns = req.sampling_params.stop_regex
        window = regex_window(patterns, n_out)
        try:
            hit = first_match(self.decode(req.output_ids[-window:]), patterns)
        except StopRegexTimeout as e:
            # NOTE: fails this request alone (its KV is freed like any finish's); the main
            # process raises it as a 400 naming the field
            return {"type": "abort", "message": str(e), "status": 400, "field": "stop_regex"}
        if hit is not None:  # NOTE: SGLang reports the pattern as ``matched``
            return {"type": "stop", "matched": hit[1]}
        return None

    def _stop_string(self, req: Req) -> str | None:
        if self.decode is None:
            return None
        stops = req.sampling_params.stop
        window = stop_window(stops)
        tail = self.decode(req.output_ids[-window:])
        # NOTE: checked after every token, so any match found here is the first one.
        best: tuple[int, str] | None = None
        for s in stops:
            pos = tail.find(s)
            if pos >= 0 and (best is None or pos < best[0]):
                best = (pos, s)
        return best[1] if best else None
