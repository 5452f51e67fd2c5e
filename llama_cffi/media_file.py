"""Checks of an image or sound file before libmtmd's decoders read it.

libmtmd's file helper (``mtmd_helper_bitmap_init_from_buf``, what ``llama-mtmd-cli``
uses) decodes images with the vendored stb_image and sounds with miniaudio
(dr_wav, dr_mp3, dr_flac). Both trust the file's own sizes: a PNG or GIF header may
claim 65,535 x 65,535 pixels, a deflate stream may inflate a thousandfold, a WAV or FLAC
header may claim billions of samples. The helper then allocates what the decoder reports
(a ``std::vector`` that cannot be allocated ends the process with ``std::terminate``),
and a file that is none of these formats is handed to stb_image, whose TGA reader
accepts almost any bytes. :func:`check_media` reads the container's headers (and, for
PNG, inflates the pixel data to count it, and for MP3 walks the frame headers to time
it) and refuses, as an :class:`~llama_cffi.errors.InvalidMediaError` saying why, what is
not one of the formats below, is truncated, or is bigger than the caller's bounds.

Formats (those libmtmd's helper decodes, without the video build's ffmpeg):

* images: PNG, JPEG (baseline and progressive), GIF (the first frame), BMP;
* sounds: WAV (PCM, IEEE float, A-law, mu-law, ADPCM; a truncated file is the samples
  it holds, as dr_wav reads it), MP3 (MPEG 1/2/2.5 layer I-III), FLAC; an ID3v2 tag may
  come first.

The checks are of sizes, not a second decoder: a file that passes can still be one the
decoder refuses (a :class:`~llama_cffi.errors.InvalidMediaError` after decoding).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from ._args import expect_int, type_error
from .errors import InvalidMediaError

__all__ = ["AUDIO_FORMATS", "IMAGE_FORMATS", "MAX_FILE_BYTES", "MAX_SIDE", "MediaHeader", "check_media"]

#: Formats :func:`check_media` accepts, by kind.
IMAGE_FORMATS = ("png", "jpeg", "gif", "bmp")
AUDIO_FORMATS = ("wav", "mp3", "flac")
#: stb_image's own bound on a side (``STBI_MAX_DIMENSIONS``).
MAX_SIDE = 1 << 24
#: The largest file read (1 GiB).
MAX_FILE_BYTES = 1 << 30
#: miniaudio's most channels (``MA_MAX_CHANNELS``).
MAX_CHANNELS = 254


@dataclass(frozen=True)
class MediaHeader:
    """What a media file's headers say. Images: ``width``, ``height`` (pixels);
    sounds: ``sample_rate`` (Hz, of the file), ``channels`` and ``seconds`` (at most:
    the length the decoder may produce)."""

    kind: str  # "image" or "audio"
    format: str
    width: int = 0
    height: int = 0
    sample_rate: int = 0
    channels: int = 0
    seconds: float = 0.0


def _bad(what: str) -> InvalidMediaError:
    return InvalidMediaError(what)


def _image(fmt: str, width: int, height: int, max_pixels: int) -> MediaHeader:
    if width < 1 or height < 1:
        raise _bad(f"the {fmt.upper()} image is {width}x{height} pixels: a side is zero")
    if width > MAX_SIDE or height > MAX_SIDE:
        raise _bad(f"the {fmt.upper()} image is {width}x{height} pixels: a side is over {MAX_SIDE:,}")
    if width * height > max_pixels:
        raise _bad(
            f"the {fmt.upper()} image is {width}x{height} = {width * height:,} pixels, more than "
            f"max_pixels={max_pixels:,}"
        )
    return MediaHeader("image", fmt, width=width, height=height)


# ------------------------------------------------------------------------ images


def _png(data: bytes, max_pixels: int) -> MediaHeader:
    pos = 8
    width = height = depth = color = interlace = -1
    raw_deflate = False  # Apple's CgBI PNGs: deflate without the zlib header
    inflater: zlib._Decompress | None = None
    inflated = 0
    expected = 0
    while True:
        if pos + 8 > len(data):
            raise _bad("the PNG file is truncated (no IEND chunk)")
        length, ctype = struct.unpack_from(">I4s", data, pos)
        if length > len(data) - pos - 12:
            raise _bad(f"the PNG file is truncated (chunk {ctype!r} of {length:,} bytes)")
        body = data[pos + 8 : pos + 8 + length]
        if ctype == b"CgBI":
            raw_deflate = True
        elif ctype == b"IHDR":
            if length < 13:
                raise _bad("the PNG file's IHDR chunk is short")
            width, height, depth, color, _, _, interlace = struct.unpack_from(">IIBBBBB", body)
            _image("png", width, height, max_pixels)
            channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color)
            if channels is None or depth not in (1, 2, 4, 8, 16):
                raise _bad(f"the PNG file has an unknown pixel format (colour type {color}, depth {depth})")
            expected = _png_raw_bytes(width, height, channels * depth, interlace == 1)
        elif ctype == b"IDAT":
            if width < 0:
                raise _bad("the PNG file has pixel data before its IHDR chunk")
            if inflater is None:
                inflater = zlib.decompressobj(-15 if raw_deflate else 15)
            try:
                # inflate to count, never more than the image holds (a deflate bomb
                # would otherwise grow stb_image's buffer to 4 GiB)
                out = inflater.decompress(body, expected - inflated + 1)
                inflated += len(out)
                while inflater.unconsumed_tail and inflated <= expected:
                    out = inflater.decompress(inflater.unconsumed_tail, expected - inflated + 1)
                    inflated += len(out)
            except zlib.error as e:
                raise _bad(f"the PNG file's pixel data does not inflate ({e})") from None
            if inflated > expected:
                raise _bad(f"the PNG file's pixel data inflates to more than the {expected:,} bytes its header implies")
        elif ctype == b"IEND":
            break
        pos += 12 + length
    if width < 0:
        raise _bad("the PNG file has no IHDR chunk")
    if inflater is None:
        raise _bad("the PNG file has no pixel data (IDAT)")
    return MediaHeader("image", "png", width=width, height=height)


def _png_raw_bytes(width: int, height: int, bits: int, interlaced: bool) -> int:
    def rows(w: int, h: int) -> int:
        return 0 if w == 0 or h == 0 else h * (1 + (w * bits + 7) // 8)

    if not interlaced:
        return rows(width, height)
    passes = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
    return sum(rows((width - x + dx - 1) // dx, (height - y + dy - 1) // dy) for x, y, dx, dy in passes)


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _jpeg(data: bytes, max_pixels: int) -> MediaHeader:
    pos = 2
    n = len(data)
    while pos < n:
        if data[pos] != 0xFF:
            raise _bad(f"the JPEG file is malformed (no marker at byte {pos})")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            break
        marker = data[pos]
        pos += 1
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            continue
        if marker in (0xD9, 0xDA):
            raise _bad("the JPEG file has no frame header (SOF) before its scan")
        if pos + 2 > n:
            break
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2 or pos + length > n:
            break
        if marker in _SOF:
            if length < 8:
                raise _bad("the JPEG file's frame header is short")
            height, width = struct.unpack_from(">HH", data, pos + 3)
            if height == 0:
                raise _bad("the JPEG file defines its height later (DNL), which stb_image does not read")
            return _image("jpeg", width, height, max_pixels)
        pos += length
    raise _bad("the JPEG file is truncated before its frame header")


def _gif(data: bytes, max_pixels: int) -> MediaHeader:
    if len(data) < 13:
        raise _bad("the GIF file is truncated")
    width, height = struct.unpack_from("<HH", data, 6)
    return _image("gif", width, height, max_pixels)


def _bmp(data: bytes, max_pixels: int) -> MediaHeader:
    if len(data) < 26:
        raise _bad("the BMP file is truncated")
    (size,) = struct.unpack_from("<I", data, 14)
    if size == 12:
        width, height = struct.unpack_from("<hh", data, 18)
    elif size >= 40 and len(data) >= 26:
        width, height = struct.unpack_from("<ii", data, 18)
    else:
        raise _bad(f"the BMP file has an unknown header size ({size})")
    if width < 0:
        raise _bad(f"the BMP file's width is negative ({width})")
    return _image("bmp", width, abs(height), max_pixels)


# ------------------------------------------------------------------------ sounds


def _audio(fmt: str, rate: int, channels: int, frames: float, max_seconds: float) -> MediaHeader:
    if not 1 <= rate <= 1_000_000:
        raise _bad(f"the {fmt.upper()} file's sample rate is {rate} Hz")
    if not 1 <= channels <= MAX_CHANNELS:
        raise _bad(f"the {fmt.upper()} file has {channels} channels")
    seconds = frames / rate
    if frames < 2:
        raise _bad(f"the {fmt.upper()} file holds no samples")
    if seconds > max_seconds:
        raise _bad(f"the {fmt.upper()} file lasts {seconds:,.1f} s, more than max_seconds={max_seconds:g}")
    return MediaHeader("audio", fmt, sample_rate=rate, channels=channels, seconds=seconds)


_WAV_BITS = {1: (8, 16, 24, 32, 64), 3: (32, 64), 6: (8,), 7: (8,)}


def _wav(data: bytes, max_seconds: float) -> MediaHeader:
    pos = 12
    fmt: tuple[int, int, int, int, int] | None = None
    n = len(data)
    while pos + 8 <= n:
        cid, size = struct.unpack_from("<4sI", data, pos)
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + size > n:
                raise _bad("the WAV file's format chunk is short")
            tag, channels, rate, _, align, bits = struct.unpack_from("<HHIIHH", data, body)
            if tag == 0xFFFE and size >= 40:  # WAVE_FORMAT_EXTENSIBLE: the sub-format's tag
                (tag,) = struct.unpack_from("<H", data, body + 24)
            fmt = (tag, channels, rate, align, bits)
        elif cid == b"data":
            if fmt is None:
                raise _bad("the WAV file has samples before its format chunk")
            # dr_wav reads what the file holds: a truncated file, or one written as a
            # stream (its size left at 0xFFFFFFFF), is the samples present
            size = min(size, n - body)
            tag, channels, rate, align, bits = fmt
            if tag in _WAV_BITS:
                if bits not in _WAV_BITS[tag]:
                    raise _bad(f"the WAV file has {bits}-bit samples in format {tag}")
                frames = size // max(1, channels * bits // 8)
            elif tag in (2, 0x11):  # MS and IMA ADPCM: 4 bits a sample, block headers aside
                frames = size * 2 // max(1, channels)
            else:
                raise _bad(f"the WAV file's sample format ({tag:#x}) is not one miniaudio decodes")
            header = _audio("wav", rate, channels, frames, max_seconds)
            if align == 0:
                raise _bad("the WAV file's block size is zero")
            return header
        pos = body + size + (size & 1)
    raise _bad("the WAV file has no data chunk")


_MP3_BITRATES = {
    (1, 1): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (1, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (1, 3): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (2, 1): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (2, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (2, 3): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mp3_frame(data: bytes, pos: int) -> tuple[int, int, int, int] | None:
    """(frame bytes, samples, sample rate, channels) of an MPEG audio frame header at
    ``pos``, or None when none is there."""
    if pos + 4 > len(data) or data[pos] != 0xFF or data[pos + 1] & 0xE0 != 0xE0:
        return None
    b1, b2, b3 = data[pos + 1], data[pos + 2], data[pos + 3]
    version = (b1 >> 3) & 3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    layer = 4 - ((b1 >> 1) & 3)  # 1, 2, 3 (4: reserved)
    bitrate_index, rate_index, padding = b2 >> 4, (b2 >> 2) & 3, (b2 >> 1) & 1
    if version == 1 or layer == 4 or bitrate_index in (0, 15) or rate_index == 3:
        return None  # reserved values; free-format frames (index 0) have no length here
    kbps = _MP3_BITRATES[(1 if version == 3 else 2, layer)][bitrate_index]
    rate = _MP3_RATES[version][rate_index]
    channels = 1 if b3 >> 6 == 3 else 2
    if layer == 1:
        return (12 * kbps * 1000 // rate + padding) * 4, 384, rate, channels
    if layer == 3 and version != 3:
        return 72 * kbps * 1000 // rate + padding, 576, rate, channels
    return 144 * kbps * 1000 // rate + padding, 1152, rate, channels


def _mp3(data: bytes, start: int, max_seconds: float) -> MediaHeader:
    # A decoder resynchronises byte by byte over anything that is not a frame header, so
    # every frame it can find is one this walk finds: the time it adds up bounds what
    # the decoder produces.
    pos, seconds, n = start, 0.0, len(data)
    first: tuple[int, int] | None = None
    while pos + 4 <= n:
        frame = _mp3_frame(data, pos)
        if frame is None:
            pos += 1
            continue
        size, samples, rate, channels = frame
        if first is None:
            first = (rate, channels)
        seconds += samples / rate
        if seconds > max_seconds:
            raise _bad(f"the MP3 file lasts over {max_seconds:g} s (max_seconds)")
        pos += max(size, 1)
    if first is None:
        raise _bad("the MP3 file has no MPEG audio frame (free-format MP3 is not read)")
    rate, channels = first
    return _audio("mp3", rate, channels, seconds * rate, max_seconds)


def _flac(data: bytes, start: int, max_seconds: float) -> MediaHeader:
    pos = start + 4
    if pos + 4 + 34 > len(data) or data[pos] & 0x7F != 0:
        raise _bad("the FLAC file has no STREAMINFO block")
    info = int.from_bytes(data[pos + 14 : pos + 22], "big")  # rate 20, channels 3, bits 5, samples 36
    rate = info >> 44
    channels = ((info >> 41) & 7) + 1
    frames = info & ((1 << 36) - 1)
    if frames == 0:
        raise _bad("the FLAC file does not say how many samples it holds (miniaudio then decodes none)")
    return _audio("flac", rate, channels, frames, max_seconds)


def _id3_end(data: bytes) -> int:
    """Where what follows an ID3v2 tag at the start begins (0 without one)."""
    if len(data) < 10 or data[:3] != b"ID3":
        return 0
    size = 0
    for b in data[6:10]:
        if b & 0x80:
            raise _bad("the file's ID3 tag is malformed")
        size = size << 7 | b
    footer = 10 if data[5] & 0x10 else 0
    return min(len(data), 10 + size + footer)


def check_media(data: bytes, *, max_pixels: int, max_seconds: float) -> MediaHeader:
    """The header of an image or sound file held in ``data``, checked against the bounds
    (``max_pixels``: width * height; ``max_seconds``: the sound's length). Raises
    :class:`~llama_cffi.errors.InvalidMediaError` for a file of another format, a
    truncated or inconsistent header, or one over the bounds."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise type_error("data", "a file's bytes (bytes, bytearray or memoryview)", data)
    max_pixels = expect_int("max_pixels", max_pixels, "an int")
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, (int, float)):
        raise type_error("max_seconds", "a number", max_seconds)
    data = bytes(data)
    if len(data) > MAX_FILE_BYTES:
        raise _bad(f"the file has {len(data):,} bytes, more than {MAX_FILE_BYTES:,}")
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png(data, max_pixels)
    if head.startswith(b"\xff\xd8\xff"):
        return _jpeg(data, max_pixels)
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data, max_pixels)
    if head.startswith(b"BM"):
        return _bmp(data, max_pixels)
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return _wav(data, max_seconds)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        raise _bad("WebP images are decoded only by libmtmd's video build (ffmpeg), which this build leaves out")
    start = _id3_end(data)
    body = data[start : start + 4]
    if body == b"fLaC":
        return _flac(data, start, max_seconds)
    if body == b"OggS":
        raise _bad("Ogg files are not read (FLAC, MP3 and WAV are)")
    if start or (len(body) >= 2 and body[0] == 0xFF and body[1] & 0xE0 == 0xE0):
        return _mp3(data, start, max_seconds)
    formats = ", ".join(f.upper() for f in (*IMAGE_FORMATS, *AUDIO_FORMATS))
    raise _bad(f"the data is not a file of a format read here ({formats}); it starts {bytes(head[:8])!r}")
