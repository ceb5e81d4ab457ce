"""Turning an ``image(...)`` source (path, URL, bytes, ``data:`` URL) into ``ImageData``."""
from __future__ import annotations

import asyncio
import base64
import mimetypes
from pathlib import Path
from typing import Any

from sgdsl.backends.base import ImageData

_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8", "image/jpeg"), (b"GIF8", "image/gif"),
          (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


def sniff_mime(data: bytes, default: str = "image/png") -> str:
    for magic, mime in _MAGIC:
        if data.startswith(magic):
            return mime
    return default


async def load_image(source: Any) -> ImageData:
    if isinstance(source, ImageData):
        return source
    if isinstance(source, (bytes, bytearray)):
        return ImageData(bytes(source), sniff_mime(bytes(source)))
    if hasattr(source, "save"):  # a PIL image
        return await asyncio.to_thread(_from_pil, source)
    text = str(source)
    if text.startswith("data:"):
        header, _, payload = text.partition(",")
        return ImageData(base64.b64decode(payload), header[5:].split(";")[0] or "image/png")
    if text.startswith(("http://", "https://")):
        return await _download(text)
    data = await asyncio.to_thread(Path(text).read_bytes)
    guessed = mimetypes.guess_type(text)[0]
    return ImageData(data, sniff_mime(data, guessed or "image/png"))


async def _download(url: str) -> ImageData:
    import httpx  # noqa: PLC0415 - only needed for URL images

    async with httpx.AsyncClient(follow_redirects=True, timeout=30) as client:
        response = await client.get(url)
        response.raise_for_status()
    mime = response.headers.get("content-type", "").split(";")[0]
    return ImageData(response.content, mime if mime.startswith("image/") else sniff_mime(response.content))


def _from_pil(image: Any) -> ImageData:
    import io  # noqa: PLC0415

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return ImageData(buffer.getvalue(), "image/png")
