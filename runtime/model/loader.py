"""Find a model's files and load its weights into the runtime's own modules.

``resolve_model_dir`` turns ``EngineConfig.model`` into an HF-format directory: ``None`` is the
embedded SmolLM2, a directory is used as is, a ``.gguf`` file is converted once into the user
cache, and anything else is taken as a Hugging Face Hub repo id. ``load_model`` builds the
model class for the directory's architecture and fills it from safetensors (sharded or not),
or with random numbers for ``load_format="dummy"``.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import torch
from torch import nn

from ..config import EngineConfig
from ..distributed.pipeline_model import draw_skipped, drop_other_stages
from ..distributed.state import get_tp_group
from ..layers.linear import LinearBase
from ..errors import ModelLoadError
from ..layers.quantization.base import QuantConfig
from ..layers.quantization.fp8_utils import FP8_DTYPE
from .embedded import cache_root, convert_gguf, embedded_model_path
from .llama_weights import load_param
from .model_config import ModelConfig
from .registry import get_model_class

_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.model", "*.txt"]


def resolve_model_dir(config: EngineConfig) -> Path:
    """HF-format directory (with config.json) for ``config.model``."""
    if config.model is None:
        return embedded_model_path()
    path = Path(config.model).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and ggufs:
            return _gguf_dir(ggufs[0])
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"model directory {path} has no config.json")
        return path
    if path.is_file():
        if path.suffix == ".gguf":
            return _gguf_dir(path)
        raise ModelLoadError(f"model path {path} is a file but not a .gguf file; pass a "
                             "directory with config.json and *.safetensors, or a .gguf file")
    if _looks_like_repo_id(config.model):
        return _download(config.model)
    raise ModelLoadError(f"model path {path} does not exist")


def _gguf_dir(gguf: Path) -> Path:
    """Convert a GGUF file once into ``<cache>/models/<stem>-<size>`` (an HF directory)."""
    target = cache_root() / "models" / f"{gguf.stem}-{gguf.stat().st_size}"
    if not ((target / "config.json").exists() and (target / "model.safetensors").exists()):
        try:
            convert_gguf(gguf, target)
        except ModelLoadError:
            raise
        except Exception as e:  # transformers' GGUF reader raises many kinds
            raise ModelLoadError(f"cannot convert GGUF file {gguf}: {e}") from e
    return target


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return (len(parts) == 2 and all(parts) and not name.startswith((".", "~"))
            and not name.endswith(".gguf"))


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise ModelLoadError(f"model {repo_id!r} is not a local path and huggingface_hub is "
                             "not installed") from e
    try:  # a cached snapshot works offline
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True))
    except Exception:
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise ModelLoadError(
            f"model {repo_id!r} is not a local path and could not be downloaded from the "
            f"Hugging Face Hub ({type(e).__name__}: {e}); pass a local directory or .gguf file"
        ) from e


def safetensors_files(model_dir: Path) -> list[Path]:
    """Weight files of ``model_dir``: the shards named by the index file, else every
    ``*.safetensors``. Raises ModelLoadError naming what is missing."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (model_dir / n).is_file()]
        if missing:
            raise ModelLoadError(f"model directory {model_dir} lacks shard(s) named in "
                                 f"{index.name}: {', '.join(missing)}")
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model directory {model_dir} has no *.safetensors weight files "
                             "(use load_format='dummy' for random weights)")
    return files


def iter_safetensors(files: list[Path], device: torch.device | str) -> Iterator[tuple[str, Any]]:
    """(name, lazy view) per checkpoint tensor: indexing the view reads only those bytes, so
    a tensor-parallel rank reads only its slices (``layers/weight_slices.py``)."""
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt", device=str(device)) as f:
            for name in f.keys():
                yield name, f.get_slice(name)


def load_model(config: EngineConfig, device: torch.device | str,
               dtype: torch.dtype) -> tuple[nn.Module, ModelConfig]:
    """Build and fill the model for ``config`` on ``device``; returns (model, ModelConfig)."""
    model_dir = resolve_model_dir(config)
    return load_model_from_dir(model_dir, device, dtype, config.load_format, config.seed,
                               config.quantization)


def load_model_from_dir(model_dir: Path, device: torch.device | str, dtype: torch.dtype,
                        load_format: str = "auto", seed: int = 0,
                        quantization: str | None = None) -> tuple[nn.Module, ModelConfig]:
    model_config = ModelConfig.from_dir(model_dir)
    files = [] if load_format == "dummy" else safetensors_files(model_dir)
    quant = QuantConfig.resolve(quantization, model_config.quantization_config)
    cls = get_model_class(model_config.architecture)
    model = cls(model_config, dtype=dtype, device=device, quant=quant)
    if load_format == "dummy":
        fill_dummy_weights(model, seed)
    drop_other_stages(model)  # pp: other stages' modules were built on meta; now gone
    if load_format != "dummy":
        # NOTE: tensors are read on the CPU and copied in; reading straight to the GPU would
        # double peak memory for packed projections.
        loaded = model.load_weights(iter_safetensors(files, "cpu"))
        missing = model.missing_weights(loaded)
        if missing:
            shown = ", ".join(missing[:5]) + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else "")
            raise ModelLoadError(f"checkpoint in {model_dir} lacks weights: {shown}")
    for module in model.modules():
        if isinstance(module, LinearBase):
            module.process_weights_after_loading()
    if torch.device(device).type == "cpu":
        model.optimize_for_cpu(torch.get_num_threads())
    return model.eval(), model_config


@torch.no_grad()
def fill_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights at the model's real shapes: norms 1, everything else normal(0, 0.02).
    Generated on the parameter's own device (fast on GPU, no host copy). fp8 weights get
    normal(0, 1) values and scales of 0.02 (the same distribution once dequantized).

    Under tensor parallelism each rank draws every FULL parameter (``param.full_shape``) from
    the same seeded stream, in the same order, and keeps its slice through the parameter's
    ``weight_loader``: the ranks together hold exactly the model tp_size 1 would draw (one
    full parameter at a time is materialized)."""
    # pp: other stages' parameters are on meta (a model all on meta stays unfilled)
    real = [p for p in model.parameters() if p.device.type != "meta"]
    if not real:
        return
    gen_device = real[0].device
    generator = torch.Generator(device=gen_device).manual_seed(seed)
    sharded = get_tp_group().size > 1
    for name, param in model.named_parameters():
        if param.device.type == "meta":  # pp: the stream advances as at pp_size 1
            draw_skipped(name, param, generator, gen_device, sharded, DUMMY_STD, _fill_fp8)
        elif name.endswith("norm.weight"):
            param.fill_(1.0)
        elif "_scale" in name.rsplit(".", 1)[-1]:
            param.fill_(DUMMY_STD)
        elif param.dtype == FP8_DTYPE:
            _fill_fp8(param, generator)  # NOTE: per rank (an fp8 tensor cannot be drawn whole)
        elif not sharded:
            param.normal_(0.0, DUMMY_STD, generator=generator)
        else:
            full = torch.empty(getattr(param, "full_shape", param.shape), dtype=param.dtype,
                               device=param.device).normal_(0.0, DUMMY_STD, generator=generator)
            load_param(param, full, name)


DUMMY_STD = 0.02


def _fill_fp8(param: torch.Tensor, generator: torch.Generator) -> None:
    """normal(0, 1) in fp8, a slice at a time (an expert tensor in fp32 would be GBs)."""
    rows = param.view(-1, param.shape[-1])
    step = max(1, (64 << 20) // (4 * rows.shape[1]))
    for start in range(0, rows.shape[0], step):
        part = rows[start:start + step]
        tmp = torch.empty(part.shape, dtype=torch.float32, device=part.device)
        part.copy_(tmp.normal_(0.0, 1.0, generator=generator).to(FP8_DTYPE))
