"""Images through ``sgdsl serve`` on loopback (a subprocess on the tiny Qwen2.5-VL): the
official ``openai`` client with an ``image_url`` data URL, the ``anthropic`` client with a base64
``image`` block, SGLang-native ``image_data``, a program with ``sgl.image`` on
``RuntimeEndpoint``, and clear 400s (the protocol's error shape, naming the field)."""
from __future__ import annotations

import base64
import subprocess
import sys
from typing import Iterator

import httpx
import pytest

import sgdsl as sgl

from .tiny_vlm import png
from processes import stop_tree, url_of

pytestmark = pytest.mark.slow
IMAGE = png(100, 60, 1)
DATA_URL = "data:image/png;base64," + base64.b64encode(IMAGE).decode()


@pytest.fixture(scope="module")
def url(qwen_vl) -> Iterator[str]:
    cmd = [sys.executable, "-m", "sgdsl.runtime.launcher", "--model", str(qwen_vl[0]),
           "--num-threads", "1", "--max-total-tokens", "2048", "--max-images-per-request", "4",
           "--host", "127.0.0.1", "--port", "0",
           "--grammar-backend", "none"]  # none is sent: no compile workers to start
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield url_of(proc)
    stop_tree(proc)


def _parts(n: int = 1) -> list[dict]:
    return ([{"type": "text", "text": "What is in this picture?"}]
            + [{"type": "image_url", "image_url": {"url": DATA_URL}}] * n)


def test_openai_client_image_url(url):
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
    first = client.chat.completions.create(model="default", max_tokens=6, temperature=0,
                                           messages=[{"role": "user", "content": _parts()}])
    assert first.choices[0].message.content and first.usage.prompt_tokens > 8
    again = client.chat.completions.create(model="default", max_tokens=6, temperature=0,
                                           messages=[{"role": "user", "content": _parts()}])
    assert again.usage.prompt_tokens_details.cached_tokens > 8  # the image was a radix hit
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="default", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": "data:image/png;base64," + base64.b64encode(b"junk").decode()}}]}])
    assert bad.value.body["param"] == "messages[0].content[0].image_url"
    assert "cannot decode image" in bad.value.body["message"]
    with pytest.raises(openai.BadRequestError) as many:
        client.chat.completions.create(model="default", max_tokens=2, messages=[
            {"role": "user", "content": _parts(5)}])
    assert "at most 4" in many.value.body["message"]


def test_anthropic_client_image_block(url):
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="none")
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(IMAGE).decode()}}
    msg = client.messages.create(model="default", max_tokens=6, messages=[
        {"role": "user", "content": [block, {"type": "text", "text": "Describe it."}]}])
    assert msg.content[0].text and msg.usage.input_tokens > 8
    block["source"]["data"] = "***"
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="default", max_tokens=2, messages=[
            {"role": "user", "content": [block]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[0]" in bad.value.body["error"]["message"]


def test_native_image_data_and_url_refused(url):
    body = {"text": "<|vision_start|><|image_pad|><|vision_end|> Hi", "image_data": DATA_URL,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    out = httpx.post(f"{url}/generate", json=body, timeout=120).json()
    assert out["meta_info"]["completion_tokens"] == 3
    body["image_data"] = "https://example.com/cat.png"
    resp = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "image_data[0]"


@sgl.function
def caption(s, image):
    s += sgl.user(sgl.image(image) + "Caption this.")
    s += sgl.assistant(sgl.gen("caption", max_tokens=5, temperature=0))


def test_program_with_image_on_runtime_endpoint(url):
    backend = sgl.RuntimeEndpoint(url)
    state = caption.run(IMAGE, backend=backend)
    assert state["caption"] and state.get_meta_info("caption")["prompt_tokens"] > 8
