"""``AcceptWindow`` (runtime/server/intake.py): connections of a burst of accepts hold the
Engine's hand-off until heard from (first bytes or close), and no longer than ``EXPECT_S``
after the burst's last accept; an expired connection never holds again. A stub engine counts
the holds; sleeps only wait past a deadline (no upper bound on time is asserted)."""
from __future__ import annotations

import asyncio

from sgdsl.runtime.server.intake import EXPECT_S, AcceptWindow


class _Engine:
    def __init__(self) -> None:
        self.holds = 0

    def hold_handoff(self):
        self.holds += 1
        done = []

        def release() -> None:
            assert not done, "released twice"
            done.append(True)
            self.holds -= 1
        return release


def test_connections_hold_until_heard_from_or_expired():
    engine = _Engine()

    async def main() -> list[int]:
        window = AcceptWindow(engine, asyncio.get_running_loop())
        seen = []
        for key in range(3):
            window.accepted(key)
        seen.append(engine.holds)  # three silent connections
        window.heard(1)
        window.heard(1)  # its bytes again: nothing more to release
        seen.append(engine.holds)
        await asyncio.sleep(EXPECT_S * 3)  # past the window: the silent two expire
        seen.append(engine.holds)
        window.heard(0)  # heard after expiry: nothing held
        window.accepted(7)  # a new burst: only its own connection holds
        seen.append(engine.holds)
        window.heard(7)
        seen.append(engine.holds)
        return seen
    assert asyncio.run(main()) == [3, 2, 0, 1, 0]
