"""``sgl.image`` in a program on ``Local`` (the tiny Qwen2.5-VL engine): two images in a turn,
a second turn that reuses the cached prefix (images included), and a ``select`` after an image."""
from __future__ import annotations

import io

import sgdsl as sgl
from sgdsl.backends.local import Local

from .tiny_vlm import png


@sgl.function
def describe(s, first, second):
    s += sgl.user(sgl.image(first) + "What is in these pictures?" + sgl.image(second))
    s += sgl.assistant(sgl.gen("answer", max_tokens=6, temperature=0))
    s += sgl.user("And the colours?")
    s += sgl.assistant(sgl.gen("colours", max_tokens=4, temperature=0))
    s += sgl.user("Cat or dog?")
    s += sgl.assistant(sgl.select("pet", choices=["cat", "dog"]))


def test_program_with_images_on_local(vl, tmp_path):
    from PIL import Image

    backend = Local(engine=vl)
    assert backend.capabilities.images and backend.capabilities.max_images == 16
    path = tmp_path / "first.png"
    path.write_bytes(png(100, 60, 1))
    second = Image.open(io.BytesIO(png(64, 120, 2)))  # path, then a PIL image
    state = describe.run(str(path), second, backend=backend)
    assert state["answer"] and state["colours"] and state["pet"] in ("cat", "dog")
    assert state.text().count("<|image_pad|>") == 2
    assert state.get_meta_info("colours")["cached_tokens"] > 16  # both images were cached
    assert state._repr_html_().count('class="sgdsl-image"') == 2  # the notebook view shows them
