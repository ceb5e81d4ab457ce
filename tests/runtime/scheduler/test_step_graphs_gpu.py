"""tp-step on the GPU: decode steps run whole by the captured step graphs (model/step_graphs.py:
the indices in one copy, the greedy pick and the next inputs inside the graph) give the same
tokens as the plain decode graphs with the work outside them (``$SGDSL_DECODE_STEP=off``), for
greedy rows, seeded sampling, penalties, batch sizes that shrink through the padded graph
sizes and a KV pool small enough to force retraction; then the same through TP=2 engines,
every step's ids compared over the ranks (``$SGDSL_TP_IDS=check``), all-greedy steps picked
from each rank's logit columns (no logits all-gather)."""
from __future__ import annotations

import json

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

from .test_overlap_gpu import _prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """test_overlap_gpu's random Llama with a vocabulary the greedy pick splits into chunks
    (32768: the finish kernel and the host ring run, as for real vocabularies)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      vocab_size=32768, max_position_embeddings=1024, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than HF's init: a peaked, tie-free argmax
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    path = tmp_path_factory.mktemp("tiny-llama-step-gpu")
    model.save_pretrained(path)
    return path


def _params(i: int) -> SamplingParams:
    n = 12 + 2 * i  # requests finish one by one: batches of 12 down to 1 (graphs 16 .. 1)
    if i % 4 == 1:
        return SamplingParams(max_new_tokens=n, temperature=0.8, top_p=0.9, seed=i,
                              ignore_eos=True)
    if i % 4 == 3:
        return SamplingParams(max_new_tokens=n, temperature=0.0, frequency_penalty=0.5,
                              ignore_eos=True)
    return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)


def _run(model_dir, mode: str, pool: int, greedy_only: bool, monkeypatch,
         timeline: str | None = None) -> tuple[dict, dict]:
    from sgdsl.runtime.model.runner import ModelRunner

    monkeypatch.setenv("SGDSL_DECODE_STEP", mode)
    config = EngineConfig(model=str(model_dir), dtype="float32", device="cuda",
                          attention_backend="triton", max_total_tokens=pool,
                          max_running_requests=16, cuda_graph_max_bs=16,
                          chunked_prefill_size=64, grammar_backend="none")
    runner = ModelRunner(config)
    graphs = runner.step_graphs
    assert (graphs is not None and graphs.ring is not None) == (mode == "graph")
    if timeline is not None:  # $SGDSL_STEP_TIMELINE's recorder, keeping steps 3-12
        from sgdsl.runtime.model.step_timeline import StepTimeline

        graphs.timeline = StepTimeline(timeline, rank=0, skip=2, count=10)
    outs: dict = {}
    sched = Scheduler(runner, config, [], None,
                      lambda msg: [outs.setdefault(o.rid, []).extend(o.new_ids) for o in msg.outs])
    for i, ids in enumerate(_prompts()):
        params = (SamplingParams(max_new_tokens=12 + 2 * i, temperature=0.0, ignore_eos=True)
                  if greedy_only else _params(i))
        sched.handle(m.TokenizedGenerateReq(f"r{i}", ids, params))
    while sched.step():
        pass
    assert sched._integrity_resp(0).ok
    return outs, sched.counters


@pytest.mark.parametrize("pool,greedy_only", [(4096, True), (4096, False), (400, False)])
def test_whole_steps_equal_the_plain_graphs(model_dir, pool, greedy_only, monkeypatch,
                                            tmp_path):
    ref, plain = _run(model_dir, "off", pool, greedy_only, monkeypatch)
    ours, counters = _run(model_dir, "graph", pool, greedy_only, monkeypatch,
                          str(tmp_path / "tl"))
    assert ours == ref
    line = json.loads((tmp_path / "tl-rank0.json").read_text())  # the device timeline
    assert line["steps"] == 10 and 0 < line["graph_us"] <= line["period_us"], line
    assert plain["whole_decode_steps"] == 0 and counters["whole_decode_steps"] > 20
    if greedy_only:  # every step kept the graph's own ids
        assert counters["graph_ids_steps"] == counters["whole_decode_steps"]
    if pool == 400:
        assert counters["retractions_total"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_tp_engines_whole_steps_agree_over_ranks(model_dir, tokenizer_dir, monkeypatch):
    """TP=2: whole steps vs the plain graphs with the old broadcast, same tokens; in check
    mode every step's ids were all-gathered and equal on both ranks."""
    from sgdsl.runtime import Engine

    tp = 2
    prompts = _prompts()[:6]
    params = [{"max_new_tokens": 24, "ignore_eos": True, "temperature": 0.0},
              {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0.9, "seed": 5}] * 3
    got = {}
    for mode, ids in (("off", "broadcast"), ("graph", "check")):
        monkeypatch.setenv("SGDSL_DECODE_STEP", mode)
        monkeypatch.setenv("SGDSL_TP_IDS", ids)
        monkeypatch.setenv("SGDSL_LOCAL_GREEDY", "1")  # off by default on CUDA until tested
        with Engine(model=str(model_dir), tokenizer=str(tokenizer_dir), tp_size=tp,
                    dtype="float32",
                    max_running_requests=8, cuda_graph_max_bs=8, grammar_backend="none",
                    max_total_tokens=4096) as engine:
            got[mode] = [o["output_ids"] for o in engine.generate(input_ids=prompts,
                                                                  sampling_params=params)]
            # all greedy: picked from each rank's logit columns, no logits all-gather
            got[mode] += [o["output_ids"] for o in engine.generate(
                input_ids=prompts, sampling_params=params[0])]
            stats = engine.stats()
            engine.check_idle_integrity()
        assert (stats["whole_decode_steps"] > 10) == (mode == "graph"), stats
        assert (stats["local_greedy_steps"] > 10) == (mode == "graph"), stats
    assert got["graph"] == got["off"]
