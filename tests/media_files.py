"""Small image and sound files written byte by byte for the media tests: valid ones (PNG,
BMP, GIF, WAV, FLAC) and the hostile headers of the bad-input catalogue."""

from __future__ import annotations

import io
import struct
import wave
import zlib

import numpy as np

from llama_cffi.media_file import _png_raw_bytes


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(pixels: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of ``pixels`` (H x W x 3 uint8), rows unfiltered."""
    h, w, _ = pixels.shape
    raw = b"".join(b"\0" + pixels[y].tobytes() for y in range(h))
    return png_raw(w, h, zlib.compress(raw))


def png_raw(width: int, height: int, idat: bytes, color: int = 2, depth: int = 8) -> bytes:
    """A PNG whose IHDR says ``width`` x ``height`` and whose IDAT holds ``idat`` as given."""
    ihdr = struct.pack(">IIBBBBB", width, height, depth, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_bomb(width: int = 16, height: int = 16, extra: int = 64 << 20) -> bytes:
    """A ``width`` x ``height`` PNG whose pixel data inflates to ``extra`` bytes more
    than the image holds (about 1,000 times its compressed size)."""
    raw = _png_raw_bytes(width, height, 24, False) + extra
    comp = zlib.compressobj(9)
    block = b"\0" * (1 << 20)
    out = [comp.compress(block) for _ in range(raw >> 20)]
    out.append(comp.compress(b"\0" * (raw & ((1 << 20) - 1))))
    out.append(comp.flush())
    return png_raw(width, height, b"".join(out))


def bmp(pixels: np.ndarray) -> bytes:
    """A 24-bit bottom-up BMP of ``pixels``."""
    h, w, _ = pixels.shape
    stride = (w * 3 + 3) & ~3
    rows = b"".join(pixels[y, :, ::-1].tobytes().ljust(stride, b"\0") for y in range(h - 1, -1, -1))
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, len(rows), 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + len(rows), 0, 0, 54) + info + rows


#: A 1 x 1 GIF: one white pixel (the smallest well-known one, without its transparency).
GIF_1X1 = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00,\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)


def gif_screen(width: int, height: int) -> bytes:
    """:data:`GIF_1X1` with another logical screen size."""
    return GIF_1X1[:6] + struct.pack("<HH", width, height) + GIF_1X1[10:]


def wav(samples: np.ndarray, rate: int, channels: int = 1) -> bytes:
    """A 16-bit PCM WAV of ``samples`` (float in [-1, 1], interleaved when stereo)."""
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def wav_header(rate: int, channels: int, bits: int, data_bytes: int, tag: int = 1, present: int = 0) -> bytes:
    """A WAV header that declares ``data_bytes`` of samples, followed by ``present``
    bytes of them."""
    align = channels * bits // 8
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align, align, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", data_bytes)
    return b"RIFF" + struct.pack("<I", min(len(body) + data_bytes, 0xFFFFFFFF)) + body + b"\0" * present


def flac_header(rate: int, channels: int, bits: int, samples: int) -> bytes:
    """A FLAC stream's marker and STREAMINFO block (no frames)."""
    info = (rate << 44) | ((channels - 1) << 41) | ((bits - 1) << 36) | samples
    body = struct.pack(">HH", 4096, 4096) + b"\0" * 6 + info.to_bytes(8, "big") + b"\0" * 16
    return b"fLaC" + bytes([0x80]) + len(body).to_bytes(3, "big") + body


def _crc8(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16(data: bytes) -> int:
    crc = 0
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def flac(samples: np.ndarray, rate: int) -> bytes:
    """A mono 16-bit FLAC of ``samples`` (float in [-1, 1]): one frame per 4096 samples,
    each a VERBATIM subframe (FLAC without compression, which every decoder reads)."""
    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype(np.int64)
    frames = []
    for number, off in enumerate(range(0, len(pcm), 4096)):
        block = pcm[off : off + 4096]
        # sync, fixed blocksize; block size code 7 (16-bit n-1 follows); rate code 0
        # (from STREAMINFO); mono; 16-bit; frame number (UTF-8 coded, < 128 here)
        assert number < 128
        head = bytes([0xFF, 0xF8, 0x70, 0x08, number]) + struct.pack(">H", len(block) - 1)
        head += bytes([_crc8(head)])
        bits = "0" + "000001" + "0"  # subframe header: VERBATIM, no wasted bits
        bits += "".join(format(int(v) & 0xFFFF, "016b") for v in block)
        bits += "0" * (-len(bits) % 8)
        body = head + int(bits, 2).to_bytes(len(bits) // 8, "big")
        frames.append(body + struct.pack(">H", _crc16(body)))
    return flac_header(rate, 1, 16, len(pcm)) + b"".join(frames)
