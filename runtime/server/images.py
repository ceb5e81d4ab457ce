"""Images in the three protocols (mm): OpenAI ``image_url`` content parts, Anthropic ``image``
blocks, SGLang-native ``image_data``. Chat images are collected while the messages are turned
into template text (which gets the model's placeholder where each image was), then decoded
off the event loop (``resolve``), once, with the exact field name in any error (a 400 in the
protocol's shape), and passed to the engine decoded. Native ``image_data`` goes to the engine as
sent (it decodes off the loop too, naming ``image_data[k]``)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError
from ..multimodal.image_io import decode_image
from .errors import APIError


@dataclass
class ImageCollector:
    """Images of one request, in prompt order."""

    placeholder: str | None  # None: a text-only model
    max_images: int
    allow_urls: bool
    images: list[Any] = field(default_factory=list)
    fields: list[str] = field(default_factory=list)

    @classmethod
    def for_engine(cls, engine: Any) -> "ImageCollector":
        proc = getattr(engine, "mm_processor", None)
        config = getattr(engine, "config", None)
        return cls(proc.fmt.placeholder if proc else None, proc.max_images if proc else 0,
                   bool(getattr(config, "allow_image_urls", False)))

    def _check_model(self, where: str) -> None:
        if self.placeholder is None:
            raise APIError(400, f"{where}: this model is text-only; it does not accept images",
                           param=where)

    def add(self, source: Any, where: str) -> str:
        """Take one image (decoded by ``resolve``); the placeholder text for it."""
        self._check_model(where)
        if len(self.images) >= self.max_images:
            raise APIError(400, f"{where}: too many images; this server accepts at most "
                                f"{self.max_images} per request", param=where)
        self.images.append(source)
        self.fields.append(where)
        return self.placeholder

    async def resolve(self) -> list[Any]:
        """Decode every image on a worker thread (a URL fetch or a large decode must not stall
        the event loop); a 400 naming the first bad one."""
        if not self.images:
            return []
        self.images = await asyncio.get_running_loop().run_in_executor(None, self._decode_all)
        return self.images

    def _decode_all(self) -> list[Any]:
        out = []
        for source, where in zip(self.images, self.fields):
            try:
                out.append(decode_image(source, where, self.allow_urls))
            except InvalidRequestError as e:
                raise APIError(400, e.message, param=where) from None
        return out

    def openai_part(self, part: Any, where: str) -> str:
        self._check_model(where)
        spec = getattr(part, "image_url", None)
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise APIError(400, f"{where}: an image_url part needs image_url.url", param=where)
        return self.add(url, where)

    def anthropic_block(self, source: Any, where: str) -> str:
        self._check_model(where)
        if not isinstance(source, dict):
            raise APIError(400, f"{where}: an image block needs a source", param=where)
        if source.get("type") == "base64":
            data = source.get("data")
            if not isinstance(data, str):
                raise APIError(400, f"{where}: source.data must be base64 text", param=where)
            return self.add(f"data:{source.get('media_type', 'image/png')};base64,{data}", where)
        if source.get("type") == "url":
            return self.add(str(source.get("url")), where)
        raise APIError(400, f"{where}: image source type {source.get('type')!r} is not "
                            "supported (base64, url)", param=where)

    def native(self, image_data: Any, prompts: int) -> list[Any] | None:
        """SGLang-native ``image_data`` (one entry per prompt for a batch), checked against
        the model and the limit; the engine decodes it."""
        if image_data is None:
            return None
        batched = prompts > 1 or (isinstance(image_data, list) and image_data
                                  and isinstance(image_data[0], list))
        per = list(image_data) if batched else [image_data]
        if len(per) != prompts:
            raise APIError(400, f"image_data must have one entry per prompt ({prompts})",
                           param="image_data")
        out = []
        for entry in per:
            items = list(entry) if isinstance(entry, list) else ([] if entry is None else [entry])
            if items:
                self._check_model("image_data")
            if len(items) > self.max_images:
                raise APIError(400, f"image_data: {len(items)} images; this server accepts at "
                                    f"most {self.max_images} per request", param="image_data")
            out.append(items)
        return out
