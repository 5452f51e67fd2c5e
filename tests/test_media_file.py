"""Image and sound files: llama_cffi.media_file's header checks, and reading files through
libmtmd's decoders (Image.open, Projector.open_media) against libmtmd's own helper, as
llama-mtmd-cli reads them.

The hostile files (claimed sizes far beyond the file, deflate bombs, truncations, files of
no format) are refused by the header checks before any C runs; the fuzzed files (bytes of
real files flipped and cut) go all the way through the decoders in a spawned child under
an address-space cap, which must end every one in an Image, an Audio or an
InvalidMediaError and exit normally."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from benchmarks.native_tools import llama_cpp_source_dir
from llama_cffi import InvalidMediaError, MediaNotFoundError, ParamError
from llama_cffi.media import Audio, Image
from llama_cffi.media_file import check_media
from llama_cffi.mtmd import Projector
from llama_cffi.testing import write_tiny_gemma3_mmproj, write_tiny_ultravox_mmproj
from tests import media_files as mf
from tests.conftest import run_isolated

BOUNDS = {"max_pixels": 1 << 26, "max_seconds": 3600.0}
MTMD = llama_cpp_source_dir() / "tools" / "mtmd"


def _pixels(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _tone(n: int, rate: int = 16000) -> np.ndarray:
    t = np.arange(n) / rate
    return (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


def test_headers_of_valid_files() -> None:
    jpeg = (MTMD / "test-1.jpeg").read_bytes()
    mp3 = (MTMD / "test-2.mp3").read_bytes()
    cases = [
        (mf.png(_pixels(7, 9)), ("image", "png", 9, 7)),
        (mf.bmp(_pixels(5, 3)), ("image", "bmp", 3, 5)),
        (mf.GIF_1X1, ("image", "gif", 1, 1)),
        (jpeg, ("image", "jpeg", None, None)),
    ]
    for data, (kind, fmt, w, h) in cases:
        head = check_media(data, **BOUNDS)
        assert (head.kind, head.format) == (kind, fmt)
        if w is not None:
            assert (head.width, head.height) == (w, h)
    head = check_media(mf.wav(_tone(8000), 16000), **BOUNDS)
    assert (head.kind, head.format, head.sample_rate, head.channels, head.seconds) == ("audio", "wav", 16000, 1, 0.5)
    head = check_media(mf.flac(_tone(10000), 16000), **BOUNDS)
    assert (head.format, head.sample_rate, head.seconds) == ("flac", 16000, 0.625)
    # a truncated WAV (or one written as a stream) is the samples it holds, as dr_wav reads it
    head = check_media(mf.wav_header(16000, 1, 16, 0xFFFFFFFF, present=800), **BOUNDS)
    assert (head.format, head.seconds) == ("wav", 0.025)
    head = check_media(mp3, **BOUNDS)
    assert head.format == "mp3" and head.sample_rate in (16000, 22050, 24000, 32000, 44100, 48000)
    assert 1 < head.seconds < 60


#: name -> (file bytes, the InvalidMediaError's message); max_seconds=2 for all
HOSTILE: dict[str, tuple[bytes, str]] = {
    "png_huge": (mf.png_raw(65535, 65535, zlib.compress(b"\0" * 100)), "more than max_pixels"),
    "png_long_side": (mf.png_raw(1 << 25, 1, zlib.compress(b"\0")), "a side is over"),
    "png_zero_width": (mf.png_raw(0, 5, zlib.compress(b"\0")), "a side is zero"),
    "png_bomb": (mf.png_bomb(), "inflates to more than"),
    "png_truncated": (mf.png(_pixels(8, 8))[:60], "truncated"),
    "png_no_pixels": (mf.png(_pixels(2, 2))[:33] + mf._chunk(b"IEND", b""), "no pixel data"),
    "png_bad_format": (mf.png_raw(2, 2, zlib.compress(b"\0" * 14), color=5), "unknown pixel format"),
    "png_bad_deflate": (mf.png_raw(2, 2, b"\x78\x9c\xff\xff\xff"), "does not inflate"),
    "jpeg_huge": (b"\xff\xd8\xff\xc0\x00\x11\x08\xea\x60\xea\x60\x03" + b"\0" * 9 + b"\xff\xd9", "max_pixels"),
    "jpeg_no_frame": (b"\xff\xd8\xff\xe0\x00\x10JFIF\0" + b"\0" * 7, "truncated before its frame header"),
    "jpeg_dnl": (b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x10\x03" + b"\0" * 9, "DNL"),
    "jpeg_scan_first": (b"\xff\xd8\xff\xda\x00\x08" + b"\0" * 6, "no frame header"),
    "gif_huge": (mf.gif_screen(65535, 65535), "more than max_pixels"),
    "bmp_huge": (mf.bmp(_pixels(1, 1))[:18] + (40000).to_bytes(4, "little") * 2 + b"\0" * 40, "max_pixels"),
    "bmp_negative_width": (mf.bmp(_pixels(1, 1))[:18] + (-5).to_bytes(4, "little", signed=True) * 2, "negative"),
    "wav_too_long": (mf.wav_header(16000, 1, 16, 3 * 32000, present=3 * 32000), "more than max_seconds=2"),
    "wav_zero_rate": (mf.wav_header(0, 1, 16, 100, present=100), "sample rate is 0 Hz"),
    "wav_zero_channels": (mf.wav_header(16000, 0, 16, 100, present=100), "0 channels"),
    "wav_12_bit": (mf.wav_header(16000, 1, 12, 100, present=100), "12-bit samples"),
    "wav_unknown_format": (mf.wav_header(16000, 1, 16, 100, tag=0x50, present=100), "not one miniaudio decodes"),
    "wav_no_data": (mf.wav_header(16000, 1, 16, 100)[:36], "no data chunk"),
    "flac_huge": (mf.flac_header(16000, 1, 16, (1 << 36) - 1), "more than max_seconds=2"),
    "flac_unknown_length": (mf.flac_header(16000, 1, 16, 0), "does not say how many samples"),
    "flac_zero_rate": (mf.flac_header(0, 1, 16, 1000), "sample rate is 0 Hz"),
    "mp3_no_frames": (b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"garbage" * 100, "no MPEG audio frame"),
    "id3_bad_size": (b"ID3\x03\x00\x00\x80\x00\x00\x00" + b"\0" * 20, "ID3 tag is malformed"),
    "webp": (b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\0" * 8, "WebP"),
    "ogg": (b"OggS" + b"\0" * 60, "Ogg files are not read"),
    "tga_like": (bytes(range(64)), "not a file of a format read here"),
    "empty": (b"", "not a file of a format read here"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_are_refused_from_their_headers(name: str) -> None:
    data, message = HOSTILE[name]
    with pytest.raises(InvalidMediaError, match=message):
        check_media(data, max_pixels=1 << 26, max_seconds=2)


def test_a_long_mp3_is_refused_from_its_frames() -> None:
    mp3 = (MTMD / "test-2.mp3").read_bytes()
    seconds = check_media(mp3, **BOUNDS).seconds
    with pytest.raises(InvalidMediaError, match="MP3 file lasts over"):
        check_media(mp3, max_pixels=1, max_seconds=seconds / 2)


# ---------------------------------------------------------------------- decoding
@pytest.fixture(scope="module")
def projectors(tiny_model: llama_cffi.Model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Projector]:
    folder = tmp_path_factory.mktemp("mmproj")
    g3 = Projector(tiny_model, write_tiny_gemma3_mmproj(folder / "g3.gguf", tiny_model.n_embd_inp), n_threads=2)
    uv = Projector(tiny_model, write_tiny_ultravox_mmproj(folder / "uv.gguf", tiny_model.n_embd_inp), n_threads=2)
    yield {"image": g3, "audio": uv}  # type: ignore[misc]
    g3.close()
    uv.close()


def _helper(p: Projector, data: bytes) -> tuple[np.ndarray, str]:
    """libmtmd's own helper on the bytes (what llama-mtmd-cli runs): the pixels or samples, and the id."""
    from llama_cffi._binding import ffi, lib

    w = lib.mtmd_helper_bitmap_init_from_buf(p._ptr(), data, len(data), False, lib.mtmd_helper_init_opt_default())
    bm = w.bitmap
    assert bm != ffi.NULL
    try:
        n = lib.mtmd_bitmap_get_n_bytes(bm)
        raw = np.frombuffer(ffi.buffer(lib.mtmd_bitmap_get_data(bm), n), np.uint8).copy()
        name = ffi.string(lib.mtmd_bitmap_get_id(bm)).decode()
        if lib.mtmd_bitmap_is_audio(bm):
            return raw.view(np.float32), name
        return raw.reshape(lib.mtmd_bitmap_get_ny(bm), lib.mtmd_bitmap_get_nx(bm), 3), name
    finally:
        lib.mtmd_bitmap_free(bm)


def test_files_read_as_libmtmds_helper_reads_them(projectors: dict[str, Projector], tmp_path: Path) -> None:
    """llama.cpp's test image and sound, and files written here: the same pixels or
    samples and the same id (SHA-256 of the file) as mtmd_helper_bitmap_init_from_buf,
    from a path and from bytes."""
    image_p, audio_p = projectors["image"], projectors["audio"]
    files = {
        "test-1.jpeg": ((MTMD / "test-1.jpeg").read_bytes(), image_p),
        "test-2.mp3": ((MTMD / "test-2.mp3").read_bytes(), audio_p),
        "a.png": (mf.png(_pixels(13, 17)), image_p),
        "a.bmp": (mf.bmp(_pixels(6, 5)), image_p),
        "a.gif": (mf.GIF_1X1, image_p),
        "a.wav": (mf.wav(_tone(12000, 22050), 22050), audio_p),  # resampled to 16 kHz
        "stereo.wav": (mf.wav(np.repeat(_tone(9000), 2), 16000, channels=2), audio_p),
        "a.flac": (mf.flac(_tone(9000), 16000), audio_p),
    }
    for name, (data, p) in files.items():
        want, want_id = _helper(p, data)
        path = tmp_path / name
        path.write_bytes(data)
        for source in (path, str(path), data, bytearray(data)):
            got = p.open_media(source)
            arr = got.pixels if isinstance(got, Image) else got.samples
            assert arr.dtype == want.dtype and np.array_equal(arr, want), name
            assert got.id == want_id, name
        if isinstance(got, Image):
            assert np.array_equal(Image.open(path).pixels, want)
        else:
            assert got.sample_rate == 16000
            with pytest.raises(InvalidMediaError, match="not an image"):
                Image.open(path)


def test_lossless_files_hold_their_pixels_and_samples(projectors: dict[str, Projector]) -> None:
    pixels = _pixels(9, 11, seed=4)
    assert np.array_equal(Image.open(mf.png(pixels)).pixels, pixels)
    assert np.array_equal(Image.open(mf.bmp(pixels)).pixels, pixels)
    assert np.array_equal(Image.open(mf.GIF_1X1).pixels, np.full((1, 1, 3), 255, np.uint8))
    tone = _tone(9000)
    from_wav = projectors["audio"].open_media(mf.wav(tone, 16000))
    from_flac = projectors["audio"].open_media(mf.flac(tone, 16000))
    assert isinstance(from_wav, Audio) and isinstance(from_flac, Audio)
    assert np.array_equal(from_wav.samples, from_flac.samples)  # both 16-bit PCM of the same tone
    assert np.abs(from_wav.samples - tone).max() <= 1 / 32767


def test_reading_files_checks_its_arguments(projectors: dict[str, Projector], tmp_path: Path) -> None:
    with pytest.raises(MediaNotFoundError, match="no such file"):
        Image.open(tmp_path / "missing.png")
    with pytest.raises(InvalidMediaError, match="is a directory"):
        projectors["image"].open_media(tmp_path)
    with pytest.raises(TypeError, match="source"):
        Image.open(12)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_pixels"):
        Image.open(mf.GIF_1X1, max_pixels=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_seconds"):
        projectors["audio"].open_media(mf.GIF_1X1, max_seconds="1")  # type: ignore[arg-type]
    with pytest.raises(ParamError, match="NUL"):
        Image.open("a\0b.png")
    with pytest.raises(InvalidMediaError, match="takes no audio"):
        projectors["image"].open_media(mf.wav(_tone(4000), 16000))
    with pytest.raises(InvalidMediaError, match="takes no images"):
        projectors["audio"].open_media(mf.GIF_1X1)
    with pytest.raises(InvalidMediaError, match="more than max_pixels=50"):
        Image.open(mf.png(_pixels(8, 8)), max_pixels=50)
    with pytest.raises(InvalidMediaError, match=r"more than max_seconds=0\.5"):
        projectors["audio"].open_media(mf.wav(_tone(16000), 16000), max_seconds=0.5)


_FUZZ_CHILD = """
import json, resource, random, sys
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
import llama_cffi
from llama_cffi.media import Image, Audio
from llama_cffi.mtmd import Projector
with open(INPUTS) as f:
    FILES, HOSTILE = json.load(f)
files = {name: bytes.fromhex(h) for name, h in FILES.items()}
model = llama_cffi.Model.load(MODEL)
projectors = {k: Projector(model, p, n_threads=1, warmup=False) for k, p in MMPROJ.items()}
rng = random.Random(1234)
counts = {}
for name, data in files.items():
    for i in range(N):
        b = bytearray(data)
        how = i % 4
        if how == 0:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif how == 1:  # cut
            b = b[: rng.randrange(len(b))]
        elif how == 2:  # flip bytes in the first 64 (the headers)
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(min(64, len(b)))] = rng.randrange(256)
        else:  # cut and flip
            b = b[: rng.randrange(1, len(b))]
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        p = projectors["audio" if name in ("mp3", "wav", "flac") else "image"]
        try:
            got = p.open_media(bytes(b), max_seconds=120)
            key = type(got).__name__
        except llama_cffi.InvalidMediaError:
            key = "InvalidMediaError"
        counts[key] = counts.get(key, 0) + 1
hostile = {}
for name, h in HOSTILE.items():
    data = bytes.fromhex(h)
    p = projectors["audio" if name.split("_")[0] in ("wav", "mp3", "flac", "id3", "ogg") else "image"]
    try:
        p.open_media(data, max_seconds=2)
        hostile[name] = "no error"
    except Exception as e:
        hostile[name] = type(e).__name__ + ": " + str(e)
for p in projectors.values():
    p.close()
model.close()
print(json.dumps([counts, hostile]))
"""


@pytest.mark.slow
def test_fuzzed_files_end_in_media_or_typed_errors(
    tiny_model: llama_cffi.Model, tiny_model_path: Path, tmp_path: Path
) -> None:
    """Bytes of real files flipped and cut (1,000 variants of each of 6 files), read by
    the projector of their kind in a spawned child under a 6 GiB address-space cap: each
    ends in an Image, an Audio or an InvalidMediaError; every file of :data:`HOSTILE` ends
    in its InvalidMediaError; and the child exits normally."""
    n_embd = tiny_model.n_embd_inp
    mmproj = {
        "image": str(write_tiny_gemma3_mmproj(tmp_path / "g3.gguf", n_embd)),
        "audio": str(write_tiny_ultravox_mmproj(tmp_path / "uv.gguf", n_embd)),
    }
    files = {
        "jpeg": (MTMD / "test-1.jpeg").read_bytes()[:20000],  # the headers and the first scan data
        "mp3": (MTMD / "test-2.mp3").read_bytes()[:20000],
        "png": mf.png(_pixels(24, 32)),
        "gif": mf.GIF_1X1,
        "wav": mf.wav(_tone(4000), 16000),
        "flac": mf.flac(_tone(5000), 16000),
    }
    inputs = tmp_path / "inputs.json"
    hostile_hex = {k: v.hex() for k, (v, _) in HOSTILE.items()}
    inputs.write_text(json.dumps([{k: v.hex() for k, v in files.items()}, hostile_hex]))
    code = f"INPUTS = {str(inputs)!r}\nMODEL = {str(tiny_model_path)!r}\nMMPROJ = {mmproj!r}\nN = 1000\n" + _FUZZ_CHILD
    r = run_isolated(code, timeout=900)
    assert r.returncode == 0, f"child died ({r.returncode}): {r.stderr[-3000:]}"
    counts, hostile = json.loads(r.stdout.strip().splitlines()[-1])
    for name, (_, message) in HOSTILE.items():
        assert hostile[name].startswith("InvalidMediaError: "), (name, hostile[name])
        assert re.search(message, hostile[name]), (name, hostile[name])
    assert sum(counts.values()) == 1000 * len(files)
    assert counts.get("InvalidMediaError", 0) > 0 and counts.get("Image", 0) > 0 and counts.get("Audio", 0) > 0


def test_libmtmds_helper_itself_dies_where_the_check_refuses(projectors: dict[str, Projector]) -> None:
    """Why the headers are read first: a FLAC whose STREAMINFO claims 2**36 samples (and
    that holds none), given to libmtmd's helper directly (as llama-mtmd-cli does) in a
    spawned child under a 6 GiB address-space cap, ends the process (its std::vector
    cannot be allocated: std::terminate); through open_media it is an InvalidMediaError."""
    data, _ = HOSTILE["flac_huge"]
    code = f"""
import resource
resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
import llama_cffi
from llama_cffi._binding import ffi, lib
from llama_cffi.mtmd import Projector
model = llama_cffi.Model.load({str(projectors["audio"].model.path)!r})
p = Projector(model, {projectors["audio"].path!r}, n_threads=1, warmup=False)
data = bytes.fromhex({data.hex()!r})
print("calling", flush=True)
w = lib.mtmd_helper_bitmap_init_from_buf(p._ptr(), data, len(data), False, lib.mtmd_helper_init_opt_default())
print("returned", w.bitmap != ffi.NULL)
"""
    r = run_isolated(code, timeout=300)  # GGML_NO_BACKTRACE: no gdb
    assert "calling" in r.stdout
    assert r.returncode != 0 and "returned" not in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "bad_alloc" in r.stderr
    with pytest.raises(InvalidMediaError, match="more than max_seconds=3600"):
        projectors["audio"].open_media(data)
