"""Radix text tree, circuit breaker, config validation and the router's CLI."""
from __future__ import annotations

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.router.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from sgdsl.runtime.router.cli import parse_args
from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.router.policies.text_tree import TextTree
from sgdsl.runtime.router.request_text import routing_text


def test_text_tree_matches_shared_prefixes():
    t = TextTree(max_chars=10_000)
    t.insert("hello world")
    t.insert("hello there")
    assert t.match("hello world!") == 11
    assert t.match("hello thx") == 8
    assert t.match("help") == 3
    assert t.match("") == 0 and t.match("xyz") == 0
    assert t.size == len("hello world") + len("there")


def test_text_tree_evicts_least_recently_used_leaves():
    t = TextTree(max_chars=100)
    t.insert("a" * 40)
    t.insert("b" * 40)
    t.insert("a" * 40 + "!")  # touches the a-branch again
    t.insert("c" * 40)  # over the bound: the b-branch is the oldest leaf
    assert t.size <= 100
    assert t.match("b" * 40) == 0
    assert t.match("a" * 40) == 40 and t.match("c" * 40) == 40


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_half_opens_and_closes():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=3, success_threshold=2, cooldown_s=10, clock=clock)
    b.on_failure(); b.on_failure(); b.on_success(); b.on_failure(); b.on_failure()
    assert b.state == CLOSED  # a success resets the count of consecutive failures
    b.on_failure()
    assert b.state == OPEN and not b.allows()
    clock.now = 10.0
    assert b.allows() and b.state == HALF_OPEN
    b.on_attempt()
    assert not b.allows()  # one trial at a time
    b.on_success()
    assert b.allows() and b.state == HALF_OPEN
    b.on_attempt(); b.on_success()
    assert b.state == CLOSED


def test_breaker_trial_slot_is_freed_when_a_trial_ends_unjudged():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, success_threshold=1, cooldown_s=1, clock=clock)
    b.on_failure()
    clock.now = 1.0
    assert b.allows()
    b.on_attempt()
    assert not b.allows()
    b.release()  # e.g. the client of the trial request went away
    assert b.allows() and b.state == HALF_OPEN


def test_breaker_reopens_on_a_failed_trial():
    clock = Clock()
    b = CircuitBreaker(failure_threshold=1, success_threshold=1, cooldown_s=5, clock=clock)
    b.on_failure()
    clock.now = 5.0
    assert b.allows()
    b.on_attempt(); b.on_failure()
    assert b.state == OPEN and not b.allows() and b.times_opened == 2


@pytest.mark.parametrize("kwargs, field", [
    ({"policy": "fastest"}, "policy"),
    ({"worker_urls": ("ftp://h:1",)}, "worker_urls"),
    ({"worker_urls": ("http://h:1/v1",)}, "worker_urls"),
    ({"worker_urls": ("http://h:1", "http://h:1/")}, "worker_urls"),
    ({"worker_urls": ("not a url",)}, "worker_urls"),
    ({"cache_threshold": 1.5}, "cache_threshold"),
    ({"balance_rel_threshold": 0.5}, "balance_rel_threshold"),
    ({"max_retries": -1}, "max_retries"),
    ({"read_timeout_s": 0}, "read_timeout_s"),
    ({"port": 70000}, "port"),
])
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequestError) as info:
        RouterConfig(**kwargs)
    assert info.value.field == field and field in str(info.value)


def test_cli_builds_the_config():
    c = parse_args(["--worker-urls", "http://a:1/", "http://b:2", "--policy", "prefix_hash",
                    "--port", "0", "--cache-threshold", "0.7", "--max-retries", "1",
                    "--api-key", "k"])
    assert c.worker_urls == ("http://a:1", "http://b:2")
    assert (c.policy, c.port, c.cache_threshold, c.max_retries, c.api_key) == (
        "prefix_hash", 0, 0.7, 1, "k")


def test_routing_text_of_each_protocol():
    assert routing_text("/generate", {"text": "hi"}) == "hi"
    assert routing_text("/generate", {"text": ["a", "b"]}) == "a"
    assert routing_text("/generate", {"input_ids": [1, 2]}) == "1 2 "
    assert routing_text("/v1/completions", {"prompt": ["p"]}) == "p"
    chat = {"messages": [{"role": "system", "content": "S"},
                         {"role": "user", "content": [{"type": "text", "text": "U"}]}]}
    assert routing_text("/v1/chat/completions", chat) == "<system>S<user>U"
    assert routing_text("/v1/messages", {"system": "S", "messages": chat["messages"][1:]}) \
        == "S<user>U"
    assert routing_text("/v1/messages", {"messages": "junk"}) == ""


def test_text_tree_common_prefix_length_matches_a_character_walk():
    import random

    from sgdsl.runtime.router.policies.text_tree import _common_len

    rng = random.Random(1)
    for _ in range(5000):
        key = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 16)))
        start = rng.randint(0, 3)
        seg, n = text[start:start + len(key)], 0
        while n < min(len(key), len(seg)) and key[n] == seg[n]:
            n += 1
        assert _common_len(key, text, start) == n
