"""llama_cffi.mtmd.Projector: libmtmd's context over the tiny projectors of
llama_cffi.testing (an image one of type gemma3 and an audio one of type ultravox, written
for the tiny text model's embedding width), its capabilities as libmtmd reports them,
its arguments, and its lifetime against the model's."""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import llama_cffi
from benchmarks.native_tools import build_llama_tool, llama_cpp_source_dir
from llama_cffi import ClosedError, InvalidModelError, ParamError
from llama_cffi.media import Audio, Image
from llama_cffi.mtmd import Projector, available
from llama_cffi.testing import write_tiny_gemma3_mmproj, write_tiny_ultravox_mmproj


@pytest.fixture(scope="module")
def gemma3_mmproj(tiny_model: llama_cffi.Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma3_mmproj(tmp_path_factory.mktemp("mmproj") / "g3.gguf", tiny_model.n_embd_inp)


@pytest.fixture(scope="module")
def ultravox_mmproj(tiny_model: llama_cffi.Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_ultravox_mmproj(tmp_path_factory.mktemp("mmproj") / "uv.gguf", tiny_model.n_embd_inp)


@pytest.fixture(scope="module")
def qwen2vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from llama_cffi.testing import write_tiny_qwen2vl_mmproj, write_tiny_qwen2vl_model

    folder = tmp_path_factory.mktemp("qwen2vl")
    model = write_tiny_qwen2vl_model(folder / "text.gguf")
    with llama_cffi.Model.load(model) as m:
        n_embd = m.n_embd_inp
    return model, write_tiny_qwen2vl_mmproj(folder / "mmproj.gguf", n_embd)


def test_this_build_has_libmtmd() -> None:
    assert available()
    assert llama_cffi.build_info()["options"]["LLAMA_BUILD_MTMD"] == "ON"


def test_image_projector(tiny_model: llama_cffi.Model, gemma3_mmproj: Path) -> None:
    with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p:
        assert (p.vision_projector, p.audio_projector) == ("gemma3", None)
        assert p.supports_vision and not p.supports_audio
        assert p.audio_sample_rate is None
        assert p.uses_non_causal  # gemma3's image tokens attend to each other
        assert not p.uses_mrope
        assert p.media_marker == "<__media__>"
        assert "gemma3" in repr(p)
    assert p.closed
    with pytest.raises(ClosedError):
        _ = p.supports_vision


def test_audio_projector(tiny_model: llama_cffi.Model, ultravox_mmproj: Path) -> None:
    with Projector(tiny_model, ultravox_mmproj, n_threads=2, media_marker="<sound>") as p:
        assert (p.vision_projector, p.audio_projector) == (None, "ultravox")
        assert p.supports_audio and not p.supports_vision
        assert p.audio_sample_rate == 16000  # Whisper's
        assert p.media_marker == "<sound>"


def test_arguments_are_checked(tiny_model: llama_cffi.Model, gemma3_mmproj: Path, tmp_path: Path) -> None:
    for kwargs, error, message in [
        ({"n_threads": 0}, ParamError, r"n_threads must be in \[1, 512\]"),
        ({"n_threads": 2.0}, TypeError, "n_threads"),
        ({"image_min_tokens": 0}, ParamError, "image_min_tokens must be at least 1"),
        ({"image_min_tokens": 9, "image_max_tokens": 4}, ParamError, "is more than image_max_tokens"),
        ({"media_marker": ""}, ParamError, "media_marker must be a non-empty"),
        ({"media_marker": "a\0b"}, ParamError, "NUL"),
        ({"use_gpu": 1}, TypeError, "use_gpu"),
    ]:
        with pytest.raises(error, match=message):
            Projector(tiny_model, gemma3_mmproj, **kwargs)
    with pytest.raises(TypeError, match="model"):
        Projector("model.gguf", gemma3_mmproj)  # type: ignore[arg-type]
    other = write_tiny_gemma3_mmproj(tmp_path / "wide.gguf", tiny_model.n_embd_inp * 2)
    with pytest.raises(InvalidModelError, match="not the text model's embedding width"):
        Projector(tiny_model, other)


def test_the_model_outlives_its_projector(tiny_model_path: Path, gemma3_mmproj: Path) -> None:
    """Closing the model while a projector uses it marks it closed at once and frees it
    with the projector (libmtmd keeps the model's pointer); a closed model takes no new
    projector."""
    model = llama_cffi.Model.load(tiny_model_path)
    p = Projector(model, gemma3_mmproj, warmup=False)
    model.close()
    assert model.closed and not p.closed
    assert p.supports_vision  # still usable: the model's memory is still there
    p.close()
    with pytest.raises(ClosedError):
        Projector(model, gemma3_mmproj)


# ---------------------------------------------------------------------- media and prompts
def test_tokenize_splits_text_and_media(tiny_model: llama_cffi.Model, gemma3_mmproj: Path) -> None:
    rng = np.random.default_rng(0)
    image = Image(rng.integers(0, 256, (48, 80, 3), dtype=np.uint8), id="img-1")
    with (
        Projector(tiny_model, gemma3_mmproj, n_threads=2) as p,
        p.tokenize(f"look: {p.media_marker} and again {p.media_marker}.", [image, image]) as chunks,
    ):
        kinds = [c.kind for c in chunks]
        assert kinds == ["text", "image", "text", "image", "text"]
        assert [c.n_tokens for c in chunks if c.kind == "image"] == [16, 16]  # 8x8 patches pooled 2x2
        assert chunks[1].id == "img-1" and chunks[0].id is None
        assert chunks[0].tokens[0] == tiny_model.vocab.bos  # add_special
        assert chunks.n_tokens == sum(c.n_tokens for c in chunks) == chunks.n_pos  # no M-RoPE
        emb = p.encode(chunks[1])
        assert emb.shape == (16, tiny_model.n_embd_inp) and emb.dtype == np.float32 and np.isfinite(emb).all()
        assert np.array_equal(p.encode(chunks[3]), emb)  # the same image, the same embeddings
        with pytest.raises(ParamError, match="text chunk"):
            p.encode(chunks[0])
        with pytest.raises(ParamError, match="2 media markers"):
            p.tokenize(f"{p.media_marker} {p.media_marker}", [image])
        with pytest.raises(ParamError, match="takes no audio"):
            p.tokenize(p.media_marker, [Audio(np.zeros(16000, np.float32), 16000)])
        with pytest.raises(TypeError, match="media"):
            p.tokenize(p.media_marker, image)  # type: ignore[arg-type]
    assert chunks.closed


def test_media_checks() -> None:
    ok = np.zeros((4, 4, 3), np.uint8)
    for arr, error, message in [
        (np.zeros((4, 4), np.uint8), ParamError, r"shape \(height, width, 3\)"),
        (np.zeros((4, 4, 3), np.float32), ParamError, "uint8"),
        (np.zeros((0, 4, 3), np.uint8), ParamError, "at least one pixel"),
        (np.zeros((1, 65, 3), np.uint8), ParamError, "more than 64 times"),
    ]:
        with pytest.raises(error, match=message):
            Image(arr)
    with pytest.raises(ParamError, match="more than max_pixels=15"):
        Image(ok, max_pixels=15)
    with pytest.raises(TypeError, match="pixels"):
        Image([[0, 0, 0]])  # type: ignore[arg-type]
    img = Image(ok)
    ok[0, 0, 0] = 9
    assert img.pixels[0, 0, 0] == 0 and not img.pixels.flags.writeable  # its own copy
    for samples, rate, message in [
        (np.zeros(1, np.float32), 16000, "at least 2 samples"),
        (np.zeros(8, np.float64), 16000, "float32"),
        (np.zeros((2, 8), np.float32), 16000, "1-D"),
        (np.array([0.0, np.nan], np.float32), 16000, "finite"),
        (np.zeros(8, np.float32), 0, "positive"),
        (np.zeros(16001, np.float32), 16000, "max_seconds=1"),
    ]:
        with pytest.raises(ParamError, match=message):
            Audio(samples, rate, max_seconds=1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["image", "audio"])
def test_embeddings_equal_llama_mtmd_clis(
    tiny_model: llama_cffi.Model,
    tiny_model_path: Path,
    gemma3_mmproj: Path,
    ultravox_mmproj: Path,
    tmp_path: Path,
    kind: str,
) -> None:
    """The encoder's output for llama.cpp's own test image (tools/mtmd/test-1.jpeg, with the
    tiny gemma3 projector) and test sound (test-2.mp3, with the tiny ultravox projector),
    against llama-mtmd-cli built from the same source (its MTMD_DEBUG_EMBEDDINGS dump of the
    last encode), both on 2 threads: bit for bit."""
    cli = build_llama_tool("llama-mtmd-cli")
    media = llama_cpp_source_dir() / "tools" / "mtmd" / ("test-1.jpeg" if kind == "image" else "test-2.mp3")
    mmproj = gemma3_mmproj if kind == "image" else ultravox_mmproj
    dump = tmp_path / "emb.bin"
    r = subprocess.run(
        [str(cli), "-m", str(tiny_model_path), "--mmproj", str(mmproj), f"--{kind}", str(media),
         "-p", "describe", "-n", "1", "--temp", "0", "-t", "2"],
        env=dict(os.environ, MTMD_DEBUG_EMBEDDINGS=str(dump)), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    raw = dump.read_bytes()
    n_tok, n_embd = struct.unpack("<ii", raw[:8])
    want = np.frombuffer(raw[8:], np.float32).reshape(n_tok, n_embd)
    with Projector(tiny_model, mmproj, n_threads=2) as p:
        item = p.open_media(media)  # as the tool reads it: tests/test_media_file.py
        assert isinstance(item, Image if kind == "image" else Audio)
        with p.tokenize(f"describe {p.media_marker}", [item]) as chunks:
            last = [c for c in chunks if c.kind == kind][-1]  # the dump holds the last encode
            got = p.encode(last)
    assert got.shape == want.shape
    assert np.array_equal(got, want)


# ---------------------------------------------------------------------- decoding
def _helper_eval(p: Projector, ctx: llama_cffi.Context, chunks: object, n_batch: int) -> tuple[int, np.ndarray]:
    """libmtmd's own mtmd_helper_eval_chunks (what llama-mtmd-cli runs), on a fresh context."""
    from llama_cffi._binding import ffi, lib

    new = ffi.new("llama_pos *")
    assert lib.mtmd_helper_eval_chunks(p._ptr(), ctx._ptr(), chunks._ptr(), 0, 0, n_batch, True, new) == 0  # type: ignore[attr-defined]
    row = ffi.unpack(lib.llama_get_logits_ith(ctx._ptr(), -1), ctx.n_vocab)
    return int(new[0]), np.array(row, np.float32)


@pytest.mark.parametrize(("kind", "n_batch"), [("image", 32), ("image", 5), ("audio", 32)])
def test_eval_equals_libmtmds_helper(
    tiny_model: llama_cffi.Model, gemma3_mmproj: Path, ultravox_mmproj: Path, kind: str, n_batch: int
) -> None:
    """Projector.eval (text through Context.decode, media through Context.decode_embeddings,
    Gemma 3's image with causal attention off) against mtmd_helper_eval_chunks on a fresh
    context of the same shape: the same next position and the same last logits, bit for
    bit (the same pieces of n_batch; exact because both run the same decodes)."""
    rng = np.random.default_rng(3)
    if kind == "image":
        mmproj, item = gemma3_mmproj, Image(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))
    else:
        mmproj, item = ultravox_mmproj, Audio((rng.standard_normal(24000) * 0.1).astype(np.float32), 16000)
    with (
        Projector(tiny_model, mmproj, n_threads=2) as p,
        p.tokenize(f"hello {p.media_marker} what is it", [item]) as ch,
    ):
        n_pos = ch.n_pos
        got = []
        for way in ("ours", "libmtmd"):
            with tiny_model.context(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2) as ctx:
                if way == "ours":
                    n = p.eval(ctx, ch, n_batch=n_batch)
                    got.append((n, np.array(ctx.logits(), np.float32), ctx.causal_attn))
                else:
                    got.append((*_helper_eval(p, ctx, ch, n_batch), ctx.causal_attn))
                assert ctx.memory.seq_pos_max(0) == got[-1][0] - 1
    (n0, l0, c0), (n1, l1, c1) = got
    assert n0 == n1 == n_pos
    assert c0 and c1  # causal attention is on again
    assert np.array_equal(l0, l1)


def test_eval_checks_before_decoding(tiny_model: llama_cffi.Model, gemma3_mmproj: Path, tiny_model_path: Path) -> None:
    image = Image(np.zeros((16, 16, 3), np.uint8))
    with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p, p.tokenize(f"a {p.media_marker}", [image]) as ch:
        # the 16-token image is decoded non-causally, in one piece of 16: more than n_ubatch=8
        with tiny_model.context(n_ctx=256, n_batch=64, n_ubatch=8) as ctx:
            with pytest.raises(llama_cffi.InvalidBatchError, match="must fit one micro-batch"):
                p.eval(ctx, ch)
            assert ctx.memory.seq_pos_max(0) == -1  # nothing decoded
            assert p.eval(ctx, ch, n_batch=8) == ch.n_pos  # pieces of 8 fit
        with tiny_model.context(n_ctx=256, n_batch=256) as ctx:
            ctx.decode([5] * (ctx.n_ctx_seq - 4))
            with pytest.raises(llama_cffi.KvCacheFullError):
                p.eval(ctx, ch)
            assert ctx.memory.seq_pos_max(0) == ctx.n_ctx_seq - 5  # nothing decoded
        with tiny_model.context(n_ctx=256) as ctx:
            with pytest.raises(ParamError, match=r"n_batch must be in \[1"):
                p.eval(ctx, ch, n_batch=0)
            with pytest.raises(TypeError, match="chunks"):
                p.eval(ctx, [ch])  # type: ignore[arg-type]
        other = llama_cffi.Model.load(tiny_model_path)
        try:
            with other.context(n_ctx=256) as ctx, pytest.raises(ParamError, match="another model"):
                p.eval(ctx, ch)
        finally:
            other.close()


def test_decode_embeddings_checks(tiny_model: llama_cffi.Model) -> None:
    with tiny_model.context(n_ctx=64, n_batch=16) as ctx:
        e = np.zeros((3, tiny_model.n_embd_inp), np.float32)
        assert ctx.decode_embeddings(e, logits="last") is not None
        assert ctx.memory.seq_pos_max(0) == 2
        with pytest.raises(llama_cffi.InvalidBatchError, match="width"):
            ctx.decode_embeddings(np.zeros((2, 5), np.float32))
        with pytest.raises(TypeError, match="embd"):
            ctx.decode_embeddings(e.astype(np.float64))
        with pytest.raises(llama_cffi.InvalidBatchError, match="must start at 3"):
            ctx.decode_embeddings(e, pos=0)
        ctx.decode_embeddings(np.zeros((40, tiny_model.n_embd_inp), np.float32))  # 3 pieces of n_batch
        assert ctx.memory.seq_pos_max(0) == 42


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gemma3", "qwen2vl", "ultravox"])
def test_greedy_continuation_equals_llama_mtmd_clis(
    tiny_model_path: Path, qwen2vl: tuple[Path, Path], tmp_path: Path, kind: str
) -> None:
    """llama-mtmd-cli (same source) on a tiny model and projector (the tiny llama model
    with a gemma3 projector and tools/mtmd/test-1.jpeg; the tiny Qwen2-VL pair, whose 391
    image tokens take 23 M-RoPE positions, and the same image; the tiny llama model with
    an ultravox projector and tools/mtmd/test-2.mp3), greedy (``--temp 0``), 8 tokens, 2
    threads: its prompt is the model's chat template around ``<__media__>describe``. The
    same conversation as content parts through Projector.tokenize_chat (the image as a
    file:// URL), eval, and an argmax loop on a context of the tool's defaults (n_ctx
    4096, n_batch 2048, n_ubatch 512, flash attention auto): the same number of prompt
    tokens (its log, at -lv 4, counts them) and the same 8 tokens, byte for byte."""
    import base64
    import re

    cli = build_llama_tool("llama-mtmd-cli")
    media = llama_cpp_source_dir() / "tools" / "mtmd" / ("test-2.mp3" if kind == "ultravox" else "test-1.jpeg")
    model_path = qwen2vl[0] if kind == "qwen2vl" else tiny_model_path
    with llama_cffi.Model.load(model_path) as model:
        if kind == "gemma3":
            mmproj = write_tiny_gemma3_mmproj(tmp_path / "g3.gguf", model.n_embd_inp)
        elif kind == "ultravox":
            mmproj = write_tiny_ultravox_mmproj(tmp_path / "uv.gguf", model.n_embd_inp)
        else:
            mmproj = qwen2vl[1]
        flag = "--audio" if kind == "ultravox" else "--image"
        # llama.cpp's logger is asynchronous and deliberately never joined at exit
        # (common/log.cpp, common_log_main: "logs may be lost if not flushed before the
        # program exits"), so the timings line printed last is sometimes missing: the tool
        # is run again then, at most twice more (its output is deterministic: greedy)
        for _attempt in range(3):
            r = subprocess.run(
                [str(cli), "-m", str(model_path), "--mmproj", str(mmproj), flag, str(media),
                 "-p", "describe", "-n", "8", "--temp", "0", "-t", "2", "-lv", "4"],
                capture_output=True, timeout=900,
            )  # fmt: skip
            assert r.returncode == 0, r.stderr[-3000:]
            m = re.search(rb"prompt eval time = .* / +(\d+) tokens", r.stderr)
            if m:
                break
        assert m, r.stderr[-3000:]
        with Projector(model, mmproj, n_threads=2) as p:
            assert p.uses_mrope is (kind == "qwen2vl")
            # the cli puts the marker before the prompt, in one user message of the template
            # (ChatML: the default for a model without one, and the tiny Qwen2-VL's own):
            # the same as an image part then a text part, as OpenAI-style content parts
            if kind == "ultravox":  # OpenAI's input_audio: base64 data and its format
                data = base64.b64encode(media.read_bytes()).decode()
                part: dict = {"type": "input_audio", "input_audio": {"data": data, "format": "mp3"}}
            else:
                part = {"type": "image_url", "image_url": {"url": "file:///" + media.name}}
            parts = [part, {"type": "text", "text": "describe"}]
            prompt, chunks = p.tokenize_chat([{"role": "user", "content": parts}], media_path=media.parent)
            assert prompt.prompt == f"<|im_start|>user\n{p.media_marker}describe<|im_end|>\n<|im_start|>assistant\n"
            with chunks:
                assert [c.kind for c in chunks if c.kind != "text"] == ["audio" if kind == "ultravox" else "image"]
                assert chunks.n_tokens == int(m.group(1))
                with model.context(n_ctx=4096, n_batch=2048, n_ubatch=512, n_threads=2, n_threads_batch=2) as ctx:
                    p.eval(ctx, chunks)
                    out = []
                    for _ in range(8):
                        out.append(int(np.argmax(ctx.logits())))
                        ctx.decode_single(out[-1])
        ours = b"".join(model.vocab.token_to_piece(t) for t in out)
    assert r.stdout.strip(b"\n") == ours.strip(b"\n")


def test_eval_encodes_once_per_chunks(tiny_model: llama_cffi.Model, gemma3_mmproj: Path) -> None:
    """The same prompt into two sequences (and another context) runs the encoder once:
    the kept embeddings are decoded again. The logits are bit for bit those of the first
    sequence and of a fresh context: the same positions and batch shapes, on the CPU
    backend, where the other sequence's cells are masked out of the attention exactly."""
    image = Image(np.random.default_rng(5).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p, p.tokenize(f"x {p.media_marker} y", [image]) as ch:
        calls = []
        real = p.encode

        def counting(chunk: object) -> np.ndarray:
            calls.append(chunk)
            return real(chunk)  # type: ignore[arg-type]

        p.encode = counting  # type: ignore[method-assign]
        with tiny_model.context(n_ctx=256, n_seq_max=2, n_threads=2) as ctx:
            p.eval(ctx, ch, seq_id=0)
            first = np.array(ctx.logits())
            p.eval(ctx, ch, seq_id=1)
            second = np.array(ctx.logits())
        with tiny_model.context(n_ctx=256, n_threads=2) as ctx:
            p.eval(ctx, ch)
            fresh = np.array(ctx.logits())
        assert len(calls) == 1
        assert np.array_equal(second, first)
        assert np.array_equal(fresh, first)


# ---------------------------------------------------------------------- chat content parts
def test_media_parts_render_as_llama_cpp_joins_them(tiny_model: llama_cffi.Model) -> None:
    """common/chat.cpp's rule: text parts are joined with a newline, but none is put
    before or after a media marker; an image or sound part is the marker."""
    from llama_cffi.chat import MEDIA_MARKER, _content

    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    snd = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    text = [{"type": "text", "text": t} for t in ("a", "b", "c", "")]
    m = MEDIA_MARKER
    assert _content(0, [text[0], img, text[1], text[2]]) == f"a{m}b\nc"
    assert _content(0, [img, snd, text[0]]) == f"{m}{m}a"
    assert _content(0, [text[3], text[0], img]) == f"a{m}"  # no newline after empty text
    assert _content(0, [{"type": "media_marker", "text": "<m>"}, text[0]]) == "<m>a"
    prompt = tiny_model.format_chat([{"role": "user", "content": [img, text[0]]}], template="chatml").prompt
    assert prompt == f"<|im_start|>user\n{m}a<|im_end|>\n<|im_start|>assistant\n"
    # a template that reads typed parts gets the joined text when media are in them (as in llama.cpp)
    typed = (
        "{% for m in messages %}{% if m.content is string %}S:{{ m.content }}{% else %}"
        "{% for p in m.content %}P:{{ p.text }}{% endfor %}{% endif %}|{% endfor %}"
    )
    pytest.importorskip("jinja2")
    assert (
        tiny_model.apply_chat_template([{"role": "user", "content": [text[0], text[1]]}], template=typed) == "P:aP:b|"
    )
    assert tiny_model.apply_chat_template([{"role": "user", "content": [text[0], img]}], template=typed) == f"S:a{m}|"


def test_media_sources(tmp_path: Path) -> None:
    import base64

    from llama_cffi import ChatTemplateError, InvalidMediaError
    from llama_cffi.chat import media_sources

    data = b"\x89PNG\r\n\x1a\nabc"
    b64 = base64.b64encode(data).decode()
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "a.png").write_bytes(data)
    (tmp_path / "secret.png").write_bytes(data)

    def msg(*parts: dict) -> list[dict]:
        return [{"role": "system", "content": "s"}, {"role": "user", "content": list(parts)}]

    got = media_sources(
        msg(
            {"type": "text", "text": "x"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64}"}},
            {"type": "input_audio", "input_audio": {"data": b64, "format": "wav"}},
            {"type": "image_url", "image_url": "file:///a.png"},
        ),
        media_path=tmp_path / "media",
    )
    assert got == [data, data, str(tmp_path / "media" / "a.png")]
    for url, error, message in [
        ("https://example.com/a.png", InvalidMediaError, "not fetched"),
        ("file:///a.png", InvalidMediaError, "only with media_path"),
        ("data:text/plain;base64,QQ==", InvalidMediaError, "not an image or audio"),
        ("data:image/png,abc", InvalidMediaError, "must be base64"),
        ("data:image/png;base64", InvalidMediaError, "needs a comma"),
        ("photo.jpg", InvalidMediaError, "not a data: URI"),
        ("", ChatTemplateError, "non-empty string"),
    ]:
        with pytest.raises(error, match=message):
            media_sources(msg({"type": "image_url", "image_url": {"url": url}}))
    with pytest.raises(InvalidMediaError, match="outside media_path"):
        media_sources(msg({"type": "image_url", "image_url": {"url": "file://../secret.png"}}), tmp_path / "media")
    with pytest.raises(ChatTemplateError, match="must be an object"):
        media_sources(msg({"type": "input_audio", "input_audio": "AAAA"}))


def test_tokenize_chat(tiny_model: llama_cffi.Model, gemma3_mmproj: Path, ultravox_mmproj: Path) -> None:
    """A conversation with an image part: rendered with the model's template, the image
    read from its data URI, tokenized into text, image, text; the marker as user text is
    refused; a projector with its own marker renders it."""
    import base64

    from tests import media_files as mf

    pixels = np.random.default_rng(2).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    url = "data:image/png;base64," + base64.b64encode(mf.png(pixels)).decode()
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]}
    ]
    with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p:
        prompt, chunks = p.tokenize_chat(messages)
        with chunks:
            assert prompt.prompt == "<|im_start|>user\n<__media__>hi<|im_end|>\n<|im_start|>assistant\n"
            assert [c.kind for c in chunks] == ["text", "image", "text"]
            with p.tokenize(prompt.prompt, [Image(pixels)]) as direct, tiny_model.context(n_ctx=256) as ctx:
                p.eval(ctx, chunks)
                a = np.array(ctx.logits())
                ctx.memory.clear()
                p.eval(ctx, direct)
                assert np.array_equal(a, np.array(ctx.logits()))
        with pytest.raises(ParamError, match="holds the media marker"):
            p.tokenize_chat([{"role": "user", "content": "see <__media__>"}])
    with Projector(tiny_model, gemma3_mmproj, n_threads=2, media_marker="<img>") as p:
        prompt, chunks = p.tokenize_chat(messages)
        assert "<img>hi" in prompt.prompt and [c.kind for c in chunks] == ["text", "image", "text"]
        chunks.close()
    wav = base64.b64encode(mf.wav(np.zeros(8000, np.float32), 16000)).decode()
    sound = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]}]
    with Projector(tiny_model, ultravox_mmproj, n_threads=2) as p:
        _, chunks = p.tokenize_chat(sound)
        assert "audio" in [c.kind for c in chunks]
        chunks.close()
        with pytest.raises(llama_cffi.InvalidMediaError, match="takes no images"):
            p.tokenize_chat(messages)


# ---------------------------------------------------------------------- branches
def test_branch_prompt_with_an_image(tiny_model: llama_cffi.Model, gemma3_mmproj: Path, ultravox_mmproj: Path) -> None:
    """BranchStore.create from Chunks: the branch's logits are those of Projector.eval on a
    fresh context (bit for bit: the same decodes), its history holds a placeholder per
    image cell, forks share the image's cells (seq_cp) and step on from them, and
    operations that would decode an image cell from the history are refused."""
    from samplers.branch import BranchError, BranchStore

    rng = np.random.default_rng(8)
    image = Image(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    other = Image(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
    with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p, p.tokenize(f"a {p.media_marker} b c", [image]) as ch:
        with tiny_model.context(n_ctx=256, n_threads=2) as ctx:
            p.eval(ctx, ch)
            want = np.array(ctx.logits())
        with tiny_model.context(n_ctx=512, n_seq_max=4, kv_unified=True, n_threads=2) as ctx:
            store = BranchStore(ctx)
            root = store.create(ch)
            assert np.array_equal(root.logits, want)
            cells = store.cells(ch)
            assert root.tokens == cells and root.position == ch.n_tokens
            n_text = sum(c.n_tokens for c in ch if c.kind == "text")
            assert cells.count(-1) == ch.n_tokens - n_text and min(cells) == -1
            kid = root.fork()
            assert kid.tokens == root.tokens and np.array_equal(kid.logits, want)
            t = kid.sample()
            store.step({kid: t, root: t})
            assert np.array_equal(kid.logits, root.logits)
            first_image = cells.index(-1)
            with pytest.raises(BranchError, match="cell of an image"):
                root.truncate(first_image + 3)
            with pytest.raises(BranchError, match="cell of an image"):
                root.fork(at=first_image + 16)
            with pytest.raises(BranchError, match="images or sounds"):
                root.clear_and_reseed()  # keeps the whole history, image included
            back = root.fork(at=first_image + 17)  # after the image: its next text token is decoded again
            assert back.tokens == cells[: first_image + 17]
            root.truncate(first_image + 17)
            assert np.array_equal(root.logits, back.logits)
            # another image has another placeholder; the same image keeps its own
            with p.tokenize(f"{p.media_marker} x", [other]) as ch2, p.tokenize(f"{p.media_marker} y", [image]) as ch3:
                assert min(store.cells(ch2)) == -2 and min(store.cells(ch3)) == -1
            with Projector(tiny_model, ultravox_mmproj, n_threads=2) as pa:
                sound = Audio(np.zeros(4000, np.float32), 16000)
                with pa.tokenize(f"x {pa.media_marker}", [sound]) as ch4:
                    assert ch4[len(ch4) - 1].kind == "audio"
                    with pytest.raises(ParamError, match="must end with text"):
                        store.create(ch4)


# ---------------------------------------------------------------------- chat sessions
def test_chat_session_with_images(tiny_model: llama_cffi.Model, gemma3_mmproj: Path) -> None:
    """A ChatSession with a projector: a turn with an image, then text turns. The cache
    holds the rendered conversation (a placeholder per image cell), the later turns
    reuse the image's cells (decoded once), and the logits before each reply equal a
    fresh decode of the whole conversation through Projector.eval (within 2e-3: the
    turns were decoded in other batch shapes, whose F32 kernels sum in another order,
    over an f16 KV cache), with the same greedy reply."""
    import base64

    from samplers.chat import ChatSession
    from tests import media_files as mf

    pixels = np.random.default_rng(11).integers(0, 256, (24, 40, 3), dtype=np.uint8)
    url = "data:image/png;base64," + base64.b64encode(mf.png(pixels)).decode()
    turns = [
        [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is this?"}],
        "And its colour?",
        "Thanks.",
    ]
    with (
        Projector(tiny_model, gemma3_mmproj, n_threads=2) as p,
        tiny_model.context(n_ctx=512, n_seq_max=2, kv_unified=True, n_threads=2) as ctx,
    ):
        s = ChatSession(ctx, system="Be brief.", max_tokens=6, projector=p)
        image_end = 0
        for i, content in enumerate(turns):
            msgs = [*s.window(), {"role": "user", "content": content}]
            _, full_chunks = p.tokenize_chat(msgs)
            with full_chunks:
                full = s.store.cells(full_chunks)
                stream = s.stream(content)
                assert s.tokens == full
                before = s._branch.logits.copy()
                reply = "".join(stream)
                r = stream.reply
                assert r.reused_tokens + r.decoded_tokens == len(full)
                if i == 0:
                    image_end = len(full) - full[::-1].index(-1)
                else:
                    assert r.reused_tokens >= image_end > 16, "the image came from the cache"
                with tiny_model.context(n_ctx=512, n_threads=2) as fresh:
                    p.eval(fresh, full_chunks)
                    row = np.array(fresh.logits(), copy=True)
                np.testing.assert_allclose(before, row, rtol=0, atol=2e-3)
                assert r.text == reply and s.messages[-1]["content"] == reply
        assert s.messages[1]["content"] == turns[0]  # the parts as given

    with tiny_model.context(n_ctx=256) as ctx:
        s = ChatSession(ctx)
        with pytest.raises(ParamError, match="make the session with projector="):
            s.send(turns[0])
        assert s.messages == []
        with Projector(tiny_model, gemma3_mmproj, n_threads=2) as p:
            with pytest.raises(ParamError, match="overflow='shift'"):
                ChatSession(ctx, projector=p, overflow="shift")
            with pytest.raises(TypeError, match="projector"):
                ChatSession(ctx, projector="mmproj.gguf")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- M-RoPE (Qwen2-VL)
@pytest.mark.parametrize("n_batch", [64, 5])
def test_mrope_eval_equals_libmtmds_helper(qwen2vl: tuple[Path, Path], n_batch: int) -> None:
    """A tiny Qwen2-VL pair (M-RoPE positions): the image advances the position by its
    n_pos (< its tokens), its rows get the 2-D grid of positions, and Projector.eval
    equals mtmd_helper_eval_chunks on a fresh context: the same next position and the
    same last logits, bit for bit."""
    model_path, mmproj = qwen2vl
    image = Image(np.random.default_rng(4).integers(0, 256, (56, 84, 3), dtype=np.uint8))
    with llama_cffi.Model.load(model_path) as model:
        assert model.n_pos_per_embd == 4
        with Projector(model, mmproj, n_threads=2) as p, p.tokenize(f"see {p.media_marker} now", [image]) as ch:
            assert p.uses_mrope
            img = next(c for c in ch if c.kind == "image")
            assert img.n_pos < img.n_tokens
            assert ch.n_pos < ch.n_tokens
            got = []
            for way in ("ours", "libmtmd"):
                with model.context(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2) as ctx:
                    if way == "ours":
                        n = p.eval(ctx, ch, n_batch=n_batch)
                        got.append((n, np.array(ctx.logits(), np.float32)))
                    else:
                        got.append(_helper_eval(p, ctx, ch, n_batch))
            (n0, l0), (n1, l1) = got
            assert n0 == n1 == ch.n_pos
            assert np.array_equal(l0, l1)
            # positions are the image's grid: another layout of the same rows gives other logits
            with model.context(n_ctx=512, n_batch=64, n_ubatch=64, n_threads=2) as ctx:
                flat = 0
                for c in ch:
                    if c.kind == "text":
                        ctx.decode(c.tokens, pos=flat, logits="last")
                        flat += c.n_tokens
                    else:
                        ctx.decode_embeddings(p.encode(c), pos=flat)
                        flat += c.n_tokens
                assert not np.array_equal(np.array(ctx.logits(), np.float32), l0)


def test_mrope_checks(qwen2vl: tuple[Path, Path]) -> None:
    """Embeddings into an M-RoPE model: four positions per row (a batch with one would
    make llama.cpp read past its positions: refused), t positions not below the
    sequence's last; branches and chat sessions refuse M-RoPE projectors (their positions
    are their cells)."""
    from samplers.branch import BranchStore
    from samplers.chat import ChatSession

    model_path, mmproj = qwen2vl
    with llama_cffi.Model.load(model_path) as model, model.context(n_ctx=256, n_batch=32) as ctx:
        e = np.zeros((3, model.n_embd_inp), np.float32)
        b = llama_cffi.Batch(4, n_embd=model.n_embd_inp)
        b.embd[:1] = 0
        b.add(0, 0)
        with pytest.raises(llama_cffi.InvalidBatchError, match="reads 4 positions per embedding"):
            ctx.decode_batch(b)
        assert ctx.decode_embeddings(e, logits="last") is not None  # 1-D: each row's four positions equal
        with pytest.raises(TypeError, match="mrope_pos"):
            ctx.decode_embeddings(e, mrope_pos=np.zeros((3, 3), np.int32))
        with pytest.raises(llama_cffi.InvalidBatchError, match="must not go below"):
            ctx.decode_embeddings(e, mrope_pos=np.ones((3, 4), np.int32))
        grid = np.array([[2, 2, 2, 0], [2, 2, 3, 0], [2, 3, 2, 0]], np.int32)
        ctx.decode_embeddings(e, mrope_pos=grid)  # t may repeat and start at the last position
        assert ctx.memory.seq_pos_max(0) == 2
        with pytest.raises(ParamError, match="pos or mrope_pos"):
            ctx.decode_embeddings(e, pos=3, mrope_pos=grid)
        with Projector(model, mmproj, n_threads=2) as p:
            image = Image(np.zeros((56, 56, 3), np.uint8))
            with p.tokenize(f"x {p.media_marker} y", [image]) as ch:
                with pytest.raises(llama_cffi.UnsupportedError, match="M-RoPE"):
                    BranchStore(ctx).create(ch)
            with pytest.raises(llama_cffi.UnsupportedError, match="M-RoPE"):
                ChatSession(ctx, projector=p)


def test_mrope_pos_needs_an_mrope_model(tiny_model: llama_cffi.Model) -> None:
    with tiny_model.context(n_ctx=64) as ctx, pytest.raises(ParamError, match="mrope_pos is for models"):
        ctx.decode_embeddings(np.zeros((1, tiny_model.n_embd_inp), np.float32), mrope_pos=np.zeros((1, 4), np.int32))


def test_gemma3_270m_with_a_tiny_projector(default_model: llama_cffi.Model, tmp_path: Path) -> None:
    """The real Gemma 3 270M (its vocabulary has Gemma 3's image tokens) with a tiny
    gemma3 projector of its width: libmtmd wraps the image in <start_of_image> ...
    <end_of_image>, and Projector.eval equals mtmd_helper_eval_chunks bit for bit."""
    mmproj = write_tiny_gemma3_mmproj(tmp_path / "g3.gguf", default_model.n_embd_inp)
    start = default_model.tokenize("<start_of_image>", add_special=False, parse_special=True)
    assert len(start) == 1
    image = Image(np.random.default_rng(6).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    text = "<start_of_turn>user\n{}describe<end_of_turn>\n<start_of_turn>model\n"
    with Projector(default_model, mmproj, n_threads=2) as p, p.tokenize(text.format(p.media_marker), [image]) as ch:
        kinds = [c.kind for c in ch]
        assert kinds == ["text", "image", "text"]
        assert int(ch[0].tokens[-1]) == int(start[0])  # the image's own opening token
        got = []
        for way in ("ours", "libmtmd"):
            with default_model.context(n_ctx=512, n_batch=128, n_ubatch=128, n_threads=2) as ctx:
                if way == "ours":
                    got.append((p.eval(ctx, ch), np.array(ctx.logits(), np.float32)))
                else:
                    got.append(_helper_eval(p, ctx, ch, 128))
        (n0, l0), (n1, l1) = got
        assert n0 == n1 == ch.n_pos
        assert np.array_equal(l0, l1)
