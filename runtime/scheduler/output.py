"""What the scheduler reports per request: logprob entries (prompt and output) recorded from a
step's logits, and the ``ReqOut`` carrying only what is new since the last step."""
from __future__ import annotations

import torch

from ..ipc import messages as m
from .batch import ExtendLayout
from .req import Req
from .sample_step import token_logprobs


def record_prompt_logprobs(reqs: list[Req], layout: ExtendLayout, logits: torch.Tensor) -> None:
    """Row ``i`` of a request's logits run scores prompt token ``first_pos + i + 1``."""
    for i, req in enumerate(reqs):
        if not req.needs_prompt_logprobs:
            continue
        if req.input_token_logprobs is None:
            first = req.logprob_start_len == 0  # the first prompt token has no logprob
            req.input_token_logprobs = [(None, req.origin_input_ids[0])] if first else []
            req.input_top_logprobs = [None] if first else []
        f, start = layout.first_pos[i], layout.logit_start[i]
        n_valid = max(min(f + layout.logit_count[i], req.prompt_len - 1) - f, 0)
        if n_valid:
            targets = torch.tensor(req.origin_input_ids[f + 1: f + 1 + n_valid],
                                   device=logits.device)
            picked, tops = token_logprobs(logits[start:start + n_valid], targets,
                                          req.top_logprobs_num)
            req.input_token_logprobs.extend(zip(picked, targets.tolist()))
            req.input_top_logprobs.extend(tops if tops else [[] for _ in picked])
        if req.kv_len >= req.prompt_len:
            req.input_logprobs_done = True


def record_forced_logprobs(reqs: list[Req], layout: ExtendLayout, logits: torch.Tensor) -> None:
    """grammar: logprobs of jump-forward tokens. Row ``r`` of a request's run scores the token at
    position ``first_pos + r + 1``; the owed tokens are the last ``forced_logprobs_owed``."""
    for i, req in enumerate(reqs):
        if not req.forced_logprobs_owed:
            continue
        f, start = layout.first_pos[i], layout.logit_start[i]
        lo = req.seq_len - req.forced_logprobs_owed - f - 1  # the row scoring the first owed
        hi = min(layout.logit_count[i], req.seq_len - f - 1)  # rows scoring tokens we hold
        # NOTE: lo < 0 cannot happen (max_prefix_len keeps that row out of the cached prefix);
        # hi <= lo is a prefill chunk that ends before the forced tokens.
        if lo < 0 or hi <= lo:
            continue
        ids = req.all_ids
        targets = torch.tensor(ids[f + lo + 1:f + hi + 1], device=logits.device)
        picked, tops = token_logprobs(logits[start + lo:start + hi], targets,
                                      req.top_logprobs_num)
        req.output_token_logprobs.extend(zip(picked, targets.tolist()))
        req.output_top_logprobs.extend(tops if tops else [[] for _ in picked])
        req.forced_logprobs_owed -= hi - lo


def record_output_logprobs(reqs: list[Req], logits: torch.Tensor, next_ids: list[int]) -> None:
    """Logprob (and top-k) of each sampled token, for the requests that asked."""
    lp_idx = [i for i, r in enumerate(reqs) if r.return_logprob]
    if not lp_idx:
        return
    rows = torch.tensor(lp_idx, device=logits.device)
    targets = torch.tensor([next_ids[i] for i in lp_idx], device=logits.device)
    top_k = max(reqs[i].top_logprobs_num for i in lp_idx)
    picked, tops = token_logprobs(logits.index_select(0, rows), targets, top_k)
    for j, i in enumerate(lp_idx):
        reqs[i].output_token_logprobs.append((picked[j], next_ids[i]))
        k = reqs[i].top_logprobs_num
        reqs[i].output_top_logprobs.append(tops[j][:k] if tops and k else [])


def make_out(req: Req) -> m.ReqOut:
    """New ids and logprob entries since the last report (prompt logprobs once, when done)."""
    out = m.ReqOut(req.rid, req.output_ids[req.sent_ids:], req.finish_reason,
                   prompt_tokens=req.prompt_len, cached_tokens=req.cached_tokens,
                   cached_tokens_details=req.cached_tokens_details)  # hicache
    if req.forced_positions and req.forced_positions[-1] >= req.sent_ids:
        out.forced_positions = [p for p in req.forced_positions if p >= req.sent_ids]
    req.sent_ids = len(req.output_ids)
    if req.spec_verify_ct is not None:  # spec
        out.spec_verify_ct, out.spec_accepted_tokens = req.spec_verify_ct, req.spec_accepted_tokens
    if req.return_logprob:
        if req.input_logprobs_done and not req.input_logprobs_sent and req.logprob_start_len >= 0:
            out.input_token_logprobs = list(req.input_token_logprobs or [])
            out.input_top_logprobs = list(req.input_top_logprobs or [])
            req.input_logprobs_sent = True
        out.output_token_logprobs = req.output_token_logprobs[req.sent_logprobs:]
        out.output_top_logprobs = req.output_top_logprobs[req.sent_logprobs:]
        req.sent_logprobs = len(req.output_token_logprobs)
    return out
