"""Images and sounds as a :class:`~llama_cffi.mtmd.Projector` takes them, checked before
libmtmd sees them.

* :class:`Image`: RGB pixels, an ``(height, width, 3)`` uint8 array (row-major, as libmtmd's
  bitmaps are);
* :class:`Audio`: mono float32 PCM samples at a stated sample rate (which must be the
  projector's: :attr:`Projector.audio_sample_rate <llama_cffi.mtmd.Projector.audio_sample_rate>`).

Files (PNG, JPEG, GIF, BMP; WAV, MP3, FLAC) are read by :meth:`Image.open` and
:meth:`Projector.open_media <llama_cffi.mtmd.Projector.open_media>` (which also reads
sounds: they are resampled to the projector's rate) with libmtmd's own decoders, as
``llama-mtmd-cli`` reads them, after :func:`~llama_cffi.media_file.check_media` has
checked the file's headers against the same bounds.

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

import logging
import os
from typing import Any

import numpy as np
import numpy.typing as npt

from . import log
from ._args import expect_int, type_error
from ._binding import ffi, lib
from .errors import InvalidMediaError, MediaNotFoundError, ParamError
from .media_file import MAX_FILE_BYTES, MediaHeader, check_media

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

    @classmethod
    def open(cls, source: str | os.PathLike[str] | bytes, *, max_pixels: int = MAX_PIXELS) -> Image:
        """An image read from a file (a path) or from a file's bytes: PNG, JPEG, GIF
        (its first frame) or BMP, decoded by libmtmd's decoder (stb_image), as
        ``llama-mtmd-cli`` decodes it. Its :attr:`id` is the SHA-256 of the file's bytes
        (hex), as libmtmd's helper names it.

        Raises :class:`~llama_cffi.errors.MediaNotFoundError` for a missing path,
        :class:`~llama_cffi.errors.InvalidMediaError` for a file that is not an image of
        those formats, is truncated or undecodable, or has more than ``max_pixels``
        pixels (checked from its header, before decoding)."""
        limit = expect_int("max_pixels", max_pixels, "an int")
        data = _read_source(source)
        header = check_media(data, max_pixels=limit, max_seconds=MAX_SECONDS)
        if header.kind != "image":
            raise InvalidMediaError(f"the file is a {header.format.upper()} sound, not an image")
        media = _decode(ffi.NULL, data, header, max_pixels=limit, max_seconds=MAX_SECONDS, sample_rate=0)
        assert isinstance(media, Image)
        return media

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


def _read_source(source: object) -> bytes:
    """A media file's bytes: ``source`` is a path (str or os.PathLike) or bytes-like."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if len(data) > MAX_FILE_BYTES:
            raise InvalidMediaError(f"the file has {len(data):,} bytes, more than {MAX_FILE_BYTES:,}")
        return data
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise type_error("source", "a path (str or os.PathLike) or a file's bytes", source)
    if "\0" in source:
        raise ParamError("source must not contain NUL characters")
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise InvalidMediaError(f"{source}: the file has {size:,} bytes, more than {MAX_FILE_BYTES:,}")
            return f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise MediaNotFoundError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise InvalidMediaError(f"{source}: is a directory, not a file") from None
    except OSError as e:
        raise InvalidMediaError(f"{source}: cannot be read ({e.strerror or e})") from None


def _decode(
    ctx: Any, data: bytes, header: MediaHeader, *, max_pixels: int, max_seconds: float, sample_rate: int
) -> Image | Audio:
    """Decode a checked file with libmtmd's helper (``ctx``: a projector's context for a
    sound, which it is resampled for; NULL for an image, whose decoding does not read
    it) into an :class:`Image` or :class:`Audio` holding a copy of the pixels or
    samples."""
    if header.kind == "audio" and ctx == ffi.NULL:  # pragma: no cover - callers pass a projector
        raise ParamError("a sound is decoded for a projector (Projector.open_media)")
    buf = ffi.from_buffer("unsigned char[]", data)
    opt = lib.mtmd_helper_init_opt_default()
    log.sync()
    with log.capture() as lines:
        wrapped = lib.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(data), False, opt)
    bitmap = wrapped.bitmap
    what = f"{header.format.upper()} {'image' if header.kind == 'image' else 'sound'}"
    if bitmap == ffi.NULL:
        errors = [line for level, line in lines if level >= logging.ERROR] or [line for _, line in lines]
        said = "; ".join(line.strip() for line in errors[-3:]) or "no reason given"
        raise InvalidMediaError(f"libmtmd could not decode the {what} ({said})")
    try:
        raw_id = lib.mtmd_bitmap_get_id(bitmap)
        name = None if raw_id == ffi.NULL else ffi.string(raw_id).decode("ascii", "replace")
        n_bytes = int(lib.mtmd_bitmap_get_n_bytes(bitmap))
        view = ffi.buffer(lib.mtmd_bitmap_get_data(bitmap), n_bytes) if n_bytes else b""
        try:
            if lib.mtmd_bitmap_is_audio(bitmap):
                if header.kind != "audio":  # pragma: no cover - the helper sniffs as check_media does
                    raise InvalidMediaError(f"libmtmd decoded the {what} as a sound")
                samples = np.frombuffer(view, dtype=np.float32)
                return Audio(samples, sample_rate, id=name, max_seconds=max_seconds)
            nx, ny = int(lib.mtmd_bitmap_get_nx(bitmap)), int(lib.mtmd_bitmap_get_ny(bitmap))
            if header.kind != "image" or (nx, ny) != (header.width, header.height) or n_bytes != nx * ny * 3:
                raise InvalidMediaError(
                    f"libmtmd decoded the {what} to {nx}x{ny} pixels; its header says {header.width}x{header.height}"
                )
            pixels = np.frombuffer(view, dtype=np.uint8).reshape(ny, nx, 3)
            return Image(pixels, id=name, max_pixels=max_pixels)
        except ParamError as e:
            raise InvalidMediaError(f"the decoded {what} cannot be used: {e}") from None
    finally:
        lib.mtmd_bitmap_free(bitmap)


def _check_media(value: Any) -> Image | Audio:
    if not isinstance(value, (Image, Audio)):
        raise type_error("media", "llama_cffi.media.Image or Audio objects", value)
    return value
