"""Logits parity of a ModelRunner against a Hugging Face model on one scenario: a batch of
mixed-length prompts in one extend, batched greedy decode steps, an extend on top of a prefix
borrowed from another request (prefix slots reused), and a batch-1 decode on it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .driver import RunnerDriver


@dataclass
class ParityResult:
    max_abs_diff: float
    ours_greedy: list[int]
    hf_greedy: list[int]
    rows_checked: int


def run_parity(runner, hf_model, prompts: list[list[int]], decode_steps: int = 3,
               suffix: list[int] | None = None) -> ParityResult:
    """Run the scenario; every logits row we produce is compared with HF's logits at the same
    position of the same full sequence (computed without any cache)."""
    d = RunnerDriver(runner)
    reqs = [d.new_request() for _ in prompts]
    checks: list[tuple[object, int, torch.Tensor]] = []  # (request, position, our logits)
    logits = d.extend(list(zip(reqs, prompts)))
    checks += [(r, len(r.tokens) - 1, row) for r, row in zip(reqs, logits)]
    for _ in range(decode_steps):
        logits = d.decode(list(zip(reqs, logits.argmax(-1).tolist())))
        checks += [(r, len(r.tokens) - 1, row) for r, row in zip(reqs, logits)]
    # Prefix reuse: borrow all but the last 2 prompt tokens of request 0; ask for every row.
    keep = len(prompts[0]) - 2
    shared = d.new_request(prefix_from=reqs[0], prefix_len=keep)
    suffix = suffix or prompts[-1][:4]
    logits = d.extend([(shared, suffix)], logits_indices=list(range(len(suffix))))
    checks += [(shared, keep + i, row) for i, row in enumerate(logits)]
    logits = d.decode([(shared, int(logits[-1].argmax()))])
    checks.append((shared, len(shared.tokens) - 1, logits[0]))
    result = _compare(hf_model, checks)
    for r in reqs:
        d.release(r)
    d.release(shared, keep_prefix=keep)
    return result


@torch.no_grad()
def _compare(hf_model, checks) -> ParityResult:
    ref_cache: dict[int, torch.Tensor] = {}
    diff, ours, theirs = 0.0, [], []
    for req, pos, row in checks:
        if id(req) not in ref_cache:
            ids = torch.tensor([req.tokens], dtype=torch.int64)
            ref_cache[id(req)] = hf_model(ids).logits[0].float()
        ref = ref_cache[id(req)][pos]
        diff = max(diff, float((row.float().cpu() - ref).abs().max()))
        ours.append(int(row.argmax()))
        theirs.append(int(ref.argmax()))
    return ParityResult(diff, ours, theirs, len(checks))
