"""Bad images are refused before any KV is allocated, with an error naming the field: bytes
that are no image, too many images, placeholders that do not match the images, URLs without
the allow flag, prompt logprobs over image tokens, and any image on a text-only model."""
from __future__ import annotations

import pytest

from sgdsl.runtime.errors import InvalidRequestError
from sgdsl.runtime.server.errors import APIError
from sgdsl.runtime.server.images import ImageCollector
from sgdsl.runtime.tokenizer.request_builder import RequestBuilder

from .tiny_vlm import png

ONE = "<|vision_start|><|image_pad|><|vision_end|> Describe."
OK = png(56, 56, 5)


@pytest.mark.parametrize("images, match, field", [
    ([b"not an image at all"], "cannot decode image", "image_data[0]"),
    (["data:image/png;base64,!!!"], "invalid base64", "image_data[0]"),
    (["/no/such/file.png"], "no such image file", "image_data[0]"),
    (["https://example.com/cat.png"], "not fetched", "image_data[0]"),
    ([OK] * 17, "at most 16", "image_data"),
    ([OK, OK], "marks 1 image", "image_data"),
])
def test_engine_refuses_bad_images(vl, images, match, field):
    with pytest.raises(InvalidRequestError, match=match) as info:
        vl.generate(ONE, {"max_new_tokens": 1}, image_data=images)
    assert info.value.field == field


def test_prompt_logprobs_must_start_after_the_images(vl):
    with pytest.raises(InvalidRequestError, match="after the last image") as info:
        vl.generate(ONE, {"max_new_tokens": 1}, image_data=[OK], return_logprob=True,
                    logprob_start_len=0)
    assert info.value.field == "logprob_start_len"
    _, mm = vl.mm_processor.process(vl.tokenizer.encode(ONE), [OK], "image_data")
    out = vl.generate(ONE, {"max_new_tokens": 1}, image_data=[OK], return_logprob=True,
                      logprob_start_len=mm.last_image_token + 2)
    assert out["meta_info"]["input_token_logprobs"]


def test_a_text_only_model_refuses_images(vl):
    builder = RequestBuilder(vl.tokenizer, vl._ready, mm=None)  # what a text-only engine has
    with pytest.raises(InvalidRequestError, match="text-only") as info:
        builder.build("Hi", None, None, False, -1, 0, False, None, image_data=[OK])
    assert info.value.field == "image_data"
    with pytest.raises(APIError, match="text-only") as api:
        ImageCollector(None, 0, False).add(OK, "messages[0].content[1].image_url")
    assert api.value.status == 400 and api.value.param == "messages[0].content[1].image_url"


def test_image_urls_are_fetched_only_when_allowed(tmp_path, monkeypatch):
    """A loopback HTTP server stands in for the web: refused without the flag, decoded with it."""
    import functools
    import http.server
    import threading

    from sgdsl.runtime.multimodal.image_io import decode_image

    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # loopback, never through a proxy
    (tmp_path / "cat.png").write_bytes(OK)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cat.png"
    try:
        with pytest.raises(InvalidRequestError, match="not fetched"):
            decode_image(url, "image_data[0]")
        assert decode_image(url, "image_data[0]", allow_urls=True).size == (56, 56)
        with pytest.raises(InvalidRequestError, match="cannot fetch"):
            decode_image(url + ".missing", "image_data[0]", allow_urls=True)
    finally:
        server.shutdown()


def test_images_refused_while_speculative_decoding_is_on(vl, monkeypatch):
    """Drafters read the prompt's pad ids (outside the vocabulary): a clear error, no crash."""
    from sgdsl.runtime.config import EngineConfig
    from sgdsl.runtime.multimodal.processor import MultimodalProcessor

    spec = EngineConfig(model=vl.config.model, speculative_algorithm="NGRAM")
    proc = MultimodalProcessor.for_model(vl._ready.model_dir, vl.tokenizer, spec)
    monkeypatch.setattr(vl.mm_processor, "refuse_reason", proc.refuse_reason)
    with pytest.raises(InvalidRequestError, match="speculative decoding") as info:
        vl.generate(ONE, {"max_new_tokens": 1}, image_data=[OK])
    assert info.value.field == "image_data"
