"""Req: one generation request's state inside the scheduler process.

KV bookkeeping follows one rule: the first ``kv_len`` tokens of ``all_ids`` have KV written at
``req_to_token[req_pool_idx, :kv_len]``; of those, the first ``len(prefix_indices)`` are owned
by the radix tree (locked through ``last_node``) and the rest by this request. During decode the
last sampled token has no KV yet (``kv_len == seq_len - 1``).
"""
from __future__ import annotations

import enum
from typing import Any

import torch

from ..sampling_params import SamplingParams

_EMPTY = torch.empty(0, dtype=torch.int64)


class ReqState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"  # admitted; some prompt chunks still to run
    DECODING = "decoding"
    FINISHED = "finished"


class Req:
    def __init__(self, rid: str, input_ids: list[int], params: SamplingParams,
                 return_logprob: bool = False, logprob_start_len: int = -1,
                 top_logprobs_num: int = 0, arrival: int = 0, stream: bool = False) -> None:
        self.rid = rid
        self.origin_input_ids = list(input_ids)
        self.sampling_params = params
        self.return_logprob = return_logprob
        self.logprob_start_len = logprob_start_len if return_logprob else -1
        self.top_logprobs_num = top_logprobs_num if return_logprob else 0
        self.arrival = arrival
        self.stream = stream  # per-step outputs wanted (else one at the end)
        self.state = ReqState.WAITING
        self.output_ids: list[int] = []
        self.finish_reason: dict | None = None
        # KV state (see module docstring).
        self.req_pool_idx: int | None = None
        self.prefix_indices: torch.Tensor = _EMPTY
        self.last_node: Any = None
        self.kv_len = 0
        self.extend_len = 0  # tokens fed in the current extend forward
        self.extend_slots: torch.Tensor = _EMPTY  # their reserved KV slots
        # Scheduling hints and statistics.
        self.match_len = 0  # cached prefix length found by the last policy pass
        self.cached_tokens = 0  # prompt tokens served from the cache at first admission
        self.admitted_once = False
        self.counted = False  # first admission already counted in the statistics
        self.num_retractions = 0
        # NOTE: bumped whenever the request gives up its KV (finish, abort, retraction, jump):
        # a step launched before that (overlap scheduling) sees the change and drops its token.
        self.epoch = 0
        # (epoch, key length, tree node) of the last prefix match: ``KVMemory.match`` checks
        # it in O(depth) instead of walking the prompt again (LPM rematches every pass)
        self.match_memo: tuple[int, int, Any] | None = None
        self._init_grammar()
        self._init_logprobs()
        self._init_features()

    def _init_grammar(self) -> None:
        """The grammar's per-request state (runtime/grammar)."""
        # grammar: matcher (runtime/grammar) once compiled; the pending compile before that;
        # ``jumped`` marks a jump-forward this step (the request goes back to the queue).
        self.grammar: Any = None
        self.grammar_pending: Any = None
        self.jumped = False
        # grammar: a jump-forward while decoding appended tokens that have no KV yet; the
        # request stays in the running batch and its next step feeds them from the host
        # (a mixed step: running.py ``mixed_batch``).
        self.pending_forced = False
        # grammar: trailing output tokens appended by jump-forward whose logprobs are still
        # owed; the next extend recomputes the rows that score them (output.py records them).
        self.forced_logprobs_owed = 0
        # grammar: after a jump-forward that replaced the last token, the KV positions still
        # valid (an overlapped step may have computed the replaced token's); 0: all valid.
        # The next release trims to it.
        self.jump_kv_valid = 0
        # grammar: budget tracking of the forced completion (grammar/forcing/completion.py).
        self.completion: Any = None
        # grammar: output positions of tokens the grammar appended without sampling them
        # (jump-forward, forced completion, a stop token it alone allowed), in order.
        self.forced_positions: list[int] = []

    def _init_logprobs(self) -> None:
        """Logprob accumulators; "sent" counters mark what already went to the main process."""
        self.input_token_logprobs: list | None = None
        self.input_top_logprobs: list | None = None
        self.input_logprobs_done = self.logprob_start_len < 0
        self.output_token_logprobs: list = []
        self.output_top_logprobs: list = []
        self.sent_ids = 0
        self.sent_logprobs = 0
        self.input_logprobs_sent = False

    def _init_features(self) -> None:
        """Per-request state of speculation, images, the hierarchical cache and PD."""
        # spec: verify steps this request took part in, draft tokens it accepted (meta_info
        # ``spec_verify_ct`` / ``spec_accepted_tokens``), its acceptance backoff
        # (speculative/stats.py Backoff; None until it drafts).
        # None on an engine without speculation (no meta_info keys then).
        self.spec_verify_ct: int | None = None
        self.spec_accepted_tokens = 0
        self.spec_backoff: Any = None
        # mm: the request's images (runtime/multimodal/inputs.MmData); None: text only.
        self.mm: Any = None
        # hicache: tokens loaded back from the host / storage tier for this request (until its
        # first admission) and, from then, its cached prefix split by tier (meta_info).
        self.hicache_loaded = [0, 0]
        self.host_hit_len = 0  # hicache: the last match's host-resident tokens (memory.match)
        self.cached_tokens_details: dict[str, int] | None = None
        # pd: the request's disaggregation bootstrap (disaggregation/bootstrap.py): on a prefill
        # server its KV goes to the decode server after the first token; on a decode server it
        # arrives from the prefill server (None once it has, or without disaggregation).
        self.pd_bootstrap: Any = None

    # -- derived values -------------------------------------------------------------------
    @property
    def all_ids(self) -> list[int]:
        return self.origin_input_ids + self.output_ids

    def prefix_ids(self, n: int) -> list[int]:
        """``all_ids[:n]``, without building ``all_ids`` when the prompt covers it."""
        prompt = self.origin_input_ids
        if n <= len(prompt):
            return prompt[:n]
        return prompt + self.output_ids[: n - len(prompt)]

    @property
    def prompt_len(self) -> int:
        return len(self.origin_input_ids)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def max_new_tokens(self) -> int:
        return self.sampling_params.max_new_tokens

    @property
    def remaining_tokens(self) -> int:
        return max(self.max_new_tokens - len(self.output_ids), 0)

    @property
    def needs_prompt_logprobs(self) -> bool:
        return not self.input_logprobs_done

    @property
    def prefix_len(self) -> int:
        return int(self.prefix_indices.numel())

    @property
    def max_prefix_len(self) -> int:
        """Longest cached prefix usable: at least one token must run to produce logits, and
        prompt logprobs need every row from ``logprob_start_len - 1`` recomputed."""
        limit = self.seq_len - 1
        if self.needs_prompt_logprobs:
            limit = min(limit, max(self.logprob_start_len - 1, 0))
        if self.forced_logprobs_owed:  # grammar: the row scoring the first forced token
            limit = min(limit, self.seq_len - self.forced_logprobs_owed - 1)
        return max(limit, 0)

    @property
    def is_prefill_only(self) -> bool:
        return self.max_new_tokens == 0

    def reset_kv_state(self) -> None:
        """Forget KV ownership (after release into the cache), e.g. on retraction."""
        self.epoch += 1
        self.req_pool_idx = None
        self.prefix_indices = _EMPTY
        self.last_node = None
        self.kv_len = 0
        self.extend_len = 0
        self.extend_slots = _EMPTY
        self.pending_forced = False

    def __repr__(self) -> str:
        return (f"Req({self.rid!r}, state={self.state.value}, prompt={self.prompt_len}, "
                f"out={len(self.output_ids)}, kv={self.kv_len}, prefix={self.prefix_len})")
