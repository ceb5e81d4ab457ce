"""On the GPU, through the real scheduler: triton attention + CUDA graphs with overlap scheduling
on and off give the same greedy tokens as the torch-native backend without graphs (fp32 random
Llama), for mixed lengths, chunked prefill, shared prefixes (cache hits) and a KV pool small
enough to force retraction; decode steps really replay graphs, and on the triton backend the
requests sharing a 70-token prompt prefix decode with cascade attention (prefix read once per
group)."""
from __future__ import annotations

import pytest
import torch

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.ipc import messages as m
from sgdsl.runtime.sampling_params import SamplingParams
from sgdsl.runtime.scheduler.scheduler import Scheduler

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # larger weights than HF's init: a peaked, tie-free argmax
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    path = tmp_path_factory.mktemp("tiny-llama-gpu")
    model.save_pretrained(path)
    return path


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 500, (70,), generator=gen).tolist()
    out = []
    for i in range(12):
        body = torch.randint(3, 500, (int(torch.randint(3, 90, (1,), generator=gen)),),
                             generator=gen).tolist()
        out.append(shared + body if i % 3 == 0 else body)
    return out


def _run(model_dir, backend: str, overlap: bool, pool: int) -> tuple[dict, int, int, int]:
    from sgdsl.runtime.model.runner import ModelRunner

    config = EngineConfig(model=str(model_dir), dtype="float32", device="cuda",
                          attention_backend=backend, disable_cuda_graph=backend != "triton",
                          max_total_tokens=pool, max_running_requests=8, cuda_graph_max_bs=8,
                          chunked_prefill_size=64, grammar_backend="none",
                          disable_overlap_schedule=not overlap)
    runner = ModelRunner(config)
    replays = [0]
    graphs = runner.cuda_graph_runner
    # replays of explicit batches, and whole decode steps (tp-step: model/step_graphs.py)
    for name in ("replay", "step") if graphs is not None else ():
        if hasattr(graphs, name):
            setattr(graphs, name, _counted(getattr(graphs, name), replays))
    outs: dict = {}
    sched = Scheduler(runner, config, [], None,
                      lambda msg: [outs.setdefault(o.rid, []).extend(o.new_ids) for o in msg.outs])
    cascades = [0]
    real_sp = sched.running.shared_prefix

    def shared_prefix():  # asked once per decode step, on either path
        found = real_sp()
        cascades[0] += found is not None
        return found
    sched.running.shared_prefix = shared_prefix
    for i, ids in enumerate(_prompts()):
        params = SamplingParams(max_new_tokens=20 + i, temperature=0.0, ignore_eos=True)
        sched.handle(m.TokenizedGenerateReq(f"r{i}", ids, params))
    while sched.step():
        pass
    assert sched._integrity_resp(0).ok
    return outs, replays[0], sched.counters["retractions_total"], cascades[0]


def _counted(fn, calls: list[int]):
    def counted(*args):
        calls[0] += 1
        return fn(*args)
    return counted


@pytest.mark.parametrize("pool", [4096, 400])  # 400: decode runs out of KV and retracts
def test_triton_graphs_overlap_match_torch_native(model_dir, pool, monkeypatch):
    from sgdsl.runtime.model import cuda_graph_runner

    monkeypatch.setattr(cuda_graph_runner, "CASCADE_MIN_BS", 1)  # graphs of 1..8 use cascade
    ref, _, _, plain = _run(model_dir, "torch_native", overlap=False, pool=pool)
    assert all(len(ref[f"r{i}"]) == 20 + i for i in range(12))
    assert plain == 0  # torch_native cannot use shared prefixes: none are computed
    for overlap in (False, True):
        ours, replays, retractions, cascades = _run(model_dir, "triton", overlap, pool)
        assert ours == ref, f"overlap={overlap}"
        assert replays > 20  # decode steps went through the CUDA graphs
        assert cascades > 5  # and many of them read the shared prefix once per group
        assert (retractions > 0) == (pool == 400)
