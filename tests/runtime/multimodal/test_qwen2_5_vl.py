"""Qwen2.5-VL on the runtime against transformers (float32): the logits of a prompt with two
images, whole and cut inside an image (a prefill on top of a cached prefix), within 1e-4 of
HF's forward; greedy generation through the Engine (prefill chunks cutting the images) equal
to HF ``generate``; the radix cache hits a repeated image and misses a different one."""
from __future__ import annotations

import io

import torch

from sgdsl.runtime.multimodal.inputs import PAD_BASE, build_mm_batch

from .tiny_vlm import png

PROMPT = ("Look <|vision_start|><|image_pad|><|vision_end|> and then "
          "<|vision_start|><|image_pad|><|vision_end|> now tell")
IMAGES = [png(100, 60, 1), png(64, 120, 2)]
GREEDY = {"temperature": 0, "max_new_tokens": 10}


def hf_inputs(proc, ids: list[int], images: list[bytes]) -> dict:
    """HF's inputs for our expanded prompt: pad ids back to the image token, the images
    through transformers' own image processor (ours ships resized uint8 pixels instead)."""
    from PIL import Image

    hid = torch.tensor([[proc.image_token_id if t >= PAD_BASE else t for t in ids]])
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    out = proc.image_processor(images=pil, return_tensors="pt")
    return dict(input_ids=hid, mm_token_type_ids=(hid == proc.image_token_id).int(),
                pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])


def _extend(runner, req, start: int, end: int):
    """One prefill of prompt tokens ``start:end`` on top of the first ``start`` (cached)."""
    from sgdsl.runtime.scheduler.batch import build_extend

    req.kv_len, req.extend_len = start, end - start
    req.extend_slots = runner.token_kv_pool.alloc(end - start)
    runner.req_to_token_pool.req_to_token[req.req_pool_idx, start:end] = req.extend_slots
    batch, _ = build_extend([req], runner.device)
    assert batch.mm_inputs is not None
    batch.logits_indices = torch.arange(end - start)
    return runner.forward(batch)


def test_logits_match_hf_whole_and_cut_inside_an_image(qwen_vl, vl):
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.model.runner import ModelRunner
    from sgdsl.runtime.sampling_params import SamplingParams
    from sgdsl.runtime.scheduler.req import Req

    folder, hf = qwen_vl
    proc = vl.mm_processor
    ids, mm = proc.process(vl.tokenizer.encode(PROMPT), IMAGES, "image_data")
    assert [i.num_tokens for i in mm.images] == [8, 8] and mm.mrope_delta != 0
    assert mm.images[0].patches is not None  # uint8 pixels, patches cut on the device
    with torch.no_grad():
        ref = hf(**hf_inputs(proc, ids, IMAGES)).logits[0]
    runner = ModelRunner(EngineConfig(model=str(folder), max_total_tokens=256, num_threads=1))
    req = Req("r", ids, SamplingParams())
    req.mm, req.req_pool_idx = mm, runner.req_to_token_pool.alloc()
    whole = _extend(runner, req, 0, len(ids))
    assert float((whole - ref).abs().max()) < 1e-4
    cut = mm.images[1].offset + 3  # inside the second image: rows 3.. of its embedding
    first = _extend(runner, req, 0, cut)
    second = _extend(runner, req, cut, len(ids))
    assert float((torch.cat([first, second]) - ref).abs().max()) < 1e-4
    assert build_mm_batch([req], runner.device).slices[0].start == 3
    from sgdsl.runtime.multimodal.mrope import set_row_deltas

    rows = torch.tensor([req.req_pool_idx])
    runner.model.model.row_delta.zero_()
    set_row_deltas(runner.model, [req], rows)  # PD: a prebuilt request joins decoding
    assert int(runner.model.model.row_delta[req.req_pool_idx]) == mm.mrope_delta


def test_greedy_equals_hf_generate_with_chunked_prefill(qwen_vl, vl):
    _, hf = qwen_vl
    other = [png(84, 84, 3)]
    prompts = [PROMPT, "<|vision_start|><|image_pad|><|vision_end|> What is it?"]
    outs = vl.generate(prompts, GREEDY, image_data=[IMAGES, other])
    for prompt, images, out in zip(prompts, [IMAGES, other], outs):
        ids, _ = vl.mm_processor.process(vl.tokenizer.encode(prompt), images, "image_data")
        inputs = hf_inputs(vl.mm_processor, ids, images)
        with torch.no_grad():
            ref = hf.generate(**inputs, attention_mask=torch.ones_like(inputs["input_ids"]),
                              do_sample=False, max_new_tokens=10)
        assert out["output_ids"] == ref[0, len(ids):].tolist()
        assert out["meta_info"]["prompt_tokens"] == len(ids)


def test_radix_hit_on_a_repeated_image_and_miss_on_another(vl):
    vl.flush_cache()
    first = vl.generate(PROMPT, GREEDY, image_data=IMAGES)
    encoded = vl.stats()["mm_images_encoded"]
    again = vl.generate(PROMPT.replace("now tell", "what colour"), GREEDY, image_data=IMAGES)
    ids, mm = vl.mm_processor.process(vl.tokenizer.encode(PROMPT), IMAGES, "image_data")
    end_of_images = mm.last_image_token + 1
    assert first["meta_info"]["cached_tokens"] == 0
    assert again["meta_info"]["cached_tokens"] >= end_of_images
    assert vl.stats()["mm_images_encoded"] == encoded  # both images came from the cache
    swapped = vl.generate(PROMPT, GREEDY, image_data=[IMAGES[0], png(100, 60, 9)])
    assert swapped["meta_info"]["cached_tokens"] <= mm.images[1].offset


def test_retraction_and_resume_with_images_give_the_same_tokens(qwen_vl, vl):
    """A 96-slot KV pool: decoding six image requests retracts some; resumed, they prefill
    prompt + output again (M-RoPE positions of the output: index + delta) and finish with the
    tokens of an unconstrained engine."""
    from sgdsl.runtime import Engine

    ph = "<|vision_start|><|image_pad|><|vision_end|>"
    prompts = [f"{ph} question {i} about it" for i in range(6)]
    images = [[png(100, 60, 20 + i)] for i in range(6)]
    params = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    ref = [o["output_ids"] for o in vl.generate(prompts, params, image_data=images)]
    # (no grammar is sent: no grammar helper processes)
    with Engine(str(qwen_vl[0]), max_total_tokens=96, num_threads=1, chunked_prefill_size=16,
                grammar_backend="none") as small:
        out = [o["output_ids"] for o in small.generate(prompts, params, image_data=images)]
        assert small.stats()["retractions_total"] > 0
        small.check_idle_integrity()
    assert out == ref
