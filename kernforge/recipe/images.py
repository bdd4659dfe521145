"""V4.1 image preprocessing with OpenCV: decode, check, resize to the patch grid, re-encode.

The vision encoder reads 14-pixel patches and pools them 3x3, one extra token per
row plus two framing tokens, so an image of `pw` x `ph` patches costs
`ceil(ph/3) * (ceil(pw/3) + 1) + 2` tokens (checked against deepseek-recipe).
Images are scaled, keeping their aspect ratio, so the patch count lies between
`MIN_PATCHES` and the detail level's maximum, then snapped to whole patches.
OpenCV is imported lazily: text-only users never need it.
"""
import base64
import binascii
import math
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from .errors import ImageError, InvalidArgumentError

PATCH = 14
POOL = 3
MIN_PATCHES = 39 * 39
MAX_PATCHES = {"high": 96 * 96, "original": 96 * 96, "auto": 96 * 96, "low": 39 * 39}
MAX_TOKENS = 1024  # deepseek-recipe keeps grids up to this many tokens and refits larger ones


@dataclass(frozen=True)
class PreprocessOptions:
    detail: str = "high"
    max_dimension_px: int = 2048
    low_detail_max_dimension_px: int = 512


@dataclass(frozen=True)
class ImageInfo:
    """A preprocessed image: encoded bytes (PNG) and its size in pixels."""

    data: bytes
    width: int
    height: int

    def token_count(self) -> int:
        return image_token_count(self.width, self.height)


def image_token_count(width: int, height: int) -> int:
    if width % PATCH or height % PATCH or width <= 0 or height <= 0:
        raise InvalidArgumentError(f"image size {width}x{height} is not a whole number of {PATCH}px patches")
    pw, ph = width // PATCH, height // PATCH
    return math.ceil(ph / POOL) * (math.ceil(pw / POOL) + 1) + 2


def target_size(width: int, height: int, detail: str) -> tuple[int, int]:
    """Patch-aligned (width, height) with the aspect ratio kept and the patch count in range."""
    if detail not in MAX_PATCHES:
        raise ImageError("InvalidDetail", f"unknown image detail {detail!r}")
    max_patches = MAX_PATCHES[detail]
    patches = (width / PATCH) * (height / PATCH)
    scale = 1.0
    if patches < MIN_PATCHES:
        scale = math.sqrt(MIN_PATCHES / patches)
    elif patches > max_patches:
        scale = math.sqrt(max_patches / patches)
    limit = max(max_patches, MIN_PATCHES) * 1.05
    while True:  # shrink both sides together until the grid fits the patch and token budgets
        pw = max(1, round(width * scale / PATCH))
        ph = max(1, round(height * scale / PATCH))
        tokens = math.ceil(ph / POOL) * (math.ceil(pw / POOL) + 1) + 2
        if (pw * ph <= limit and tokens <= MAX_TOKENS) or pw == ph == 1:
            return pw * PATCH, ph * PATCH
        scale *= 0.98


def decode_data_url(url: str) -> bytes:
    """Bytes of a `data:` URL with a base64 or percent-encoded body."""
    head, sep, body = url.partition(",")
    if not url.startswith("data:") or not sep:
        raise ImageError("InvalidDataUrl", "malformed data URL")
    if head.endswith(";base64"):
        try:
            return base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError("InvalidDataUrl", f"bad base64 body: {exc}") from None
    return unquote_to_bytes(body)


def preprocess(data: bytes, options: PreprocessOptions = PreprocessOptions()) -> ImageInfo:
    """Decode, validate, resize to the patch grid and re-encode one image."""
    import cv2
    import numpy as np

    if not data:
        raise ImageError("EmptyImage", "image has no bytes")
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise ImageError("UnsupportedImage", "cannot decode image; use webp, png, jpeg or gif")
    h, w = img.shape[:2]
    if max(h, w) > options.max_dimension_px:
        raise ImageError("ImageTooLarge", f"{w}x{h} exceeds {options.max_dimension_px}px")
    tw, th = target_size(w, h, options.detail)
    interp = cv2.INTER_AREA if tw * th < w * h else cv2.INTER_CUBIC
    out = cv2.resize(img, (tw, th), interpolation=interp)
    ok, buf = cv2.imencode(".png", out)
    if not ok:
        raise ImageError("EncodeFailed", "cannot re-encode image")
    return ImageInfo(buf.tobytes(), tw, th)


def preprocess_source(source, options: PreprocessOptions | None = None) -> ImageInfo:
    """Preprocess a data-URL or bytes ImageSource; fetching URLs is the caller's job."""
    opts = options or PreprocessOptions(detail=source.detail)
    if source.kind == "data_url":
        return preprocess(decode_data_url(source.data_url), opts)
    if source.kind == "bytes":
        return preprocess(source.data, opts)
    raise ImageError("NeedsFetch", f"image at {source.path or '?'} is a URL; fetch it and pass bytes")
