"""On the GPU: the Qwen2.5-VL vision tower's device path (fused RMSNorm and add+norm, the
rotary kernel, varlen flash attention in bf16 / per-length SDPA in fp32, the padded MLP, pinned
uploads) against transformers' tower on the same device, at head_dim 80 as in the 7B model, with
images whose windows are partial; the two attention paths against each other and the padded MLP
against HF's three linears at the 7B size; and the uint8 pixels cut into patches on the device
equal the image processor's output."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CONFIG = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu" / "configs" / "qwen2.5-vl-7b"
SIZES = [(200, 150), (97, 301), (330, 90)]
VISION = dict(depth=4, hidden_size=160, intermediate_size=256, num_heads=2, out_hidden_size=64,
              window_size=112, fullatt_block_indexes=[1, 3], hidden_act="silu")


def _images() -> list:
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SIZES]


@pytest.fixture(scope="module")
def processor():
    from sgdsl.runtime.multimodal.pixels import PatchSpec
    from sgdsl.runtime.multimodal.processor import _load_image_processor

    proc = _load_image_processor(CONFIG)  # the PIL flavour the engine loads
    assert PatchSpec.of(proc) is not None
    return proc


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 6e-2)])
def test_tower_on_the_gpu_matches_hf(processor, dtype, tol):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel)

    from sgdsl.runtime.model.qwen2_5_vl_vision import Qwen2_5_VisionTransformer

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = Qwen2_5_VLVisionConfig(**VISION)
    torch.manual_seed(0)
    hf = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg).float().cuda().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ours = Qwen2_5_VisionTransformer(cfg)
    ours.load_state_dict(hf.state_dict(), strict=False)
    ours = ours.to("cuda", dtype).eval()
    out = processor(images=_images(), return_tensors="pt")
    grids = [tuple(int(v) for v in g) for g in out["image_grid_thw"]]
    pixels = out["pixel_values"].cuda()
    with torch.no_grad():
        ref = hf(pixels, grid_thw=out["image_grid_thw"].cuda()).pooler_output
        got = ours(pixels.to(dtype), grids).float()
    assert got.shape == ref.shape
    err = float((got - ref).abs().max() / ref.abs().max())
    assert err < tol, err


def test_patches_cut_on_the_gpu_equal_the_processor(processor):
    from sgdsl.runtime.multimodal.pixels import PatchSpec

    spec = PatchSpec.of(processor)
    for image in _images() + [_images()[0].resize((1280, 720))]:
        ref = processor(images=[image], return_tensors="pt")["pixel_values"]
        pixels = torch.from_numpy(spec.resize(image)).cuda()
        got = spec.to_patches(pixels, torch.float32).cpu()
        assert got.shape == ref.shape and float((got - ref).abs().max()) <= 1e-6


def test_varlen_flash_equals_per_length_sdpa():
    """One varlen flash call over mixed segment lengths (a 1280x720 image's windows of 64,
    32 and 16 patches, and a whole frame) equals the per-length SDPA path on the same bf16
    q/k/v, v strided as the tower's qkv split leaves it."""
    from sgdsl.runtime.model.vision_attention import Segments, segment_attention, varlen_supported

    device = torch.device("cuda")
    assert varlen_supported(device, torch.bfloat16)
    lens = torch.tensor([64, 64, 32, 16, 64, 32, 600, 64, 16])
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(int(lens.sum()), 3, 16, 80, device=device, dtype=torch.bfloat16,
                      generator=gen)
    q, k, v = (t.contiguous() if i < 2 else t for i, t in enumerate(qkv.unbind(1)))
    scale = 80 ** -0.5
    got = segment_attention(q, k, v, Segments.of(lens, device, varlen=True), scale)
    ref = segment_attention(q, k, v, Segments.of(lens, device, varlen=False), scale)
    assert got.shape == ref.shape
    assert float((got.float() - ref.float()).abs().max()) < 2e-2


def test_padded_mlp_equals_the_plain_one_at_3420():
    """The 7B tower's MLP (intermediate 3420, padded to 3456, one gate+up GEMM and the fused
    silu_and_mul) against HF's three linears on the same bf16 weights."""
    import torch.nn.functional as F

    from sgdsl.runtime.model.vision_mlp import VisionMLP

    torch.manual_seed(0)
    mlp = VisionMLP(1280, 3420, "silu").to("cuda", torch.bfloat16)
    assert mlp.padded == 3456 and mlp.gate_proj.weight.data_ptr() == mlp.gate_up_weight.data_ptr()
    assert float(mlp.gate_up_weight[3420:3456].abs().sum()) == 0.0
    x = torch.randn(300, 1280, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)).float()
        got = mlp(x).float()
    assert float((got - ref).abs().max() / ref.abs().max()) < 2e-2
