"""``load_tokenizer`` reads a declared ``TokenizersBackend`` folder by that class directly (no
transformers config import on an engine's start, runtime/tokenizer/loader.py): the same
tokenizer ``AutoTokenizer`` gives for it, and every other folder still goes through
``AutoTokenizer``."""
from __future__ import annotations

import json
import shutil

import pytest

from sgdsl.runtime.config import EngineConfig
from sgdsl.runtime.model.embedded import embedded_model_path
from sgdsl.runtime.tokenizer.loader import DIRECT_MODEL_TYPES, _direct_class, load_tokenizer

TEXTS = ("Hello, world!", "<|im_start|>user\n{\"a\": [1, 2]}<|im_end|>\n", "  \u00e9\u4e2d \t x",
         "<|endoftext|>tail")


def _folder(tmp_path, tiny_model_dir, model_type, tokenizer_class=None):
    """The tiny model's folder (the embedded tokenizer's files) as ``model_type``."""
    folder = tmp_path / model_type
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    if tokenizer_class is not None:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(
            json.dumps({**cfg, "tokenizer_class": tokenizer_class}))
    return folder


def _same(a, b):
    assert type(a) is type(b)
    assert a.get_vocab() == b.get_vocab() and a.added_tokens_decoder == b.added_tokens_decoder
    assert a.all_special_tokens == b.all_special_tokens and a.chat_template == b.chat_template
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                 "model_max_length", "padding_side", "truncation_side"):
        assert getattr(a, attr) == getattr(b, attr), attr
    for text in TEXTS:
        for special in (True, False):
            ids = a.encode(text, add_special_tokens=special)
            assert ids == b.encode(text, add_special_tokens=special)
            assert a.decode(ids) == b.decode(ids)
            assert a.decode(ids, skip_special_tokens=True) == \
                b.decode(ids, skip_special_tokens=True)
    chat = [{"role": "user", "content": "hi"}]
    assert a.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        b.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


def test_embedded_model_direct_equals_auto():
    from transformers import AutoTokenizer

    folder = embedded_model_path()
    assert _direct_class(folder) is not None  # the embedded model takes the direct path
    _same(load_tokenizer(EngineConfig(), folder), AutoTokenizer.from_pretrained(str(folder)))


@pytest.mark.parametrize("model_type", sorted(DIRECT_MODEL_TYPES))
def test_each_direct_family_is_what_auto_picks(tmp_path, tiny_model_dir, model_type):
    from transformers import AutoTokenizer

    folder = _folder(tmp_path, tiny_model_dir, model_type)
    assert _direct_class(folder) is not None
    _same(load_tokenizer(EngineConfig(), folder), AutoTokenizer.from_pretrained(str(folder)))


@pytest.mark.parametrize("model_type,tokenizer_class", [
    ("qwen2", None), ("mistral", None), ("llava", None), ("llama", "GPT2Tokenizer"),
    ("llama", "PreTrainedTokenizerFast")])
def test_other_folders_go_through_auto(tmp_path, tiny_model_dir, model_type, tokenizer_class):
    folder = _folder(tmp_path, tiny_model_dir, model_type, tokenizer_class)
    assert _direct_class(folder) is None


def test_no_config_or_remote_code_goes_through_auto(tmp_path, tiny_model_dir):
    folder = _folder(tmp_path, tiny_model_dir, "llama")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "auto_map": {"x": "y"}}))
    assert _direct_class(folder) is None
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "config.json").unlink()
    assert _direct_class(folder) is None
