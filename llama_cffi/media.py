"""Images and sounds as a :class:`~llama_cffi.mtmd.Projector` takes them, checked before
libmtmd sees them.

* :class:`Image`: RGB pixels, an ``(height, width, 3)`` uint8 array (row-major, as libmtmd's
  bitmaps are);
* :class:`Audio`: mono float32 PCM samples at a stated sample rate (which must be the
  projector's: :attr:`Projector.audio_sample_rate <llama_cffi.mtmd.Projector.audio_sample_rate>`).

Both hold their own copy of the data (a C-contiguous array, read-only), so the caller's
array may change afterwards. The checks are those libmtmd's preprocessing would otherwise
abort on (``tools/mtmd`` at the pinned commit): an image of zero size, or one so narrow
that a resize rounds a side to 0 pixels (``mtmd-image.cpp:280``); audio of one sample
(``mtmd.cpp:1600``) or more than ``2**31 - 1`` samples (its mel spectrogram counts in
``int``). Images also have a pixel bound (:data:`MAX_PIXELS`, the ``max_pixels``
argument) and sounds a length bound (``max_seconds``), so that a huge input is a
:class:`~llama_cffi.errors.ParamError` rather than gigabytes of preprocessing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from ._args import expect_int, type_error
from .errors import ParamError

__all__ = ["MAX_ASPECT", "MAX_PIXELS", "MAX_SECONDS", "Audio", "Image"]

#: Default bound on an image's pixels (width * height): 64 Mpx, 192 MiB of RGB.
MAX_PIXELS = 1 << 26
#: The most an image's longer side may be longer than its shorter side (resizing keeps
#: the aspect ratio for many projectors; a side rounded to zero pixels aborts libmtmd).
MAX_ASPECT = 64
#: Default bound on a sound's length, in seconds.
MAX_SECONDS = 3600.0


def _check_id(id: object) -> None:
    if id is not None and (not isinstance(id, str) or "\0" in id):
        raise type_error("id", "a str without NUL characters, or None", id)


class Image:
    """An RGB image: ``pixels`` is a read-only ``(height, width, 3)`` uint8 array."""

    __slots__ = ("id", "pixels")

    def __init__(self, pixels: npt.ArrayLike, *, id: str | None = None, max_pixels: int = MAX_PIXELS) -> None:
        if not isinstance(pixels, np.ndarray):
            raise type_error("pixels", "a (height, width, 3) uint8 numpy array", pixels)
        if pixels.dtype != np.uint8:
            raise ParamError(f"pixels must be uint8 RGB values, not {pixels.dtype}")
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise ParamError(f"pixels must have shape (height, width, 3), not {pixels.shape}")
        limit = expect_int("max_pixels", max_pixels, "an int")
        h, w = int(pixels.shape[0]), int(pixels.shape[1])
        if h < 1 or w < 1:
            raise ParamError(f"an image needs at least one pixel, not {w}x{h}")
        if h * w > limit:
            raise ParamError(f"the image has {w}x{h} = {h * w:,} pixels, more than max_pixels={limit:,}")
        if max(h, w) > MAX_ASPECT * min(h, w):
            raise ParamError(f"the image is {w}x{h}: its sides differ by more than {MAX_ASPECT} times")
        _check_id(id)
        copy = np.array(pixels, dtype=np.uint8, order="C", copy=True)
        copy.setflags(write=False)
        self.pixels: npt.NDArray[np.uint8] = copy
        #: an optional name libmtmd keeps with the image's chunk (for caching by content)
        self.id = id

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])

    def __repr__(self) -> str:
        return f"<Image {self.width}x{self.height}>"


class Audio:
    """Mono PCM audio: ``samples`` is a read-only 1-D float32 array at ``sample_rate`` Hz."""

    __slots__ = ("id", "sample_rate", "samples")

    def __init__(
        self,
        samples: npt.ArrayLike,
        sample_rate: int,
        *,
        id: str | None = None,
        max_seconds: float = MAX_SECONDS,
    ) -> None:
        if not isinstance(samples, np.ndarray):
            raise type_error("samples", "a 1-D float32 numpy array", samples)
        if samples.dtype != np.float32:
            raise ParamError(f"samples must be float32 PCM, not {samples.dtype}")
        if samples.ndim != 1:
            raise ParamError(f"samples must be 1-D (mono), not shape {samples.shape}")
        rate = expect_int("sample_rate", sample_rate, "an int (Hz)")
        if rate < 1:
            raise ParamError(f"sample_rate must be positive, not {rate}")
        if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)):
            raise type_error("max_seconds", "a number", max_seconds)
        n = int(samples.shape[0])
        if n < 2:
            raise ParamError(f"audio needs at least 2 samples, not {n}")
        if n > min(2**31 - 1, max_seconds * rate):
            raise ParamError(f"{n:,} samples at {rate} Hz are more than max_seconds={max_seconds:g}")
        if not np.isfinite(samples).all():
            raise ParamError("samples must be finite (no NaN or infinity)")
        _check_id(id)
        copy = np.array(samples, dtype=np.float32, order="C", copy=True)
        copy.setflags(write=False)
        self.samples: npt.NDArray[np.float32] = copy
        self.sample_rate = rate
        #: an optional name libmtmd keeps with the sound's chunk
        self.id = id

    @property
    def seconds(self) -> float:
        return float(self.samples.shape[0]) / self.sample_rate

    def __repr__(self) -> str:
        return f"<Audio {self.seconds:.2f} s at {self.sample_rate} Hz>"


Media = Image | Audio


def _check_media(value: Any) -> Image | Audio:
    if not isinstance(value, (Image, Audio)):
        raise type_error("media", "llama_cffi.media.Image or Audio objects", value)
    return value
