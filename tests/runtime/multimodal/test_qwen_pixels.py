"""The fast image path of Qwen2.5-VL against transformers: the resized uint8 pixels cut into
patches (``PatchSpec``) equal the image processor's output exactly; the vision tower (windows
and full-attention segments of several lengths, one SDPA call per length) within 1e-5 of HF's
on images whose windows are partial; request images pickle as numpy arrays."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from sgdsl.runtime.multimodal.inputs import ImageItem, MmData
from sgdsl.runtime.multimodal.pixels import PatchSpec

# (width, height): partial windows of several shapes, an odd aspect ratio, a tiny image
SIZES = [(200, 150), (97, 301), (60, 40), (330, 90)]


def _images(seed: int = 0) -> list:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


@pytest.fixture(scope="module")
def processor(qwen_vl):
    from transformers import AutoImageProcessor

    # the tiny config caps images at 28*28*24 pixels; 1280x720 needs the real bounds
    return AutoImageProcessor.from_pretrained(str(qwen_vl[0]), max_pixels=28 * 28 * 1280)


def test_patches_equal_the_image_processor(processor):
    spec = PatchSpec.of(processor)
    assert spec is not None
    for image in _images() + [_images(1)[0].resize((1280, 720))]:
        ref = processor(images=[image], return_tensors="pt")
        pixels = torch.from_numpy(spec.resize(image))
        assert pixels.dtype == torch.uint8
        assert list(spec.grid(pixels)) == ref["image_grid_thw"][0].tolist()
        assert torch.equal(spec.to_patches(pixels, torch.float32), ref["pixel_values"])


def test_patch_spec_refuses_a_processor_it_does_not_reproduce(processor):
    import copy

    other = copy.deepcopy(processor)
    other.do_normalize = False
    assert PatchSpec.of(other) is None


def test_vision_tower_matches_hf_with_ragged_windows(qwen_vl, processor):
    from sgdsl.runtime.model.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

    hf = qwen_vl[1].model.visual
    ours = Qwen2_5_VisionTransformer(hf.config).float().eval()
    missing = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not missing.missing_keys
    out = processor(images=_images(), return_tensors="pt")
    grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
    _, lens = ours.window_index(grids)
    assert len(set(lens.tolist())) > 2  # the windows come in several lengths
    with torch.no_grad():
        ref = hf(out["pixel_values"], grid_thw=out["image_grid_thw"]).pooler_output
        got = ours(out["pixel_values"], grids)
    assert got.shape == ref.shape
    assert float((got - ref).abs().max()) < 1e-5


def test_request_images_pickle_as_numpy():
    spec = PatchSpec((0.5,) * 3, (0.25,) * 3, 1 / 255, 14, 2, 2, 3136, 1 << 20, 3)
    item = ImageItem(torch.randint(0, 256, (56, 84, 3), dtype=torch.uint8), (1, 4, 6), 7, 3,
                     6, spec)
    other = ImageItem(torch.randn(24, 1176).to(torch.bfloat16), (1, 4, 6), 8, 12, 6)
    mm = MmData((item, other), torch.arange(30).expand(3, 30), -4)
    data = pickle.dumps(mm, protocol=pickle.HIGHEST_PROTOCOL)
    assert b"_load_from_bytes" not in data  # no torch.load per tensor on the scheduler side
    back = pickle.loads(data)
    assert back.mrope_delta == -4 and torch.equal(back.mrope_positions, mm.mrope_positions)
    for a, b in zip(back.images, mm.images):
        assert a.pixel_values.dtype == b.pixel_values.dtype
        assert torch.equal(a.pixel_values, b.pixel_values)
        assert (a.grid_thw, a.hash, a.offset, a.num_tokens, a.patches) == \
            (b.grid_thw, b.hash, b.offset, b.num_tokens, b.patches)
    assert back.images[0].encoder_input(torch.device("cpu"), torch.float32).shape == (24, 1176)
