"""LLaVA (CLIP tower + projector + Llama) on the runtime's ModelRunner against transformers
(float32): the logits of a prompt with two images, whole and cut inside an image, within 1e-4
of HF's forward, and greedy tokens (prefill, then one token per step) equal to HF ``generate``."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sgdsl.runtime.multimodal.inputs import PAD_BASE

from .tiny_vlm import png, tiny_llava

PROMPT = "Look <image> and then <image> now tell"
IMAGES = [png(100, 60, 1), png(64, 120, 2)]


@pytest.fixture(scope="module")
def llava(tmp_path_factory, tokenizer_dir):
    from transformers import AutoTokenizer

    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.multimodal.processor import MultimodalProcessor

    folder: Path = tmp_path_factory.mktemp("tiny-llava")
    hf = tiny_llava(folder, tokenizer_dir)
    config = EngineConfig(model=str(folder), max_total_tokens=256, num_threads=1)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    proc = MultimodalProcessor.for_model(folder, tokenizer, config)
    ids, mm = proc.process(tokenizer.encode(PROMPT), IMAGES, "image_data")
    return hf, ModelRunner(config), ids, mm, proc.image_token_id


def _extend(runner, req, start: int, end: int):
    from sgdsl.runtime.scheduler.batch import build_extend

    req.kv_len, req.extend_len = start, end - start
    req.extend_slots = runner.token_kv_pool.alloc(end - start)
    runner.req_to_token_pool.req_to_token[req.req_pool_idx, start:end] = req.extend_slots
    batch, _ = build_extend([req], runner.device)
    batch.logits_indices = torch.arange(end - start)
    return runner.forward(batch)


def _request(runner, ids, mm):
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    req = Req("r", ids, SamplingParams())
    req.mm, req.req_pool_idx = mm, runner.req_to_token_pool.alloc()
    return req


def test_llava_logits_and_greedy_match_hf(llava):
    hf, runner, ids, mm, image_token = llava
    assert [i.num_tokens for i in mm.images] == [16, 16]
    hid = torch.tensor([[image_token if t >= PAD_BASE else t for t in ids]])
    pixels = torch.cat([i.pixel_values for i in mm.images])
    with torch.no_grad():
        ref = hf(input_ids=hid, pixel_values=pixels).logits[0]
        greedy = hf.generate(input_ids=hid, attention_mask=torch.ones_like(hid),
                             pixel_values=pixels, do_sample=False, max_new_tokens=6)
    req = _request(runner, ids, mm)
    assert float((_extend(runner, req, 0, len(ids)) - ref).abs().max()) < 1e-4
    cut = mm.images[1].offset + 5
    req = _request(runner, ids, mm)
    rows = torch.cat([_extend(runner, req, 0, cut), _extend(runner, req, cut, len(ids))])
    assert float((rows - ref).abs().max()) < 1e-4
    tokens = [int(rows[-1].argmax())]
    for _ in range(5):  # one token per step on top of the cached prompt
        req.origin_input_ids.append(tokens[-1])
        n = len(req.origin_input_ids)
        tokens.append(int(_extend(runner, req, n - 1, n)[-1].argmax()))
    assert tokens == greedy[0, len(ids):].tolist()
