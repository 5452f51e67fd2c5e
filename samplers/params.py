"""Sampling parameters as llama.cpp's tools take them: :class:`SamplingParams`.

The fields, their defaults and the order of the chain are llama.cpp's
``common_params_sampling`` and ``common_sampler_init`` (``common/common.h``,
``common/sampling.cpp`` at the pinned commit): logit biases (the user's, ``-inf`` for the
model's suppressed tokens and, with ``ignore_eos``, for every end-of-generation token),
then in ``samplers`` order penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p,
XTC and temperature (``temp_ext``: dynamic temperature when ``dynatemp_range > 0``),
then a seeded draw (``dist``, or ``adaptive_p`` when it is listed). ``mirostat=1``/``2``
replaces the whole list with temperature and Mirostat (v1 or v2), as llama.cpp does.

* :meth:`SamplingParams.to_chain` builds the chain from this package's samplers (leaving
  out the ones the values switch off, which llama.cpp's return from untouched);
* :meth:`SamplingParams.to_native` builds llama.cpp's own samplers in exactly
  ``common_sampler_init``'s chain (every listed sampler, as llama.cpp adds them);
* :meth:`SamplingParams.to_dict` / :meth:`SamplingParams.from_dict` round-trip plain data
  (JSON), :meth:`SamplingParams.add_arguments` / :meth:`SamplingParams.from_args` the
  command line, with llama.cpp's option names (``--temp``, ``--top-k``, ``--dry-multiplier``,
  ``--samplers "penalties;top_k;..."``...).

Seeded runs of the two chains pick the same tokens (``tests/test_params.py``). The grammar
is not a sampling parameter here: give it to the generation call (``grammar=``), which puts
the grammar first in the chain.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from llama_cffi._args import expect_int, expect_mapping, expect_namespace, expect_parser, type_error
from llama_cffi.errors import ParamError

from .adaptive import AdaptiveP
from .base import Sampler, check_model, check_model_or_none
from .bias import LogitBias
from .chain import SamplerChain
from .dry import DRY
from .infill import Infill
from .mirostat import Mirostat, MirostatV2
from .native import NativeSamplerChain
from .penalties import Penalties
from .selection import Dist
from .temperature import Temperature, TempExt
from .truncation import XTC, MinP, TopK, TopNSigma, TopP, Typical

if TYPE_CHECKING:
    from llama_cffi import Model

__all__ = ["SAMPLER_NAMES", "SamplingParams", "as_sampler"]

#: llama.cpp's sampler names (``common_sampler_type_to_str``), in the default order, then
#: the ones that are not in it.
SAMPLER_NAMES = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
    "infill",
    "adaptive_p",
)
_DEFAULT_ORDER = SAMPLER_NAMES[:9]
_DRY_BREAKERS = ("\n", ":", '"', "*")
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p", "typical": "typ_p"}
for _n in SAMPLER_NAMES:
    _ALIASES[_n.replace("_", "-")] = _n
    _ALIASES[_n.replace("_", "")] = _n


#: llama.cpp's names for the samplers it reads from a model's ``general.sampling.sequence``
#: (``common_sampler_types_from_names``: the canonical names, their kebab-case and
#: no-dash forms, ``nucleus``, ``temp`` and ``typ``; matched lower-cased, not stripped).
_LLAMA_SAMPLER_NAMES = {n: n for n in SAMPLER_NAMES}
for _n in SAMPLER_NAMES:
    if "_" in _n:
        _LLAMA_SAMPLER_NAMES[_n.replace("_", "-")] = _n
        _LLAMA_SAMPLER_NAMES[_n.replace("_", "")] = _n
_LLAMA_SAMPLER_NAMES.update({"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"})
#: The model's numeric sampling keys llama.cpp applies, with the type it parses them as.
_MODEL_KEYS: tuple[tuple[str, type], ...] = (
    ("top_k", int),
    ("top_p", float),
    ("min_p", float),
    ("xtc_probability", float),
    ("xtc_threshold", float),
    ("temp", float),
    ("penalty_last_n", int),
    ("penalty_repeat", float),
    ("mirostat", int),
    ("mirostat_tau", float),
    ("mirostat_eta", float),
)
_INT_PREFIX = re.compile(r"[ \t\n\r\f\v]*([+-]?[0-9]+)")
_FLOAT_PREFIX = re.compile(
    r"[ \t\n\r\f\v]*([+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan))",
    re.IGNORECASE,
)


def _leading_number(text: str, kind: type) -> int | float | None:
    """``text``'s leading number as C's ``strtol`` (base 10) or ``strtof`` (rounded to
    float32) reads it; None when there is none, or an integer outside int32 (which
    llama.cpp's conversion would wrap)."""
    m = (_INT_PREFIX if kind is int else _FLOAT_PREFIX).match(text)
    if m is None:
        return None
    if kind is int:
        v = int(m.group(1))
        return v if -(2**31) <= v < 2**31 else None
    f = float(np.float32(float(m.group(1))))
    return f


def sampler_name(name: str) -> str:
    """The canonical name of a sampler llama.cpp knows by ``name`` (its aliases: ``top-k``,
    ``topk``, ``nucleus``, ``temp``...), case-insensitive."""
    n = str(name).strip().lower()
    if n in SAMPLER_NAMES:
        return n
    if n in _ALIASES:
        return _ALIASES[n]
    raise ParamError(f"unknown sampler {name!r}; llama.cpp's samplers are {', '.join(SAMPLER_NAMES)}")


@dataclass
class SamplingParams:
    """llama.cpp's ``common_params_sampling``: field names and defaults are its own.

    ``seed=None`` draws a random seed (llama.cpp's ``LLAMA_DEFAULT_SEED``). Sizes are in
    tokens; probabilities in ``[0, 1]``. ``samplers`` and ``dry_sequence_breakers`` are
    stored as tuples (``samplers`` also takes a ``;``-separated string and llama.cpp's
    aliases); ``dry_sequence_breakers=None`` is llama.cpp's ``"\\n"``, ``":"``, ``'"'``,
    ``"*"``. ``logit_bias`` maps token ids to added logits (``-inf`` bans a token). Values
    are checked when the object is made or changed through :meth:`replace`."""

    seed: int | None = None
    min_keep: int = 0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.10
    typ_p: float = 1.0
    temp: float = 0.8
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = 64
    dry_sequence_breakers: Sequence[str] | None = None
    adaptive_target: float = -1.0
    adaptive_decay: float = 0.90
    mirostat: int = 0
    top_n_sigma: float = -1.0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    ignore_eos: bool = False
    samplers: Sequence[str] = _DEFAULT_ORDER
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("seed",):
                if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32):
                    raise ParamError(f"seed must be None or an int in [0, 2**32), not {v!r}")
            elif f.type == "int":
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ParamError(f"{f.name} must be an int, not {v!r}")
            elif f.type == "float":
                if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
                    raise ParamError(f"{f.name} must be a number, not {v!r}")
                setattr(self, f.name, float(v))
        if not (
            math.isfinite(self.penalty_repeat) and self.penalty_repeat > 0 and math.isfinite(1 / self.penalty_repeat)
        ):
            raise ParamError(f"penalty_repeat must be finite and > 0 (1 = off), not {self.penalty_repeat}")
        for name in ("penalty_freq", "penalty_present", "temp", "dynatemp_range", "dynatemp_exponent", "dry_base"):
            if not math.isfinite(getattr(self, name)):
                raise ParamError(f"{name} must be finite, not {getattr(self, name)}")
        for name in ("top_p", "min_p", "typ_p", "xtc_probability"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ParamError(f"{name} must be in [0, 1], not {v}")
        if self.min_keep < 0:
            raise ParamError(f"min_keep must be >= 0, not {self.min_keep}")
        if self.mirostat not in (0, 1, 2):
            raise ParamError(f"mirostat must be 0 (off), 1 or 2, not {self.mirostat}")
        breakers = _DRY_BREAKERS if self.dry_sequence_breakers is None else self.dry_sequence_breakers
        if not isinstance(breakers, Iterable):
            raise type_error("dry_sequence_breakers", "a sequence of strings or None", breakers)
        if isinstance(breakers, str) or not all(isinstance(b, str) for b in breakers):
            raise ParamError("dry_sequence_breakers must be a sequence of strings")
        self.dry_sequence_breakers = tuple(breakers)
        if not isinstance(self.samplers, Iterable):
            raise type_error("samplers", "a sequence of sampler names (or a str of names split by ';')", self.samplers)
        if isinstance(self.samplers, str):
            self.samplers = tuple(s for s in self.samplers.replace(",", ";").split(";") if s.strip())
        self.samplers = tuple(sampler_name(s) for s in self.samplers)
        if not isinstance(self.logit_bias, Iterable):
            raise type_error("logit_bias", "a mapping token id -> bias", self.logit_bias)
        bias: dict[int, float] = {}
        for k, v in dict(self.logit_bias).items():
            try:
                t, b = int(k), float(v)
            except (TypeError, ValueError):
                raise ParamError(f"logit_bias maps token ids to numbers; got {k!r}: {v!r}") from None
            if t < 0 or math.isnan(b):
                raise ParamError(f"logit_bias: token {k!r} must be >= 0 and its bias a number, not {v!r}")
            bias[t] = b
        self.logit_bias = bias
        if not isinstance(self.ignore_eos, bool):
            raise ParamError(f"ignore_eos must be a bool, not {self.ignore_eos!r}")

    @property
    def breakers(self) -> tuple[str, ...]:
        """``dry_sequence_breakers`` (a tuple once the object is made)."""
        return tuple(self.dry_sequence_breakers or ())

    # ------------------------------------------------------------------ data
    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` (checked)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready: lists for the tuples, string keys for ``logit_bias``)."""
        d = dataclasses.asdict(self)
        d["dry_sequence_breakers"] = list(self.breakers)
        d["samplers"] = list(self.samplers)
        d["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return d

    @classmethod
    def from_model(cls, model: Model, **overrides: Any) -> SamplingParams:
        """llama.cpp's defaults, then the model's own sampling settings, then
        ``overrides``: what you pass wins over the model's, and the model's over the
        defaults, as in llama.cpp's tools (``common_init_sampler_from_model``: an option
        given on the command line wins over the file's).

        The model's settings are its GGUF ``general.sampling.*`` keys: ``sequence`` (the
        samplers' order, ``;``-separated names; names llama.cpp does not know are
        skipped), ``top_k``, ``top_p``, ``min_p``, ``xtc_probability``,
        ``xtc_threshold``, ``temp``, ``penalty_last_n``, ``penalty_repeat``,
        ``mirostat``, ``mirostat_tau`` and ``mirostat_eta``. Each is read as llama.cpp
        reads it (its text's leading number, as ``strtol``/``strtof`` parse it; no number:
        ignored). A model file is untrusted: a value these parameters' checks refuse
        (``top_p`` of 2, a NaN) is ignored too, with a ``RuntimeWarning`` naming it.
        Raises :class:`~llama_cffi.ParamError` for an override that is wrong."""
        check_model(model)
        base = cls()
        ignored: list[str] = []
        seq = model.meta_value("general.sampling.sequence", 512)
        if seq is not None:
            names = seq.split(";")
            if names:
                known = [_LLAMA_SAMPLER_NAMES[n.lower()] for n in names if n.lower() in _LLAMA_SAMPLER_NAMES]
                base = dataclasses.replace(base, samplers=tuple(known))
        for name, kind in _MODEL_KEYS:
            raw = model.meta_value(f"general.sampling.{name}", 64 if kind is int else 128)
            if raw is None:
                continue
            value = _leading_number(raw, kind)
            if value is None:
                continue
            try:
                base = dataclasses.replace(base, **{name: value})  # type: ignore[arg-type]
            except ParamError:
                ignored.append(f"general.sampling.{name}={raw!r}")
        if ignored:
            warnings.warn(
                f"the model's sampling settings {', '.join(ignored)} are out of range: ignored",
                RuntimeWarning,
                stacklevel=2,
            )
        return dataclasses.replace(base, **overrides) if overrides else base

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """The inverse of :meth:`to_dict`; missing keys take llama.cpp's defaults, unknown
        keys raise :class:`~llama_cffi.ParamError`."""
        expect_mapping("data", data, "a mapping (a dict) of llama.cpp sampling parameters")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ParamError(f"unknown sampling parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        kw = dict(data)
        for key in ("dry_sequence_breakers", "samplers"):
            if key in kw and isinstance(kw[key], list):
                kw[key] = tuple(kw[key])
        return cls(**kw)

    # ------------------------------------------------------------------ chains
    def _needs_model(self, model: Model | None, why: str) -> Model:
        if model is None:
            raise ParamError(f"{why} needs the model: pass model=")
        return model

    def _samplers(self, model: Model | None, native: bool) -> list[Sampler]:
        """common_sampler_init's list. ``native``: every sampler as llama.cpp adds it;
        otherwise without the ones whose values switch them off."""
        out: list[Sampler] = []
        bias = dict(self.logit_bias)
        if model is not None:
            for t in model.vocab.suppress_tokens():
                bias[t] = -math.inf
        if self.ignore_eos:
            m = self._needs_model(model, "ignore_eos")
            if m.vocab.eos is not None:
                for t in m.vocab.eog_tokens():
                    bias[int(t)] = -math.inf
        if bias:
            m = self._needs_model(model, "logit_bias")
            out.append(LogitBias(m.n_vocab, bias))
        if self.mirostat:
            out.append(Temperature(self.temp))
            if self.mirostat == 1:
                m = self._needs_model(model, "mirostat=1")
                out.append(Mirostat(m.n_vocab, self.seed, self.mirostat_tau, self.mirostat_eta, 100))
            else:
                out.append(MirostatV2(self.seed, self.mirostat_tau, self.mirostat_eta))
            return out
        all_ = native
        for name in self.samplers:
            if name == "penalties":
                off = self.penalty_last_n == 0 or (
                    self.penalty_repeat == 1.0 and self.penalty_freq == 0.0 and self.penalty_present == 0.0
                )
                if all_ or not off:
                    n_vocab = model.n_vocab if model is not None else 1
                    out.append(
                        Penalties(
                            self.penalty_last_n, self.penalty_repeat, self.penalty_freq, self.penalty_present, n_vocab
                        )
                    )
            elif name == "dry":
                off = self.dry_multiplier == 0.0 or self.dry_base < 1.0 or self.dry_penalty_last_n == 0
                if all_ or not off:
                    out.append(
                        DRY(
                            self.dry_multiplier,
                            self.dry_base,
                            self.dry_allowed_length,
                            self.dry_penalty_last_n,
                            self.breakers,
                            model=self._needs_model(model, "DRY") if not off else model,
                        )
                    )
            elif name == "top_n_sigma":
                if all_ or self.top_n_sigma > 0:
                    out.append(TopNSigma(self.top_n_sigma))
            elif name == "top_k":
                if all_ or self.top_k > 0:
                    out.append(TopK(self.top_k))
            elif name == "typ_p":
                if all_ or self.typ_p < 1.0:
                    out.append(Typical(self.typ_p, self.min_keep))
            elif name == "top_p":
                if all_ or self.top_p < 1.0:
                    out.append(TopP(self.top_p, self.min_keep))
            elif name == "min_p":
                if all_ or self.min_p > 0.0:
                    out.append(MinP(self.min_p, self.min_keep))
            elif name == "xtc":
                if all_ or (self.xtc_probability > 0.0 and self.xtc_threshold <= 0.5):
                    out.append(XTC(self.xtc_probability, self.xtc_threshold, self.min_keep, self.seed))
            elif name == "temperature":
                if all_ or self.temp != 1.0 or self.dynatemp_range > 0.0:
                    out.append(TempExt(self.temp, self.dynatemp_range, self.dynatemp_exponent))
            elif name == "infill":
                out.append(Infill(self._needs_model(model, "infill")))
        if "adaptive_p" in self.samplers:
            out.append(AdaptiveP(self.adaptive_target, self.adaptive_decay, self.seed))
        else:
            out.append(Dist(self.seed))
        return out

    def to_chain(self, model: Model | None = None, **chain_options: Any) -> SamplerChain:
        """This package's chain for these parameters (``chain_options``: ``tracker=`` and
        the other :class:`~samplers.chain.SamplerChain` options). ``model`` is needed for
        logit biases, ``ignore_eos``, DRY's string breakers, Mirostat v1 and infill; with it
        the model's suppressed tokens are banned as llama.cpp bans them."""
        check_model_or_none(model)
        return SamplerChain(self._samplers(model, native=False), **chain_options)

    def to_native(self, model: Model) -> NativeSamplerChain:
        """llama.cpp's own samplers in ``common_sampler_init``'s chain for ``model`` (every
        listed sampler added, as llama.cpp adds them)."""
        check_model(model)
        return NativeSamplerChain(self._samplers(model, native=True))

    # ------------------------------------------------------------------ command line
    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """llama.cpp's sampling options (``llama-cli --help``'s names and defaults)."""
        expect_parser("parser", parser)
        d = SamplingParams()
        g = parser.add_argument_group("sampling (llama.cpp's options, defaults and order)")
        g.add_argument("--seed", "-s", type=int, default=None, help="random seed (default: random)")
        g.add_argument("--temp", type=float, default=d.temp, help=f"temperature; <= 0 greedy (default {d.temp})")
        g.add_argument("--top-k", type=int, default=d.top_k, help=f"0 = off (default {d.top_k})")
        g.add_argument("--top-p", type=float, default=d.top_p, help=f"1 = off (default {d.top_p})")
        g.add_argument("--min-p", type=float, default=d.min_p, help=f"0 = off (default {d.min_p})")
        g.add_argument("--top-nsigma", type=float, default=d.top_n_sigma, help="-1 = off (default)")
        g.add_argument("--xtc-probability", type=float, default=d.xtc_probability, help="0 = off (default)")
        g.add_argument("--xtc-threshold", type=float, default=d.xtc_threshold, help=f"(default {d.xtc_threshold})")
        g.add_argument("--typical", type=float, default=d.typ_p, help="locally typical p; 1 = off (default)")
        g.add_argument("--repeat-last-n", type=int, default=d.penalty_last_n, help="0 = off, -1 = context size")
        g.add_argument("--repeat-penalty", type=float, default=d.penalty_repeat, help="1 = off (default)")
        g.add_argument("--presence-penalty", type=float, default=d.penalty_present, help="0 = off (default)")
        g.add_argument("--frequency-penalty", type=float, default=d.penalty_freq, help="0 = off (default)")
        g.add_argument("--dry-multiplier", type=float, default=d.dry_multiplier, help="0 = off (default)")
        g.add_argument("--dry-base", type=float, default=d.dry_base, help=f"(default {d.dry_base})")
        g.add_argument("--dry-allowed-length", type=int, default=d.dry_allowed_length)
        g.add_argument(
            "--dry-penalty-last-n", type=int, default=d.dry_penalty_last_n, help="0 = off, -1 = context size"
        )
        g.add_argument(
            "--dry-sequence-breaker", action="append", default=None, help="repeatable; replaces the defaults"
        )
        g.add_argument("--dynatemp-range", type=float, default=d.dynatemp_range, help="0 = off (default)")
        g.add_argument("--dynatemp-exp", type=float, default=d.dynatemp_exponent)
        g.add_argument("--mirostat", type=int, default=d.mirostat, help="0 = off, 1 or 2")
        g.add_argument("--mirostat-lr", type=float, default=d.mirostat_eta, help="eta")
        g.add_argument("--mirostat-ent", type=float, default=d.mirostat_tau, help="tau")
        g.add_argument("--adaptive-target", type=float, default=d.adaptive_target, help="< 0 = off (default)")
        g.add_argument("--adaptive-decay", type=float, default=d.adaptive_decay)
        g.add_argument("--ignore-eos", action="store_true", help="never end at an end-of-generation token")
        g.add_argument(
            "--samplers", default=";".join(d.samplers), help="the order, ';'-separated (default: llama.cpp's)"
        )
        g.add_argument(
            "--logit-bias", "-l", action="append", default=[], metavar="TOKEN(+|-)BIAS", help="e.g. 15043+1; repeatable"
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace, n_ctx: int | None = None) -> SamplingParams:
        """The parameters :meth:`add_arguments`' options hold (``-1`` last-n values become
        ``n_ctx`` when given, as llama.cpp does)."""
        expect_namespace("args", args)
        if n_ctx is not None:
            n_ctx = expect_int("n_ctx", n_ctx, "an int or None")

        def last_n(v: int) -> int:
            return n_ctx if v == -1 and n_ctx is not None else v

        bias: dict[int, float] = {}
        for item in args.logit_bias:
            m = re.fullmatch(r"\s*(\d+)\s*([+-].*)", str(item))
            try:
                if m is None:
                    raise ValueError
                bias[int(m.group(1))] = float(m.group(2))
            except ValueError:
                raise ParamError(f"--logit-bias {item!r}: expected TOKEN+BIAS or TOKEN-BIAS, e.g. 15043+1") from None
        return cls(
            seed=args.seed,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            xtc_probability=args.xtc_probability,
            xtc_threshold=args.xtc_threshold,
            typ_p=args.typical,
            temp=args.temp,
            dynatemp_range=args.dynatemp_range,
            dynatemp_exponent=args.dynatemp_exp,
            penalty_last_n=last_n(args.repeat_last_n),
            penalty_repeat=args.repeat_penalty,
            penalty_freq=args.frequency_penalty,
            penalty_present=args.presence_penalty,
            dry_multiplier=args.dry_multiplier,
            dry_base=args.dry_base,
            dry_allowed_length=args.dry_allowed_length,
            dry_penalty_last_n=last_n(args.dry_penalty_last_n),
            dry_sequence_breakers=tuple(args.dry_sequence_breaker) if args.dry_sequence_breaker else _DRY_BREAKERS,
            adaptive_target=args.adaptive_target,
            adaptive_decay=args.adaptive_decay,
            mirostat=args.mirostat,
            top_n_sigma=args.top_nsigma,
            mirostat_tau=args.mirostat_ent,
            mirostat_eta=args.mirostat_lr,
            ignore_eos=args.ignore_eos,
            samplers=tuple(s for s in str(args.samplers).replace(",", ";").split(";") if s.strip()),
            logit_bias=bias,
        )

    def to_args(self) -> list[str]:
        """Command-line options that :meth:`from_args` turns back into these parameters
        (the ones that differ from the defaults), in llama.cpp's spelling: ``llama-cli``
        reads them the same way. ``min_keep`` has no option there (raises
        :class:`~llama_cffi.ParamError` when it is not 0)."""
        d = SamplingParams()
        if self.min_keep != d.min_keep:
            raise ParamError("llama.cpp's command line has no min_keep option (llama-server takes it as JSON)")
        flags = {
            "seed": "--seed", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
            "xtc_probability": "--xtc-probability", "xtc_threshold": "--xtc-threshold", "typ_p": "--typical",
            "temp": "--temp", "dynatemp_range": "--dynatemp-range", "dynatemp_exponent": "--dynatemp-exp",
            "penalty_last_n": "--repeat-last-n", "penalty_repeat": "--repeat-penalty",
            "penalty_freq": "--frequency-penalty", "penalty_present": "--presence-penalty",
            "dry_multiplier": "--dry-multiplier", "dry_base": "--dry-base",
            "dry_allowed_length": "--dry-allowed-length",
            "dry_penalty_last_n": "--dry-penalty-last-n", "adaptive_target": "--adaptive-target",
            "adaptive_decay": "--adaptive-decay", "mirostat": "--mirostat", "mirostat_tau": "--mirostat-ent",
            "mirostat_eta": "--mirostat-lr", "top_n_sigma": "--top-nsigma",
        }  # fmt: skip
        out: list[str] = []
        for name, flag in flags.items():
            v = getattr(self, name)
            if v != getattr(d, name):
                out += [flag, _number(v)]
        if self.breakers != d.breakers:
            for b in self.breakers:
                out += ["--dry-sequence-breaker", b]
        if self.ignore_eos:
            out.append("--ignore-eos")
        if self.samplers != d.samplers:
            out += ["--samplers", ";".join(self.samplers)]
        for tok, bias in self.logit_bias.items():
            b = _number(bias)
            out += ["--logit-bias", f"{tok}{'' if b.startswith('-') else '+'}{b}"]
        return out


def _number(v: float) -> str:
    """``v`` exactly, without an exponent (argparse reads ``-1e-05`` as an option)."""
    if isinstance(v, float) and math.isfinite(v):
        return str(np.format_float_positional(v, unique=True, trim="-"))
    return str(v)


def as_sampler(sampler: object, model: Model, name: str = "sampler") -> Sampler | None:
    """What a ``sampler=`` argument gives: None stays None, a
    :class:`SamplingParams` becomes its chain for ``model`` (:meth:`SamplingParams.to_chain`),
    a :class:`~samplers.base.Sampler` is itself; anything else is a
    :class:`~llama_cffi.errors.ParamTypeError` naming ``name``."""
    if type(name) is not str:
        raise type_error("name", "a str (the parameter's name)", name)
    if sampler is None or isinstance(sampler, Sampler):
        return sampler
    if isinstance(sampler, SamplingParams):
        return sampler.to_chain(model)
    raise type_error(name, "a samplers Sampler (a chain), samplers.SamplingParams, or None", sampler)
