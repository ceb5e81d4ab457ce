"""A stand-in for ``torch.cuda``'s streams and events (``KVTransfer(..., api=FakeCuda())``), so
the hierarchical cache's CUDA path runs over CPU pools in the scheduler tests: the copies run
at once (CPU tensors), an event fires once the test says the device moved on (``advance``),
and every host wait (``Event.synchronize``, ``Stream.synchronize``) is counted: on a GPU each
one would hold the scheduler thread until the device got there."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


class FakeCuda:
    def __init__(self) -> None:
        self.now = 0  # the device's progress: events recorded before it have fired
        self.host_waits = 0
        self.device_waits = 0
        self._main = _Stream(self)

    def advance(self) -> None:
        """The device finished everything queued so far (e.g. between scheduler steps)."""
        self.now += 1

    def Stream(self, device: Any = None) -> "_Stream":  # noqa: N802 - torch.cuda's name
        return _Stream(self)

    def Event(self, enable_timing: bool = False) -> "_Event":  # noqa: N802
        return _Event(self)

    def current_stream(self, device: Any = None) -> "_Stream":
        return self._main

    @contextlib.contextmanager
    def stream(self, stream: "_Stream") -> Iterator[None]:
        yield


class _Stream:
    def __init__(self, api: FakeCuda) -> None:
        self.api = api

    def wait_stream(self, other: "_Stream") -> None:
        self.api.device_waits += 1

    def wait_event(self, event: "_Event") -> None:
        self.api.device_waits += 1

    def synchronize(self) -> None:
        self.api.host_waits += 1


class _Event:
    def __init__(self, api: FakeCuda) -> None:
        self.api = api
        self.at = api.now

    def record(self, stream: Any = None) -> None:
        self.at = self.api.now

    def query(self) -> bool:
        return self.api.now > self.at

    def synchronize(self) -> None:
        self.api.host_waits += 1

    def elapsed_time(self, end: "_Event") -> float:
        return 0.0
