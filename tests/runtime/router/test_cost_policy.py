"""The cost_aware policy on synthetic loads (fake workers: URL, ledger and load reports only):
least-work balancing without a cache, affinity with balanced totals on shared prefixes, overflow
from a hot worker, and optimistic accounting between stale reports."""
from __future__ import annotations

import random
from collections import Counter, defaultdict, deque

from sgdsl.runtime.router.config import RouterConfig
from sgdsl.runtime.router.ledger import LoadReport, WorkLedger
from sgdsl.runtime.router.policies import make_policy
from sgdsl.runtime.router.request_text import answered_prompt_tokens, output_budget
from sgdsl.runtime.router.worker import Worker

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 5))
WORDS = "alpha beta gamma delta river stone cloud maple orbit quartz signal harbor".split()


def setup(n: int = 2, **kw):
    config = RouterConfig(worker_urls=URLS[:n], policy="cost_aware", chars_per_token=1.0, **kw)
    p = make_policy(config, random.Random(0))
    workers = [Worker(u) for u in config.worker_urls]
    for w in workers:
        p.on_add(w.url)
    return p, workers


def report(worker: Worker, prefill: int = 0, decode: int = 0, kv_total: int = 1 << 20,
           kv_free: int = 1 << 20) -> None:
    """A fresh /load answer for ``worker``, asked for now."""
    epoch = worker.ledger.requested()
    worker.ledger.apply(LoadReport(prefill_tokens=prefill, decode_tokens=decode,
                                   kv_total=kv_total, kv_free=kv_free), epoch)


def route(p, workers, text: str, output: int = 16):
    """Select and send (booked until the caller finishes the ticket)."""
    choice = p.select(workers, text, output)
    return choice, choice.worker.start(choice.prefill, choice.decode)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_without_shared_prefixes_it_balances_like_least_work():
    p, ws = setup(n=3)
    rng = random.Random(1)
    for w, load in zip(ws, (0, 3000, 6000)):
        report(w, prefill=load)
    first = [route(p, ws, f"{i} " + words(rng, 60))[0].worker.url for i in range(5)]
    assert set(first) == {ws[0].url}  # the idle worker takes requests until it catches up
    counts = Counter(route(p, ws, f"x{i} " + words(rng, 60))[0].worker.url for i in range(600))
    totals = [w.ledger.work(1.0) for w in ws]
    assert max(totals) - min(totals) < 600, totals  # within about one request's work
    assert min(counts.values()) > 150


def simulate(p, ws, groups: int, per_group: int, concurrency: int, seed: int = 0):
    """Shared-prefix groups arriving shuffled, at most ``concurrency`` booked (FIFO ends);
    returns the workers each group went to and the work booked per worker."""
    rng = random.Random(seed)
    prompts = []
    for g in range(groups):
        system = f"System {g}: " + words(rng, 300)
        prompts += [(g, f"{system} Question {q}: {words(rng, 10)}") for q in range(per_group)]
    rng.shuffle(prompts)
    inflight, placed, work = deque(), defaultdict(set), Counter()
    for g, text in prompts:
        if len(inflight) >= concurrency:
            w, ticket = inflight.popleft()
            w.finish(ticket)
        choice, ticket = route(p, ws, text, output=64)
        inflight.append((choice.worker, ticket))
        placed[g].add(choice.worker.url)
        work[choice.worker.url] += choice.prefill + choice.decode
    return placed, work


def test_shared_prefixes_with_free_kv_stay_with_their_cache_and_balance():
    p, ws = setup(n=2)
    placed, work = simulate(p, ws, groups=32, per_group=16, concurrency=32)
    copies = sum(len(v) for v in placed.values())
    # round_robin computes each group's prefix on both workers (64 copies); affinity keeps
    # most groups on one while the booked work stays balanced.
    assert copies <= 32 * 1.6, copies
    assert max(work.values()) < 1.15 * min(work.values()), work
    decisions = p.describe()
    assert set(decisions["tree_chars"]) == {w.url for w in ws}


def test_a_hot_worker_overflows_to_the_other_when_the_load_outweighs_the_cache():
    p, ws = setup(n=2)
    system = "You are a helpful assistant. " * 40  # ~1200 characters = tokens here
    report(ws[0]), report(ws[1])
    assert p.select(ws, system + "first", 8).worker is ws[0]  # ties: the first
    report(ws[0], prefill=800)  # busy, but less than the prefix saves: stay
    choice = p.select(ws, system + "second", 8)
    assert choice.worker is ws[0] and choice.reason == "affinity"
    assert choice.prefill < 20  # only the question is uncached
    report(ws[0], prefill=5000)  # hot: recomputing the prefix elsewhere is cheaper
    choice = p.select(ws, system + "third", 8)
    assert choice.worker is ws[1] and choice.reason == "overflow"
    assert choice.prefill > 1000


def test_a_full_kv_makes_a_miss_cost_more():
    p, ws = setup(n=2)
    system = "shared system prompt " * 50  # ~1000 characters
    report(ws[0]), report(ws[1])
    p.select(ws, system + "a", 8)  # cached on ws[0]
    report(ws[0], prefill=1500, kv_total=1 << 20, kv_free=1 << 20)
    assert p.select(ws, system + "b", 8).worker is ws[1]  # 1500 > the ~1000 saved
    p.trees[ws[1].url].evict(0)  # forget the copy: only ws[0] has the prefix again
    # Same load, but ws[1]'s KV is full: a miss there also evicts; the cache is kept.
    report(ws[1], kv_total=100_000, kv_free=0)
    assert p.select(ws, system + "c", 8).worker is ws[0]


def test_affinity_holds_while_the_imbalance_is_within_the_band():
    p, ws = setup(n=2, work_slack=0.5)
    system = "a long shared system prompt " * 40  # ~1100 characters = tokens here
    report(ws[0]), report(ws[1])
    assert p.select(ws, system + "first", 8).worker is ws[0]
    # Both KVs full (as on a KV-limited pair): ws[0] has more queued work than ws[1] by more
    # than the prefill it would save there (the old ``miss + work`` rule moved the group),
    # but less than the band (half the mean work, doubled by ws[1]'s pressure): it stays.
    report(ws[0], prefill=4000, kv_total=50_000, kv_free=0)
    report(ws[1], prefill=1500, kv_total=50_000, kv_free=0)
    choice = p.select(ws, system + "second", 8)
    assert choice.worker is ws[0] and choice.reason == "affinity"
    # With free KV on ws[1] the band is half as wide: the same imbalance now overflows.
    report(ws[1], prefill=1500, kv_total=50_000, kv_free=50_000)
    p.trees[ws[1].url].evict(0)
    assert p.select(ws, system + "third", 8).worker is ws[1]
    # A worker about to run dry takes the request whatever the cache (no band is left).
    p.trees[ws[1].url].evict(0)
    report(ws[0], prefill=4000, kv_total=50_000, kv_free=0)
    report(ws[1], prefill=0, kv_total=50_000, kv_free=0)
    assert p.select(ws, system + "fourth", 8).worker is ws[1]


def test_a_full_batch_is_not_running_dry_however_little_work_it_shows():
    """The default band (twice the mean work): a worker whose batch is full but near its end
    (little decode left in its ledger) does not take a group from its cache; once few of the
    requests in flight are on it, it is running dry and gets only twice its own work of band."""
    p, ws = setup(n=2)
    system = "a long shared system prompt " * 40
    report(ws[0]), report(ws[1])
    assert p.select(ws, system + "first", 8).worker is ws[0]
    for _ in range(40):  # 40 requests in flight on each
        ws[0].start(), ws[1].start()
    report(ws[0], prefill=6000, decode=4000)  # a prefill queue behind its batch
    report(ws[1], decode=300)  # its 40 requests are nearly done: the client refills them
    choice = p.select(ws, system + "second", 8)
    assert choice.worker is ws[0] and choice.reason == "affinity"
    for _ in range(30):  # now 10 in flight on ws[1] vs 40 on ws[0]: at most half the mean
        ws[1].finish(0)
    choice = p.select(ws, system + "third", 8)
    assert choice.worker is ws[1] and choice.reason == "overflow"


def test_the_rule_before_judged_a_full_batch_by_its_tokens():
    """``dry_fraction`` large + ``work_slack`` 0.5: every worker counts as running dry, the band is
    at most twice the lightest worker's work, as before 2026-11-28: the nearly done full batch
    takes the group's request from its cache (the overflow that copied groups on fits/dp4)."""
    p, ws = setup(n=2, work_slack=0.5, dry_fraction=1e9)
    system = "a long shared system prompt " * 40
    report(ws[0]), report(ws[1])
    assert p.select(ws, system + "first", 8).worker is ws[0]
    for _ in range(40):
        ws[0].start(), ws[1].start()
    report(ws[0], prefill=6000, decode=4000)
    report(ws[1], decode=300)
    choice = p.select(ws, system + "second", 8)
    assert choice.worker is ws[1] and choice.reason == "overflow"


def test_new_prefixes_go_to_the_least_work_despite_chance_matches():
    p, ws = setup(n=2)
    report(ws[0], prefill=300), report(ws[1], prefill=900)
    p.tree(ws[1].url).insert("Q" + "z" * 50)  # shares 10 characters with the next prompt
    choice = p.select(ws, "Q" + "z" * 9 + "y" * 400, 8)
    assert choice.worker is ws[0] and choice.reason == "least_work"


def test_stale_reports_are_corrected_by_optimistic_bookings():
    p, ws = setup(n=2)
    rng = random.Random(2)
    report(ws[0]), report(ws[1])  # both idle, and no new report during the burst
    burst = [route(p, ws, words(rng, 50) + str(i), output=100)[0].worker for i in range(10)]
    assert Counter(w.url for w in burst) == {ws[0].url: 5, ws[1].url: 5}
    # A report asked for after the burst includes it: the bookings stop counting twice.
    report(ws[0], prefill=0, decode=500), report(ws[1], prefill=0, decode=500)
    assert ws[0].ledger.work(1.0) == ws[1].ledger.work(1.0) == 500


def test_ledger_counts_bookings_made_after_the_report_was_asked_for():
    ledger = WorkLedger()
    early = ledger.book(100, 10)
    assert ledger.work(2.0) == 120  # no report yet: bookings alone
    epoch = ledger.requested()
    late = ledger.book(50, 0)
    ledger.apply(LoadReport(prefill_tokens=1000, decode_tokens=100), epoch)
    assert ledger.work(1.0) == 1000 + 100 + 50  # ``early`` is in the report already
    ledger.apply(LoadReport(prefill_tokens=1), epoch - 1)  # an older answer is dropped
    assert ledger.report.prefill_tokens == 1000
    ledger.release(late), ledger.release(early)
    assert ledger.work(1.0) == 1100 and not ledger.bookings


def test_chars_per_token_is_learned_from_answers():
    p, ws = setup(n=2)
    assert p.chars_per_token == 1.0
    for _ in range(3000):
        p.observe(600, 100)  # 6 characters per token
    assert 5.5 < p.chars_per_token <= 6.0
    assert p.describe()["chars_per_token"] == round(p.chars_per_token, 3)


def test_output_budget_and_answered_prompt_tokens():
    assert output_budget("/generate", {"sampling_params": {"max_new_tokens": 77}}) == 77
    assert output_budget("/generate", {"sampling_params": [{"max_new_tokens": 5}]}) == 5
    assert output_budget("/v1/chat/completions", {"max_completion_tokens": 9}) == 9
    assert output_budget("/v1/messages", {"max_tokens": 12}) == 12
    assert output_budget("/v1/completions", {"max_tokens": True}) == 0
    assert output_budget("/generate", {}) == 0
    assert answered_prompt_tokens(b'{"text": "\\"prompt_tokens\\": 3", "meta_info": '
                                  b'{"prompt_tokens": 41}}') == 41
    assert answered_prompt_tokens(b'{"usage": {"input_tokens": 7}}') == 7
    assert answered_prompt_tokens(b'{"x": 1}') == 0


def test_the_poller_applies_reports_and_gives_up_on_workers_without_load():
    import asyncio

    import httpx

    from sgdsl.runtime.router.poller import LoadPoller
    from sgdsl.runtime.router.registry import WorkerRegistry

    answers = {URLS[0]: (200, {"num_waiting_reqs": 3, "queued_prefill_tokens": 700,
                               "remaining_decode_tokens": 90, "kv_total_slots": 1000,
                               "kv_free_slots": 250}),
               URLS[1]: (404, {"detail": "Not Found"}), URLS[2]: (200, ["not", "an", "object"])}
    seen_auth = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_auth.append(request.headers.get("authorization"))
        status, body = answers[f"{request.url.scheme}://{request.url.netloc.decode()}"]
        return httpx.Response(status, json=body)

    async def run() -> WorkerRegistry:
        registry = WorkerRegistry(RouterConfig(worker_urls=URLS[:3]))
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            poller = LoadPoller(registry, client, {"Authorization": "Bearer k"})
            await poller.poll_all()
            await poller.poll_all()  # the worker without /load is not asked again
        return registry

    ws = list(asyncio.run(run()).workers.values())
    assert ws[0].ledger.report == LoadReport(waiting_reqs=3, prefill_tokens=700, decode_tokens=90,
                                             kv_total=1000, kv_free=250)
    assert ws[0].ledger.report.kv_pressure == 0.75 and ws[0].ledger.work(2.0) == 880
    assert not ws[1].ledger.supported and ws[1].ledger.report is None
    assert ws[2].ledger.supported and ws[2].ledger.report is None  # a bad answer is ignored
    assert len(seen_auth) == 5 and set(seen_auth) == {"Bearer k"}


def test_a_pd_router_polls_only_its_prefill_workers():
    """pd: the decode side is chosen by requests in flight, so its /load is never asked."""
    import asyncio

    import httpx

    from sgdsl.runtime.router.app import build_state

    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.scheme}://{request.url.netloc.decode()}")
        return httpx.Response(200, json={"num_waiting_reqs": 0})

    config = RouterConfig(pd_disaggregation=True, prefill_urls=(URLS[0],),
                          prefill_bootstrap_ports=(8998,), decode_urls=(URLS[1],))

    async def run() -> None:
        state = build_state(config)
        await state.client.aclose()
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            state.poller.client = client
            await state.poller.poll_all()

    asyncio.run(run())
    assert asked == [URLS[0]]
