"""Checks of a multimodal projector file ("mmproj" GGUF) before libmtmd reads it: what
would make ``tools/mtmd/clip.cpp`` abort the process instead of failing its load.

clip.cpp catches its own exceptions (a missing key or tensor, an unknown projector type
are a failed load, ``NULL``), but some of its checks are ``GGML_ASSERT``: its metadata
readers assert each scalar key's exact GGUF type (``gguf_get_val_u32`` of a float key
aborts), several projector types assert hyper-parameter ranges, a projector type used
for the wrong modality reaches an assertion before libmtmd's own check, and a graph
built from tensors that do not fit the hyper-parameters fails ggml's shape assertions
during the warm-up. :func:`check_mmproj` reads the header (metadata and tensor shapes,
no tensor data) and applies the same rules, so such a file is an
:class:`~llama_cffi.errors.InvalidModelError` that says what is wrong.

What is checked: every scalar key clip.cpp reads has the type it reads it as
(:data:`KEY_TYPES`, each ``get_u32``/``get_i32``/``get_f32``/``get_bool``/``get_string``
call of the pinned clip.cpp; array keys are checked by clip.cpp itself); a vision or audio
encoder is present and its projector type is one libmtmd accepts for that modality
(:data:`VISION_PROJECTORS`, :data:`AUDIO_PROJECTORS`); the hyper-parameters clip.cpp
asserts; and, for the projector types the tests write (``gemma3``, ``ultravox``), every
tensor the graph uses, with the shape the hyper-parameters imply, and the output width
against the text model's embedding width (libmtmd checks that after loading, leaking
the loaded encoder when it differs). Other projector types get the key, modality and
range checks; a file of theirs whose tensors contradict its hyper-parameters can still
reach a ggml assertion, as a broken text model can.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ._args import expect_int, expect_path
from ._binding import ffi, lib
from .errors import InvalidModelError
from .model_file import check_model_file

__all__ = ["AUDIO_PROJECTORS", "KEY_TYPES", "VISION_PROJECTORS", "MmprojHeader", "check_mmproj"]

#: The GGUF type each scalar key has to have: clip.cpp's readers assert it (the pinned
#: ``clip.cpp``; ``tests/test_mmproj_file.py`` derives the table from it again).
KEY_TYPES: dict[str, str] = {
    **{
        f"clip.{m}.{k}": "UINT32"
        for m in ("vision", "audio", "gen.audio")
        for k in (
            "attention.head_count",
            "attention.head_count_kv",
            "attention.head_dim",
            "block_count",
            "embedding_length",
            "feed_forward_length",
            "projection_dim",
        )
    },
    **{f"clip.{m}.attention.layer_norm_epsilon": "FLOAT32" for m in ("vision", "audio", "gen.audio")},
    **{
        f"clip.audio.{k}": "UINT32"
        for k in (
            "chunk_size",
            "conv_kernel_size",
            "local_block_count",
            "local_group_size",
            "max_pos_emb",
            "num_mel_bins",
            "projector.downsample_rate",
            "projector.head_count",
            "projector.stack_factor",
            "projector.window_size",
            "rvq.num_quantizers",
            "subsampling_factor",
            "window_size",
        )
    },
    **{
        f"clip.vision.{k}": "UINT32"
        for k in (
            "expert_used_count",
            "image_max_pixels",
            "image_min_pixels",
            "image_size",
            "n_wa_pattern",
            "patch_size",
            "preproc_image_size",
            "preproc_max_tiles",
            "preproc_min_tiles",
            "projector.query_side",
            "projector.scale_factor",
            "projector.window_side",
            "sam.block_count",
            "sam.embedding_length",
            "sam.head_count",
            "spatial_merge_size",
            "window_size",
        )
    },
    "clip.vision.swiglu_clamp": "FLOAT32",
    "clip.minicpmv_query_num": "UINT32",
    "clip.minicpmv_version": "INT32",
    "clip.has_audio_encoder": "BOOL",
    "clip.has_gen_audio_encoder": "BOOL",
    "clip.has_vision_encoder": "BOOL",
    "clip.use_gelu": "BOOL",
    "clip.use_silu": "BOOL",
    "clip.projector_type": "STRING",
    "clip.vision.projector_type": "STRING",
    "clip.audio.projector_type": "STRING",
    "clip.gen.audio.projector_type": "STRING",
    "clip.gen.audio.model_variant": "STRING",
    "clip.vision.mm_patch_merge_type": "STRING",
    "general.name": "STRING",
    "general.description": "STRING",
}

#: Projector types libmtmd takes for images (``mtmd.cpp``'s ``init_vision``).
VISION_PROJECTORS: frozenset[str] = frozenset(
    """adapter cogvlm deepseek4v deepseekocr deepseekocr2 dots3note_v dots_ocr exaone4_5 gemma3
    gemma3nv gemma4uv gemma4v glm4v glm5v granite4_vision hunyuanvl idefics3 internvl janus_pro
    kimik25 kimivl ldp ldpv2 lfm2 lightonocr ling3vl llama4 mimovl minicpmv4_6 minimax_m3 mlp
    muse-glimmer nemotron_v2_vl paddleocr phi4 pixtral qwen2.5o qwen2.5vl_merger qwen2vl_merger
    qwen3vl_merger resampler step3vl yasa2 youtuvl""".split()
)
#: Projector types libmtmd takes for audio (``init_audio``).
AUDIO_PROJECTORS: frozenset[str] = frozenset(
    """dots3note_a gemma4a gemma4ua glma granite_speech lfm2a meralion mimo_audio musicflamingo
    parakeet pockettts_spkenc qwen2.5o qwen2a qwen3a qwen3tts_spkenc ultravox voxtral""".split()
)

#: Whisper's encoder positions per 30-s chunk (3,000 mel frames, a stride-2 convolution).
_WHISPER_N_POS = 1500


_GGUF_TYPES = (
    "UINT8",
    "INT8",
    "UINT16",
    "INT16",
    "UINT32",
    "INT32",
    "FLOAT32",
    "BOOL",
    "STRING",
    "ARRAY",
    "UINT64",
    "INT64",
    "FLOAT64",
)


def _type_name(t: int) -> str:
    """``GGUF_TYPE_<NAME>`` of a gguf type number (``"other"`` for one ggml does not have)."""
    for name in _GGUF_TYPES:
        if int(getattr(lib, f"GGUF_TYPE_{name}")) == t:
            return f"GGUF_TYPE_{name}"
    return "other"


@dataclass(frozen=True)
class MmprojHeader:
    """What :func:`check_mmproj` read: which encoders the file has and their projector
    types (``None`` where the file has no such encoder)."""

    vision_projector: str | None
    audio_projector: str | None


class _Header:
    """The open GGUF header: typed reads of the keys (each checked against :data:`KEY_TYPES`
    first)."""

    def __init__(self, path: str) -> None:
        self.path = path
        params = ffi.new("struct gguf_init_params *")
        params.no_alloc = True
        params.ctx = ffi.NULL
        self.g = lib.gguf_init_from_file(path.encode(), params[0])
        if self.g == ffi.NULL:
            raise InvalidModelError(path, "ggml cannot parse its GGUF header (truncated or corrupt)")

    def close(self) -> None:
        if self.g != ffi.NULL:
            lib.gguf_free(self.g)
            self.g = ffi.NULL

    def fail(self, why: str) -> InvalidModelError:
        return InvalidModelError(self.path, f"{why} (libmtmd would abort the process)")

    def check_types(self) -> None:
        for i in range(int(lib.gguf_get_n_kv(self.g))):
            key = ffi.string(lib.gguf_get_key(self.g, i)).decode("utf-8", "replace")
            want = KEY_TYPES.get(key)
            if want is None:
                continue
            have = _type_name(int(lib.gguf_get_kv_type(self.g, i)))
            if have != f"GGUF_TYPE_{want}":
                got = have.removeprefix("GGUF_TYPE_").lower() if have != "other" else "another type"
                raise self.fail(f"metadata key {key!r} is {got}; clip.cpp reads it as {want.lower()}")

    def _index(self, key: str) -> int:
        return int(lib.gguf_find_key(self.g, key.encode()))

    def u32(self, key: str, default: int | None = None) -> int | None:
        """The value as clip.cpp's ``get_u32`` stores it: into an ``int`` (values above
        2**31 - 1 wrap to negative)."""
        i = self._index(key)
        if i < 0:
            return default
        v = int(lib.gguf_get_val_u32(self.g, i))
        return v - (1 << 32) if v >= 1 << 31 else v

    def flag(self, key: str) -> bool:
        i = self._index(key)
        return i >= 0 and bool(lib.gguf_get_val_bool(self.g, i))

    def string(self, key: str) -> str:
        i = self._index(key)
        return "" if i < 0 else ffi.string(lib.gguf_get_val_str(self.g, i)).decode("utf-8", "replace")

    def int_array_len(self, key: str) -> int | None:
        i = self._index(key)
        if i < 0 or _type_name(int(lib.gguf_get_kv_type(self.g, i))) != "GGUF_TYPE_ARRAY":
            return None
        return int(lib.gguf_get_arr_n(self.g, i))


def _shapes(path: str, names: list[str]) -> dict[str, tuple[int, ...] | None]:
    """ggml's ``ne`` of each named tensor (trailing 1s dropped), None where absent."""
    arr = [ffi.new("char[]", n.encode()) for n in names]
    ptrs = ffi.new("const char *[]", arr)
    ne = ffi.new("int64_t[]", 4 * max(1, len(names)))
    if lib.llama_cffi_gguf_tensor_ne(path.encode(), len(names), ptrs, ne) != 0:
        raise InvalidModelError(path, "ggml cannot parse its GGUF header (truncated or corrupt)")
    out: dict[str, tuple[int, ...] | None] = {}
    for i, n in enumerate(names):
        dims = [int(ne[4 * i + d]) for d in range(4)]
        if dims[0] < 0:
            out[n] = None
            continue
        while len(dims) > 1 and dims[-1] == 1:
            dims.pop()
        out[n] = tuple(dims)
    return out


def _expect(h: _Header, shapes: dict[str, tuple[int, ...] | None], want: dict[str, tuple[int, ...] | None]) -> None:
    """Every tensor of ``want`` with a shape must be present with that shape; with None it
    must be absent; ``shapes`` also holds optional tensors, checked when present."""
    for name, shape in want.items():
        have = shapes.get(name)
        if shape is None:
            if have is not None:
                raise h.fail(f"tensor {name!r} must not be present for this projector type")
            continue
        if have is None:
            raise h.fail(f"tensor {name!r} is missing")
        if _trim(have) != _trim(shape):
            raise h.fail(f"tensor {name!r} has shape {list(have)}, expected {list(shape)} from the metadata")


def _trim(s: tuple[int, ...]) -> tuple[int, ...]:
    d = list(s)
    while len(d) > 1 and d[-1] == 1:
        d.pop()
    return tuple(d)


def _positive(h: _Header, key: str, value: int | None) -> int:
    if value is None:
        raise InvalidModelError(h.path, f"metadata key {key!r} is missing")
    if value < 1:
        raise h.fail(f"metadata key {key!r} is {value}; it must be at least 1")
    return value


def _check_layers(
    h: _Header, p: str, m: str, n_embd: int, whisper: bool
) -> tuple[dict[str, tuple[int, ...] | None], dict[str, tuple[int, ...] | None]]:
    """The blocks' required and optional tensors, by name: (required, optional)."""
    n_layer = _positive(h, f"clip.{m}.block_count", h.u32(f"clip.{m}.block_count"))
    n_ff = _positive(h, f"clip.{m}.feed_forward_length", h.u32(f"clip.{m}.feed_forward_length"))
    n_head = _positive(h, f"clip.{m}.attention.head_count", h.u32(f"clip.{m}.attention.head_count"))
    if n_embd % n_head:
        raise h.fail(f"clip.{m}.embedding_length {n_embd} is not a multiple of the head count {n_head}")
    req: dict[str, tuple[int, ...] | None] = {}
    opt: dict[str, tuple[int, ...] | None] = {}
    e = (n_embd,)
    for i in range(n_layer):
        b = f"{p}.blk.{i}"
        for w in ("attn_q", "attn_k", "attn_v", "attn_out"):
            req[f"{b}.{w}.weight"] = (n_embd, n_embd)
        req[f"{b}.ffn_up.weight"] = (n_embd, n_ff)
        req[f"{b}.ffn_down.weight"] = (n_ff, n_embd)
        opt[f"{b}.attn_out.bias"] = e
        opt[f"{b}.ffn_up.bias"] = (n_ff,)
        opt[f"{b}.ffn_down.bias"] = e
        if whisper:  # whisper-enc.cpp asserts these, and that there is no k bias
            for t in ("attn_q.bias", "attn_v.bias", "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
                req[f"{b}.{t}"] = e
            req[f"{b}.attn_k.bias"] = None
        else:
            for t in ("attn_q.bias", "attn_k.bias", "attn_v.bias", "ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"):
                opt[f"{b}.{t}"] = e
    return req, opt


def _fits(h: _Header, width: int, n_embd_inp: int | None) -> None:
    if n_embd_inp is not None and width != n_embd_inp:
        raise InvalidModelError(
            h.path,
            f"its output width {width} is not the text model's embedding width {n_embd_inp} (another model's)",
        )


def _check_gemma3(h: _Header, n_embd_inp: int | None) -> None:
    m = "vision"
    n_embd = _positive(h, f"clip.{m}.embedding_length", h.u32(f"clip.{m}.embedding_length"))
    image_size = _positive(h, "clip.vision.image_size", h.u32("clip.vision.image_size"))
    patch = _positive(h, "clip.vision.patch_size", h.u32("clip.vision.patch_size"))
    if image_size % patch:
        raise h.fail(f"clip.vision.image_size {image_size} is not a multiple of the patch size {patch}")
    side = image_size // patch
    merge = h.u32("clip.vision.projector.scale_factor", 4)
    if merge is None or merge < 1 or side % merge:
        raise h.fail(f"the patch grid ({side} per side) is not a multiple of the pool size {merge}")
    req, opt = _check_layers(h, "v", m, n_embd, whisper=False)
    req |= {"v.patch_embd.weight": (patch, patch, 3, n_embd), "mm.soft_emb_norm.weight": (n_embd,)}
    opt |= {"v.patch_embd.bias": (n_embd,), "v.position_embd.weight": (n_embd, side * side)}
    opt |= {"v.post_ln.weight": (n_embd,), "v.post_ln.bias": (n_embd,)}
    names = [*req, *opt, "mm.input_projection.weight"]
    shapes = _shapes(h.path, names)
    proj = shapes["mm.input_projection.weight"]
    if proj is None:
        raise InvalidModelError(h.path, "tensor 'mm.input_projection.weight' is missing")
    _fits(h, proj[0], n_embd_inp)
    req["mm.input_projection.weight"] = (proj[0], n_embd)
    _expect(h, shapes, req)
    _expect(h, shapes, {k: v for k, v in opt.items() if shapes.get(k) is not None})


def _check_ultravox(h: _Header, n_embd_inp: int | None) -> None:
    m = "audio"
    n_embd = _positive(h, f"clip.{m}.embedding_length", h.u32(f"clip.{m}.embedding_length"))
    n_mel = _positive(h, "clip.audio.num_mel_bins", h.u32("clip.audio.num_mel_bins"))
    if n_mel > 256:
        raise h.fail(f"clip.audio.num_mel_bins is {n_mel}; clip.cpp allows at most 256")
    stack = _positive(h, "clip.audio.projector.stack_factor", h.u32("clip.audio.projector.stack_factor"))
    if _WHISPER_N_POS % stack:
        raise h.fail(
            f"clip.audio.projector.stack_factor is {stack}; at the pinned llama.cpp only a divisor of 1500 gives "
            "the token count clip.cpp expects"
        )
    req, opt = _check_layers(h, "a", m, n_embd, whisper=True)
    req |= {
        "a.conv1d.1.weight": (3, n_mel, n_embd),
        "a.conv1d.1.bias": (1, n_embd),
        "a.conv1d.2.weight": (3, n_embd, n_embd),
        "a.conv1d.2.bias": (1, n_embd),
        "mm.a.norm_pre.weight": (n_embd * stack,),
    }
    opt |= {"a.post_ln.weight": (n_embd,), "a.post_ln.bias": (n_embd,)}
    extra = ["a.position_embd.weight", "mm.a.mlp.1.weight", "mm.a.norm_mid.weight", "mm.a.mlp.2.weight"]
    shapes = _shapes(h.path, [*req, *opt, *extra])
    pos = shapes["a.position_embd.weight"]
    if pos is None or len(pos) != 2 or pos[0] != n_embd or pos[1] < _WHISPER_N_POS:
        raise h.fail(f"tensor 'a.position_embd.weight' must be [{n_embd}, >= 1500], not {pos}")
    mlp1 = shapes["mm.a.mlp.1.weight"]
    if mlp1 is None or len(mlp1) != 2 or mlp1[1] % 2:
        raise h.fail(f"tensor 'mm.a.mlp.1.weight' must be [{n_embd * stack}, an even width], not {mlp1}")
    hidden = mlp1[1] // 2
    mlp2 = shapes["mm.a.mlp.2.weight"]
    if mlp2 is None or len(mlp2) != 2:
        raise h.fail(f"tensor 'mm.a.mlp.2.weight' must be [{hidden}, the output width], not {mlp2}")
    _fits(h, mlp2[1], n_embd_inp)
    req |= {
        "mm.a.mlp.1.weight": (n_embd * stack, 2 * hidden),
        "mm.a.norm_mid.weight": (hidden,),
        "mm.a.mlp.2.weight": (hidden, mlp2[1]),
    }
    _expect(h, shapes, req)
    _expect(h, shapes, {k: v for k, v in opt.items() if shapes.get(k) is not None})


def _check_ranges(h: _Header, kind: str) -> None:
    """The hyper-parameters clip.cpp's ``load_hparams`` asserts, per projector type."""
    if kind == "minicpmv4_6":
        merge = h.u32("clip.vision.projector.scale_factor", 4)
        if merge not in (2, 4):
            raise h.fail(f"clip.vision.projector.scale_factor is {merge}; minicpmv4_6 takes 2 or 4")
    elif kind == "internvl":
        lo, hi = h.u32("clip.vision.preproc_min_tiles", 1), h.u32("clip.vision.preproc_max_tiles", 12)
        if lo is None or hi is None or not lo <= hi < 2**31 - 1:
            raise h.fail(f"preproc tiles min {lo} / max {hi}: need min <= max")
    elif kind in ("deepseekocr", "deepseekocr2"):
        lo = h.u32("clip.vision.preproc_min_tiles", 2)
        hi = h.u32("clip.vision.preproc_max_tiles", 9 if kind == "deepseekocr" else 6)
        if lo is None or hi is None or not 0 <= lo <= hi <= 256:
            raise h.fail(f"preproc tiles min {lo} / max {hi}: need 0 <= min <= max <= 256")
    elif kind == "parakeet":
        sub = h.u32("clip.audio.subsampling_factor")
        if sub is not None and sub != 8:
            raise h.fail(f"clip.audio.subsampling_factor is {sub}; parakeet needs 8")
        k = h.u32("clip.audio.conv_kernel_size")
        if k is not None and (k <= 0 or k % 2 == 0):
            raise h.fail(f"clip.audio.conv_kernel_size is {k}; it must be a positive odd number")
    elif kind == "minimax_m3":
        if h.u32("clip.vision.spatial_merge_size", 2) == 0:
            raise h.fail("clip.vision.spatial_merge_size is 0")
    elif kind == "mimovl":
        n = h.int_array_len("clip.vision.wa_pattern_mode")
        n_layer = h.u32("clip.vision.block_count")
        if n is not None and n_layer is not None and n != n_layer:
            raise h.fail(f"clip.vision.wa_pattern_mode has {n} values for {n_layer} layers")
    elif kind == "granite_speech":
        c = h.u32("clip.audio.chunk_size")
        if c is not None and not 0 < c <= 8192:
            raise h.fail(f"clip.audio.chunk_size is {c}; it must be in [1, 8192]")
    elif kind == "yasa2" and _shapes(h.path, ["v.patch_embd.weight"])["v.patch_embd.weight"] is None:
        raise h.fail("yasa2 needs the tensor 'v.patch_embd.weight'")


def _projector(h: _Header, modality: str, allowed: frozenset[str]) -> str:
    kind = h.string("clip.projector_type") or h.string(f"clip.{modality}.projector_type")
    if not kind:
        raise InvalidModelError(h.path, f"no projector type (clip.projector_type) for its {modality} encoder")
    if kind not in allowed:
        known = "an audio" if kind in AUDIO_PROJECTORS else "an image" if kind in VISION_PROJECTORS else "no"
        raise InvalidModelError(
            h.path, f"projector type {kind!r} of its {modality} encoder is {known} projector type libmtmd knows"
        )
    return kind


def check_mmproj(path: str | os.PathLike[str], n_embd_inp: int | None = None) -> MmprojHeader:
    """Raise :class:`~llama_cffi.errors.InvalidModelError` (or
    :class:`~llama_cffi.errors.ModelNotFoundError`) for a file libmtmd must not see (see
    the module docstring); ``n_embd_inp`` is the text model's input embedding width, which
    the projector's output must equal (not checked when None). Returns what it read."""
    path = expect_path("path", path)
    check_model_file(path)
    if n_embd_inp is not None:
        n_embd_inp = expect_int("n_embd_inp", n_embd_inp, "an int or None")
    h = _Header(path)
    try:
        h.check_types()
        vision, audio = h.flag("clip.has_vision_encoder"), h.flag("clip.has_audio_encoder")
        if not (vision or audio):
            raise InvalidModelError(
                path,
                "neither clip.has_vision_encoder nor clip.has_audio_encoder is true: not an image or audio projector",
            )
        kinds = {}
        if vision:
            kinds["vision"] = _projector(h, "vision", VISION_PROJECTORS)
        if audio:
            kinds["audio"] = _projector(h, "audio", AUDIO_PROJECTORS)
        for kind in kinds.values():
            _check_ranges(h, kind)
        if kinds.get("vision") == "gemma3":
            _check_gemma3(h, n_embd_inp)
        if kinds.get("audio") == "ultravox":
            _check_ultravox(h, n_embd_inp)
        return MmprojHeader(kinds.get("vision"), kinds.get("audio"))
    finally:
        h.close()
