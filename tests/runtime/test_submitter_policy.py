"""When ``Submitter`` hands a group off (runtime/submitter.py), with the loop turns told exactly:
a stub ``start`` records each hand-off, submissions are made from callbacks chained turn by
turn (as a server's handlers run a turn after the poll that read their requests). No engine,
no timing: every assertion counts turns and hand-offs."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from sgdsl.runtime.submitter import MAX_DEFERRALS, HandoffLimits, Submitter


@dataclass(frozen=True)
class _Req:
    input_ids: list[int]


@dataclass(frozen=True)
class _Spec:
    rid: str
    reqs: tuple[_Req, ...]


class _Box:
    """A Mailbox stand-in: outcomes land at once."""

    def put(self, slot: Any, outcome: Any) -> None:
        slot.put_nowait(outcome)


def _spec(name: str, tokens: int = 4) -> _Spec:
    return _Spec(name, (_Req([1] * tokens),))


def _run(plan: Callable[[Submitter, list, list[int]], None], limits: HandoffLimits | None = None,
         turns: int = 40) -> tuple[list[list[str]], list[int]]:
    """Runs ``plan(submitter, futures, turn)`` once per loop turn for ``turns`` turns; returns
    the hand-offs (rids per group) and the turn at which each happened."""
    groups: list[list[str]] = []
    at: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        turn = [0]

        def start(specs: list[_Spec], settle: Callable[[int, Any], None]) -> None:
            groups.append([s.rid for s in specs])
            at.append(turn[0])
            for i, spec in enumerate(specs):
                settle(i, spec.rid)
        sub = Submitter(loop, loop, start, _Box(), limits)  # type: ignore[arg-type]
        futures: list[asyncio.Future] = []

        def tick() -> None:
            plan(sub, futures, turn[0])
            turn[0] += 1
            if turn[0] < turns:
                loop.call_soon(tick)
        loop.call_soon(tick)
        while turn[0] < turns:
            await asyncio.sleep(0)
        assert [f.result() for f in futures] == [rid for g in groups for rid in g]
    asyncio.run(main())
    return groups, at


def _submit_at(schedule: dict[int, int]) -> Callable[[Submitter, list, int], None]:
    """At turn t, submit schedule[t] requests named t.i."""
    def plan(sub: Submitter, futures: list, turn: int) -> None:
        for i in range(schedule.get(turn, 0)):
            futures.append(sub.submit(_spec(f"{turn}.{i}")))
    return plan


def test_a_lone_request_goes_within_two_turns():
    """Handed off at the second turn after its submission (``start`` runs one turn later on
    the engine loop, here the same loop): one turn more than a hand-off at the next turn."""
    groups, at = _run(_submit_at({0: 1}))
    assert groups == [["0.0"]] and at == [3]


def test_a_burst_read_over_consecutive_turns_is_one_handoff():
    """The first request does not go alone while the loop keeps taking requests in (it went
    alone, then one group per turn, before)."""
    groups, _ = _run(_submit_at({0: 1, 1: 7, 2: 20, 3: 4}))
    assert [len(g) for g in groups] == [32]


def test_a_turn_without_submissions_ends_the_group():
    groups, _ = _run(_submit_at({0: 3, 4: 2}))
    assert [len(g) for g in groups] == [3, 2]


def test_a_stream_that_never_pauses_still_goes_every_few_turns():
    groups, at = _run(_submit_at({t: 1 for t in range(30)}))
    assert sum(map(len, groups)) == 30 and len(groups) >= 30 // (MAX_DEFERRALS + 2)
    for group, turn in zip(groups, at):  # nobody waits more than the bound
        assert all(turn - int(rid.split(".")[0]) <= MAX_DEFERRALS + 2 for rid in group)


def test_a_group_as_large_as_a_prefill_batch_goes_at_once():
    """No look for more: at the next turn (``start`` one turn later)."""
    groups, at = _run(_submit_at({0: 3, 1: 3}), HandoffLimits(tokens=12, requests=100))
    assert [len(g) for g in groups] == [3, 3] and at == [2, 3]
    groups, at = _run(_submit_at({0: 5}), HandoffLimits(tokens=10**6, requests=5))
    assert [len(g) for g in groups] == [5] and at == [2]


def test_eager_a_full_group_goes_from_the_submission_that_fills_it():
    """With an accelerator (``eager``): no wait for the turn's other handlers either; a poll's
    worth of a burst (all submitted in one turn) goes one prefill batch's worth at a time as it
    is submitted, so the scheduler starts while the rest is parsed; the remainder goes as a
    burst's group does (issue 29 item 1: the whole turn went after its last handler)."""
    groups, at = _run(_submit_at({0: 3, 1: 3}), HandoffLimits(12, 100, eager=True))
    assert [len(g) for g in groups] == [3, 3] and at == [1, 2]
    groups, at = _run(_submit_at({0: 8}), HandoffLimits(12, 100, eager=True))
    assert [len(g) for g in groups] == [3, 3, 2] and at[:2] == [1, 1] and at[2] > 1
    groups, _ = _run(_submit_at({0: 8}), HandoffLimits(12, 100))  # not eager: one group
    assert [len(g) for g in groups] == [8]


def test_a_hold_keeps_the_handoff_until_released():
    """Requests whose prompts are being encoded (holding) and those already waiting go
    together: nothing is handed off while held, however many turns pass."""
    release: list[Callable[[], None]] = []

    def plan(sub: Submitter, futures: list, turn: int) -> None:
        if turn == 0:
            futures.append(sub.submit(_spec("0.0")))
            release.append(sub.hold())
        if turn == 15:
            futures.append(sub.submit(_spec("15.0")))
            release[0]()
            release[0]()  # a second call is a no-op
    groups, at = _run(plan)
    assert groups == [["0.0", "15.0"]] and at == [18]


def test_a_cancelled_request_is_not_sent():
    def plan(sub: Submitter, futures: list, turn: int) -> None:
        if turn == 0:
            gone = sub.submit(_spec("gone"))
            gone.cancel()
            futures.append(sub.submit(_spec("kept")))
    groups, _ = _run(plan)
    assert groups == [["kept"]]


def test_the_engine_hands_off_eagerly_only_with_an_accelerator():
    """A CPU device's forwards share the cores that parse a burst: no eager hand-off there."""
    import torch

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.engine import _accelerated

    assert not _accelerated(EngineConfig(device="cpu"))
    assert _accelerated(EngineConfig(device="cuda"))
    assert _accelerated(EngineConfig(device="auto")) == torch.cuda.is_available()
