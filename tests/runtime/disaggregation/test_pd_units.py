"""Units of disaggregation without servers: the router's PD flags, the bootstrap middleware's
body rewrite and the pairing keys, the engine options, and the KV pages round trip on a
two-rank gloo group in two threads of this process."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.disaggregation.bootstrap import close_scope, next_bootstrap, open_scope
from sgdsl.runtime.disaggregation.http import _split
from sgdsl.runtime.disaggregation.shards import head_range, sources
from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.router.cli import parse_args
from processes import free_port


def test_router_pd_flags_as_sglang_spells_them():
    c = parse_args(["--pd-disaggregation", "--prefill", "http://127.0.0.1:1", "9001",
                    "--prefill", "http://127.0.0.1:2", "--decode", "http://127.0.0.1:3",
                    "--decode", "http://127.0.0.1:4/"])
    assert c.prefill_urls == ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert c.prefill_bootstrap_ports == (9001, 8998)  # SGLang's default bootstrap port
    assert c.decode_urls == ("http://127.0.0.1:3", "http://127.0.0.1:4")
    assert c.worker_urls == c.prefill_urls + c.decode_urls


@pytest.mark.parametrize("argv, field", [
    (["--pd-disaggregation", "--prefill", "http://h:1"], "prefill_urls"),
    (["--prefill", "http://h:1", "--decode", "http://h:2"], "pd_disaggregation"),
    (["--pd-disaggregation", "--prefill", "http://h:1", "x", "--decode", "http://h:2"],
     "prefill_bootstrap_ports"),
    (["--pd-disaggregation", "--prefill", "http://h:1", "--decode", "http://h:1"],
     "decode_urls"),
])
def test_router_pd_flags_errors_name_the_field(argv, field):
    with pytest.raises(InvalidRequestError) as info:
        parse_args(argv)
    assert info.value.field == field


def test_engine_options_and_their_checks():
    c = EngineConfig(disaggregation_mode="prefill", disaggregation_bootstrap_port=9000)
    assert c.disaggregation_transfer_backend == "auto"
    assert EngineConfig(disaggregation_mode="prefill", tp_size=2).tp_size == 2  # tp: both sides
    assert EngineConfig(disaggregation_mode="decode", tp_size=2).tp_size == 2


@pytest.mark.parametrize("size,heads,want", [
    (1, 8, [(0, 8)]), (2, 8, [(0, 4), (4, 8)]), (4, 2, [(0, 1), (0, 1), (1, 2), (1, 2)])])
def test_head_range_follows_the_tp_split_of_kv_heads(size, heads, want):
    assert [head_range(r, size, heads) for r in range(size)] == want


@pytest.mark.parametrize("heads,prefill,kv,want", [
    ((0, 8), 1, 8, [(0, 0, 8)]),  # no TP on either side: one source, every head
    ((0, 8), 2, 8, [(0, 0, 4), (1, 4, 8)]),  # prefill TP=2 -> decode TP=1
    ((4, 8), 2, 8, [(1, 4, 8)]),  # TP=2 -> TP=2: each rank from its twin
    ((0, 4), 4, 8, [(0, 0, 2), (1, 2, 4)]),  # TP=4 -> TP=2
    ((2, 3), 2, 8, [(0, 2, 3)]),  # TP=2 -> TP=8: a slice of one prefill rank's heads
    ((0, 2), 4, 2, [(0, 0, 1), (2, 1, 2)])])  # replicated heads: the first holder sends
def test_sources_reshard_by_heads(heads, prefill, kv, want):
    assert sources(heads, prefill, kv) == want


def test_middleware_takes_the_bootstrap_out_of_the_body():
    body = json.dumps({"text": "hi", "bootstrap_host": "10.0.0.1", "bootstrap_port": 8998,
                       "bootstrap_room": 42}).encode()
    payload, fields = _split(body)
    assert payload == {"text": "hi"} and fields == ("10.0.0.1", 8998, 42)
    assert _split(b'{"text": "hi"}')[1] is None  # colocated request
    assert _split(b"not json") == (None, None)


def test_keys_pair_the_requests_of_one_body_in_order():
    assert next_bootstrap() is None
    token = open_scope("h", 1, 7)
    try:
        keys = [next_bootstrap().key for _ in range(3)]
    finally:
        close_scope(token)
    assert keys == ["7.0", "7.1", "7.2"] and next_bootstrap() is None


class _Pool:
    """The page interface of TokenKVPool on small tensors."""

    def __init__(self, layers: int, slots: int, heads: int = 2) -> None:
        from sgdsl.runtime.cache.pool import TokenKVPool

        self.inner = TokenKVPool(slots, layers, heads, 4, torch.float32, "cpu")

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("heads,dst_slots", [
    (None, [20, 1, 2, 30]),  # scattered: staged, then copied into the slots
    (None, [5, 6, 7, 8]),  # one run: received in place
    ((1, 2), [20, 1, 2, 30])])  # (1, 2): a TP decode rank's share of the kv heads
def test_pages_travel_layer_by_layer_over_gloo(heads, dst_slots):
    from sgdsl.runtime.disaggregation.link import (connect_store, make_group, recv_pages,
                                                   send_pages, serve_store)

    port = free_port()
    # more layers than the window in flight
    src, dst = _Pool(6, 32), _Pool(6, 32, 2 if heads is None else heads[1] - heads[0])
    for layer in range(6):
        src.k_buffer[layer].normal_()
        src.v_buffer[layer].normal_()
    src_slots, dst_slots = torch.tensor([3, 9, 4, 17]), torch.tensor(dst_slots)
    master = serve_store(port, 30)
    groups = {}

    def join(rank: int) -> None:
        store = connect_store("127.0.0.1", port, 30)
        groups[rank] = make_group(store, "t", rank, "gloo", "127.0.0.1", 30)

    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    sender = threading.Thread(target=send_pages, args=(groups[0], src, src_slots, 1, True, heads))
    sender.start()
    recv_pages([(groups[1], (0, dst.k_buffer[0].shape[1]))], dst, dst_slots, 4, True)
    sender.join(60)
    h = slice(*(heads or (0, 2)))
    others = torch.ones(33, dtype=torch.bool)
    others[dst_slots] = False
    for layer in range(6):
        assert torch.equal(dst.k_buffer[layer][dst_slots], src.k_buffer[layer][src_slots][:, h])
        assert torch.equal(dst.v_buffer[layer][dst_slots], src.v_buffer[layer][src_slots][:, h])
        assert not dst.k_buffer[layer][others].any() and not dst.v_buffer[layer][others].any()
    del master


@pytest.mark.parametrize("dst_slots", [[20, 1, 2, 30], [5, 6, 7, 8]])
def test_pages_of_two_prefill_ranks_land_in_their_heads(dst_slots):
    """Prefill TP=2 -> decode TP=1: each prefill rank's pool holds one of the two kv heads
    and sends it on its own group; the decode pool receives both, each into its heads."""
    from sgdsl.runtime.disaggregation.link import (connect_store, make_group, recv_pages,
                                                   send_pages, serve_store)

    port = free_port()
    srcs, dst = [_Pool(6, 32, 1), _Pool(6, 32, 1)], _Pool(6, 32, 2)
    for src in srcs:
        for layer in range(6):
            src.k_buffer[layer].normal_()
            src.v_buffer[layer].normal_()
    src_slots, dst_slots = torch.tensor([3, 9, 4, 17]), torch.tensor(dst_slots)
    master = serve_store(port, 30)
    groups = {}

    def join(src: int, rank: int) -> None:
        store = connect_store("127.0.0.1", port, 30)
        groups[src, rank] = make_group(store, f"t/{src}", rank, "gloo", "127.0.0.1", 30)

    threads = [threading.Thread(target=join, args=(s, r)) for s in (0, 1) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    senders = [threading.Thread(target=send_pages, args=(groups[s, 0], srcs[s], src_slots, 1,
                                                         True)) for s in (0, 1)]
    [t.start() for t in senders]
    assert not recv_pages([(groups[0, 1], (0, 1)), (groups[1, 1], (1, 2))], dst, dst_slots, 4,
                          True)  # staged: a head slice of a row is not contiguous
    [t.join(60) for t in senders]
    for layer in range(6):
        for s, src in enumerate(srcs):
            for got, sent in ((dst.k_buffer, src.k_buffer), (dst.v_buffer, src.v_buffer)):
                assert torch.equal(got[layer][dst_slots, s], sent[layer][src_slots, 0])
    del master
