"""Qwen2.5-VL decode as a CUDA graph runs it, on the CPU: the graph runner pads a decode batch
up to a captured size with rows at position 0 on request row 0, and row 0 holds an image
request whose M-RoPE delta is negative. The padded forward (``forward_eager`` on the graph's
static buffers, what a replay computes) must not index out of range (on the GPU it was a
device-side assert in the rotary lookup) and must give the unpadded batch's logits. On a GPU
the runner's captured graphs are replayed too."""
from __future__ import annotations

import torch

from .test_qwen2_5_vl import _extend
from .tiny_vlm import png

PROMPT = "Look <|vision_start|><|image_pad|><|vision_end|> and tell me {}"
# distinct images of distinct sizes, one the benchmark's 1280x720 (the tiny processor shrinks it)
IMAGES = [png(1280, 720, 11), png(100, 60, 12), png(64, 120, 13)]


def _decode_batch(runner, reqs, lens: list[int], tokens: list[int]):
    """One decode step of every request (its next token at position ``lens[i]``)."""
    from sgdsl.runtime.model.forward_batch import ForwardBatch, ForwardMode

    bs = len(reqs)
    slots = runner.token_kv_pool.alloc(bs)
    for req, n, slot in zip(reqs, lens, slots):
        runner.req_to_token_pool.req_to_token[req.req_pool_idx, n] = slot
    dev = lambda t: t.to(runner.device)  # noqa: E731
    pos = dev(torch.tensor(lens))
    return ForwardBatch(
        mode=ForwardMode.DECODE, batch_size=bs, input_ids=dev(torch.tensor(tokens)), positions=pos,
        req_pool_indices=dev(torch.tensor([r.req_pool_idx for r in reqs])), seq_lens=pos + 1,
        out_cache_loc=dev(slots), extend_prefix_lens=pos,
        extend_seq_lens=dev(torch.ones(bs, dtype=torch.int64)), extend_start_loc=dev(torch.arange(bs)))


def test_padded_graph_rows_after_image_requests(qwen_vl, vl):
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.cuda_graph_runner import CudaGraphRunner
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    runner = ModelRunner(EngineConfig(model=str(qwen_vl[0]), max_total_tokens=512, num_threads=1))
    assert runner.cpu_decoder is None  # the model's own decode path, as on the GPU
    reqs, lens = [], []
    for i, image in enumerate(IMAGES):
        ids, mm = vl.mm_processor.process(vl.tokenizer.encode(PROMPT.format(i)), [image], "image_data")
        req = Req(f"r{i}", ids, SamplingParams())
        req.mm, req.req_pool_idx = mm, runner.req_to_token_pool.alloc()
        _extend(runner, req, 0, len(ids))
        reqs.append(req)
        lens.append(len(ids))
    assert reqs[0].req_pool_idx == 0 and reqs[0].mm.mrope_delta < 0  # what padded rows read
    assert len({r.mm.images[0].hash for r in reqs}) == 3
    batch = _decode_batch(runner, reqs, lens, [42, 43, 44])
    graphs = CudaGraphRunner(runner, max_bs=4)  # captured sizes 1, 2, 4: 3 rows pad to 4
    padded = graphs.load(batch)
    assert padded == 4
    logits = runner.forward_eager(graphs.static_batch(padded))[:3]
    plain = runner.forward_eager(batch)
    tol = 1e-5 if runner.dtype == torch.float32 else 5e-2  # GPU: bf16, other kernels per size
    assert torch.isfinite(logits).all()
    assert float((logits - plain).abs().max()) < tol
    if runner.cuda_graph_runner is not None:  # on a GPU: the captured graph itself
        replayed = runner.cuda_graph_runner.replay(batch)
        assert float((replayed - plain).abs().max()) < tol
