"""ids_encoder: the backend's encode where it gives the wrapper's ids, the wrapper elsewhere."""
from __future__ import annotations

from transformers import AutoTokenizer

from sgdsl.runtime.model.embedded import embedded_model_path
from sgdsl.runtime.tokenizer.encoder import ids_encoder

TEXTS = ["", " ", "hello", "  two leading spaces", "<|im_start|>user\nhi<|im_end|>\n",
         "<|endoftext|> mid <|im_end|>", "héllo wörld 日本語 🙂", "\t\n\r x", "a" * 400,
         "<tool_call>{\"name\": \"f\"}</tool_call>", "\u00a0non-breaking"]


def _tokenizer():
    return AutoTokenizer.from_pretrained(str(embedded_model_path()))


def test_backend_encode_matches_the_wrapper() -> None:
    tok = _tokenizer()
    enc = ids_encoder(tok)
    assert "encode_batch" in enc.__code__.co_names  # the direct backend call was taken
    for text in TEXTS:
        assert enc(text) == list(tok.encode(text, add_special_tokens=False)), text


def test_split_special_tokens_keeps_the_wrapper() -> None:
    tok = _tokenizer()
    tok.split_special_tokens = True
    enc = ids_encoder(tok)
    text = "<|im_start|>user"
    assert enc(text) == list(tok.encode(text, add_special_tokens=False))
    assert enc(text)[0] != tok.convert_tokens_to_ids("<|im_start|>")  # split, as asked


class _Plain:
    """A tokenizer with only ``encode`` (as test doubles and slow tokenizers have)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text] + ([0] if add_special_tokens else [])


def test_other_tokenizers_use_their_encode() -> None:
    assert ids_encoder(_Plain())("ab") == [97, 98]
