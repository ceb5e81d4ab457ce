"""Tiny random vision-language models built with transformers and saved to a directory the
runtime loads: a Qwen2.5-VL and a LLaVA, each with the embedded SmolLM2 tokenizer plus the
model family's image tokens, and the family's own image processor config (small images).
"""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import torch

from sgdsl.runtime.multimodal.tokens import add_special_tokens

QWEN_SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
VOCAB = 49160  # SmolLM2's 49152 + the added tokens, rounded up
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            rms_norm_eps=1e-6, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
QWEN_VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64,
                   patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                   fullatt_block_indexes=[1], hidden_act="silu")
QWEN_PREPROCESSOR = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 24, "patch_size": 14,
                     "temporal_patch_size": 2, "merge_size": 2,
                     "image_mean": [0.48145466, 0.4578275, 0.40821073],
                     "image_std": [0.26862954, 0.26130258, 0.27577711],
                     "image_processor_type": "Qwen2VLImageProcessor",
                     "processor_class": "Qwen2_5_VLProcessor"}


def save_tiny(hf_model, path: Path, weight_std: float, seed: int = 0) -> None:
    """Every parameter random (HF leaves biases at zero and norms at one), so a loader that
    dropped one would show in the logits; saved as safetensors."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1.0 + noise * 0.1 if "norm" in name else noise * weight_std)
    hf_model.eval().save_pretrained(str(path))


def _tokenizer(embedded_dir: Path, folder: Path, specials: tuple[str, ...]) -> dict[str, int]:
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (embedded_dir / name).exists():
            shutil.copy(embedded_dir / name, folder / name)
    return add_special_tokens(folder, specials)


def tiny_qwen2_5_vl(folder: Path, embedded_dir: Path):
    """Build, randomize and save a tiny Qwen2.5-VL; returns the HF model (float32, eval)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = _tokenizer(embedded_dir, folder, QWEN_SPECIALS)
    text = {**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=QWEN_VISION,
                              image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"],
                              vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"],
                              tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(config).float()
    save_tiny(model, folder, weight_std=0.1)
    (folder / "preprocessor_config.json").write_text(json.dumps(QWEN_PREPROCESSOR))
    return model.eval()


def png(width: int, height: int, seed: int) -> bytes:
    """A random RGB image as PNG bytes."""
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels.numpy()).save(buf, format="PNG")
    return buf.getvalue()


LLAVA_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                    num_attention_heads=2, image_size=56, patch_size=14)
LLAVA_PREPROCESSOR = {"image_processor_type": "CLIPImageProcessor", "do_resize": True,
                      "size": {"shortest_edge": 56}, "do_center_crop": True,
                      "crop_size": {"height": 56, "width": 56}, "do_normalize": True,
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3}


def tiny_llava(folder: Path, embedded_dir: Path):
    """Build, randomize and save a tiny LLaVA (CLIP tower + projector + Llama); returns the HF
    model (float32, eval)."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    ids = _tokenizer(embedded_dir, folder, ("<image>",))
    config = LlavaConfig(vision_config=CLIPVisionConfig(**LLAVA_VISION),
                         text_config=LlamaConfig(**TEXT), image_token_index=ids["<image>"],
                         vision_feature_layer=-2, vision_feature_select_strategy="default",
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).float()
    save_tiny(model, folder, weight_std=0.1)
    (folder / "preprocessor_config.json").write_text(json.dumps(LLAVA_PREPROCESSOR))
    return model.eval()
