"""Image sources to decoded RGB images: raw bytes, a PIL image, a file path, a ``data:`` URL, a
bare base64 string, or an http(s) URL (fetched only when the engine allows it:
``allow_image_urls``). Every failure is an ``InvalidRequestError`` naming the request field."""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from typing import Any

from ..errors import InvalidRequestError

URL_TIMEOUT_S = 20.0
MAX_IMAGE_BYTES = 64 << 20
MAX_PIXELS = 64 << 20  # decoded size guard (PIL's decompression-bomb limit is per process)


def image_bytes(source: Any, field: str, allow_urls: bool = False) -> bytes | Any:
    """The encoded bytes of ``source`` (or the PIL image itself, passed through)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if hasattr(source, "convert") and hasattr(source, "size"):  # a PIL image
        return source
    if not isinstance(source, str) or not source:
        raise InvalidRequestError(f"{field}: an image must be bytes, a path, a data: URL or "
                                  f"base64 text, got {type(source).__name__}", field=field)
    if source.startswith("data:"):
        header, _, payload = source.partition(",")
        if ";base64" not in header:
            raise InvalidRequestError(f"{field}: only base64 data: URLs are supported", field=field)
        return _b64(payload, field)
    if source.startswith(("http://", "https://")):
        if not allow_urls:
            raise InvalidRequestError(f"{field}: image URLs are not fetched by this server (start it "
                                      "with --allow-image-urls, or send the image as a data: URL)",
                                      field=field)
        return _fetch(source, field)
    if len(source) < 4096 and os.path.isfile(source):
        with open(source, "rb") as f:
            return f.read(MAX_IMAGE_BYTES + 1)
    if len(source) >= 64:  # SGLang also takes bare base64
        return _b64(source, field)
    raise InvalidRequestError(f"{field}: no such image file {source!r}", field=field)


def _b64(payload: str, field: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidRequestError(f"{field}: invalid base64 image data ({e})", field=field) from None


def _fetch(url: str, field: str) -> bytes:
    import httpx

    try:
        resp = httpx.get(url, timeout=URL_TIMEOUT_S, follow_redirects=True)
        resp.raise_for_status()
    except httpx.HTTPError as e:
        raise InvalidRequestError(f"{field}: cannot fetch image {url!r}: {e}", field=field) from None
    return resp.content


def decode_image(source: Any, field: str, allow_urls: bool = False) -> Any:
    """A decoded RGB ``PIL.Image``."""
    from PIL import Image, UnidentifiedImageError

    data = image_bytes(source, field, allow_urls)
    if not isinstance(data, bytes):
        return data if data.mode == "RGB" else data.convert("RGB")  # read only: no copy
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequestError(f"{field}: image larger than {MAX_IMAGE_BYTES >> 20} MiB",
                                  field=field)
    try:
        image = Image.open(io.BytesIO(data))
        if image.width * image.height > MAX_PIXELS:
            raise InvalidRequestError(f"{field}: image of {image.width}x{image.height} pixels is "
                                      "too large", field=field)
        return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as e:
        raise InvalidRequestError(f"{field}: cannot decode image ({type(e).__name__}: {e})",
                                  field=field) from None


def pixel_hash(image: Any) -> int:
    """64-bit hash of the decoded pixels (and size): equal images, equal hashes."""
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{image.mode}:{image.width}x{image.height}".encode())
    h.update(image.tobytes())
    return int.from_bytes(h.digest(), "little")
