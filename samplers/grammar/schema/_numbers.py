"""JSON numbers as GBNF: integer ranges of any length, decimal ranges (inclusive or
exclusive bounds, as digit grammars), and ``multipleOf`` as a divisibility automaton over
the decimal digits.

A number is written ``-? int frac? exp?``. Without bounds every spelling is accepted. With
bounds, spellings with an exponent (``1e+100``, what ``json.dumps`` writes for floats at
or over 1e16 and under 1e-4) are not accepted: a bounded number is written as plain
digits. An integer (``type: integer``) may carry a zero fraction (``1.0``), as JSON
Schema counts 1.0 an integer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from fractions import Fraction

from ._rules import RuleSet, automaton
from ._strings import _fixed_range

__all__ = ["GENERATION_DIGITS", "NumberSpec", "cap_digits", "int_range"]

#: ``warn(keyword, message)``: what a number grammar does not enforce
Warn = Callable[[str, str], None]

_INT = '("0" | [1-9] [0-9]*)'
_FRAC = '("." [0-9]+)'
_EXP = "([eE] [+-]? [0-9]+)"
_ZERO_FRAC = '("." "0"+)?'
#: the largest divisor a ``multipleOf`` automaton is built for (rules: divisor x fraction digits)
MAX_DIVISOR = 1000
#: the most values a bounded ``multipleOf`` range is enumerated for
MAX_ENUMERATED = 1000


def _dig(a: int, b: int) -> str:
    return f'"{a}"' if a == b else f"[{a}-{b}]"


def nat_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the decimal numerals (no leading zeros) of the integers in [lo, hi]."""
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return []
    out: list[str] = []
    width = len(str(lo))
    while True:
        w_lo = max(lo, 10 ** (width - 1) if width > 1 else 0)
        w_hi = 10**width - 1
        if hi is not None and hi <= w_hi:
            return out + _fixed_range(w_lo, hi, width, 10, _dig)
        if hi is None and width > 1 and w_lo == 10 ** (width - 1):
            return [*out, f"[1-9] [0-9]{{{width - 1},}}"]
        out += _fixed_range(w_lo, w_hi, width, 10, _dig)
        width += 1


def _alt(items: list[str]) -> str:
    items = [i for i in items if i]
    if not items:
        return ""
    return items[0] if len(items) == 1 else "(" + " | ".join(items) + ")"


def int_range(lo: int | None, hi: int | None) -> str:
    """GBNF for the integers in [lo, hi] (None: unbounded); "" when there are none."""
    alts = []
    if hi is None or hi >= 0:
        alts += nat_range(max(lo if lo is not None else 0, 0), hi)
    if lo is None or lo < 0:
        neg = nat_range(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)
        if neg:
            alts.append(f'"-" {_alt(neg)}')
    return _alt(alts)


# --- fractions: digit strings S with 0.S compared against bounds ----------------------


def _frac_digits(x: Fraction) -> str | None:
    """The fraction digits of x in [0, 1) without trailing zeros, None if not a finite decimal."""
    digits = ""
    for _ in range(400):
        if x == 0:
            return digits
        x *= 10
        d = math.floor(x)
        digits += str(d)
        x -= d
    return None


Bound = tuple[str, bool]  # (fraction digits, strict)


def _frac_set(lo: Bound | None, hi: Bound | None) -> tuple[bool, str]:
    """(whether the empty digit string is in, GBNF for the non-empty digit strings S
    with lo <= 0.S <= hi, strictness per bound); "" when none."""
    lo_d, lo_s = lo if lo else ("", False)
    hi_d, hi_s = hi if hi else (None, False)
    eps = (lo_d == "" and not lo_s) and (hi_d is None or hi_d != "" or not hi_s)
    if hi_d == "" and hi is not None:
        # 0.S <= 0: all zeros (if not strict)
        if hi_s or lo_s or lo_d:
            return eps and not hi_s, ""
        return eps, '"0"+'
    alts = []
    a = int(lo_d[0]) if lo_d else None
    b = int(hi_d[0]) if hi_d else None
    if lo_d == "" and lo_s and hi_d is None:
        return False, '"0"* [1-9] [0-9]*'
    first_lo = a if a is not None else 0
    first_hi = b if b is not None else 9
    for f in range(first_lo, first_hi + 1):
        sub_lo: Bound | None = None
        sub_hi: Bound | None = None
        if a is not None and f == a:
            sub_lo = (lo_d[1:], lo_s)
        elif lo_d == "" and lo_s:
            sub_lo = None if f > 0 else ("", True)
        if b is not None and f == b:
            sub_hi = (hi_d[1:], hi_s)  # type: ignore[index]
        if sub_lo is None and sub_hi is None:
            alts.append((f, "any"))
            continue
        e, ne = _frac_set(sub_lo, sub_hi)
        if e and ne:
            alts.append((f, f"({ne})?"))
        elif e:
            alts.append((f, ""))
        elif ne:
            alts.append((f, f"({ne})" if "|" in ne else ne))
    # merge runs of "any"
    out: list[str] = []
    run: list[int] = []
    for f, rest in alts:
        if rest == "any":
            run.append(f)
            continue
        if run:
            out.append(f"{_dig(run[0], run[-1])} [0-9]*")
            run = []
        out.append(f'"{f}" {rest}'.strip())
    if run:
        out.append(f"{_dig(run[0], run[-1])} [0-9]*")
    return eps, " | ".join(out)


def _nonneg_decimal(
    lo: Fraction | None, lo_strict: bool, hi: Fraction | None, hi_strict: bool, non_integer: bool = False
) -> list[str]:
    """Alternatives for the plain decimals (``int frac?``) x >= 0 within the bounds
    (``non_integer``: only those with a non-zero fraction)."""
    lo = max(lo, Fraction(0)) if lo is not None else Fraction(0)
    if hi is not None and (hi < lo or (hi == lo and (lo_strict or hi_strict))):
        return []
    ia = math.floor(lo)
    fa = _frac_digits(lo - ia)
    ib = math.floor(hi) if hi is not None else None
    fb = _frac_digits(hi - ib) if hi is not None and ib is not None else None
    if fa is None or (hi is not None and fb is None):
        raise ValueError("a bound that is not a finite decimal")
    out = []

    def lo_bound(d: str, strict: bool) -> Bound:
        return ("", True) if non_integer and d == "" else (d, strict)

    def with_frac(ints: list[str], e: bool, ne: str) -> None:
        if not ints:
            return
        if non_integer:
            e = False
        body = _alt(ints)
        if e and ne:
            out.append(f'{body} ("." ({ne}))?')
        elif e:
            out.append(body)
        elif ne:
            out.append(f'{body} "." ({ne})')

    if ib is not None and ia == ib:
        e, ne = _frac_set(lo_bound(fa, lo_strict), (fb, hi_strict))  # type: ignore[arg-type]
        with_frac(nat_range(ia, ia), e, ne)
        return out
    e, ne = _frac_set(lo_bound(fa, lo_strict), None)
    with_frac(nat_range(ia, ia), e, ne)
    middle = nat_range(ia + 1, None if ib is None else ib - 1)
    if middle:
        out.append(f'{_alt(middle)} "." [0-9]* [1-9] [0-9]*' if non_integer else f"{_alt(middle)} {_FRAC}?")
    if ib is not None:
        e, ne = _frac_set(("", True) if non_integer else None, (fb, hi_strict))  # type: ignore[arg-type]
        with_frac(nat_range(ib, ib), e, ne)
    return out


def _frac_j(j: int) -> str:
    """Exactly j fraction digits (none: nothing)."""
    return f'"." [0-9]{{{j}}} ' if j else ""


def _floor_log10(q: Fraction) -> int:
    """floor(log10(q)) for q > 0, exactly."""
    e = len(str(q.numerator)) - len(str(q.denominator))
    while Fraction(10) ** e > q:
        e -= 1
    while Fraction(10) ** (e + 1) <= q:
        e += 1
    return e


def _exp_range(a: int | None, b: int | None) -> str:
    """An exponent (after ``e``/``E``) with a value in [a, b] (None: unbounded), leading zeros allowed."""
    alts = []
    if b is None or b >= 0:
        nat = nat_range(max(a, 0) if a is not None else 0, b)
        if nat:
            alts.append(f'"+"? "0"* {_alt(nat)}')
    if a is None or a < 0:
        neg = nat_range(max(1, -b) if b is not None else 1, None if a is None else -a)
        if neg:
            alts.append(f'"-" "0"* {_alt(neg)}')
    return _alt(alts)


def _exponent_forms(
    lo: Fraction | None, lo_s: bool, hi: Fraction | None, hi_s: bool, integer: bool = False
) -> list[str]:
    """Numbers within the bounds written ``d(.ddd)?e[+-]?n`` (one non-zero leading digit,
    as ``json.dumps`` writes floats at or over 1e16 and under 1e-4). ``integer``: only
    exponents of 16 or more with at most 16 fraction digits (integers, as ``json.dumps``
    writes integral floats from 1e16 on), away from a bound's decade."""
    out = []
    for sign in (1, -1):
        # bounds on |x| for this sign
        if sign == 1:
            if hi is not None and hi <= 0:
                continue
            a, a_s = (lo, lo_s) if lo is not None and lo > 0 else (None, False)
            b, b_s = hi, hi_s
        else:
            if lo is not None and lo >= 0:
                continue
            a, a_s = (-hi, hi_s) if hi is not None and hi < 0 else (None, False)
            b, b_s = (-lo if lo is not None else None), lo_s
        emin = _floor_log10(a) if a is not None else None
        emax = _floor_log10(b) if b is not None else None
        forms = []
        mant_any = '[1-9] ("." [0-9]{1,16})?' if integer else '[1-9] ("." [0-9]+)?'
        # exponents strictly inside: any mantissa
        inner_lo = None if emin is None else emin + 1
        inner_hi = None if emax is None else emax - 1
        if integer:
            inner_lo = 16 if inner_lo is None else max(inner_lo, 16)
        if inner_lo is None or inner_hi is None or inner_lo <= inner_hi:
            forms.append(f"{mant_any} [eE] {_exp_range(inner_lo, inner_hi)}")
        for e in sorted({x for x in (emin, emax) if x is not None and not integer}):
            scale = Fraction(10) ** e
            m_lo, m_lo_s = Fraction(1), False
            m_hi, m_hi_s = Fraction(10), True
            if a is not None and e == emin and a / scale > m_lo:
                m_lo, m_lo_s = a / scale, a_s
            elif a is not None and e == emin:
                m_lo_s = m_lo_s or (a_s and a / scale == m_lo)
            if b is not None and e == emax and b / scale < m_hi:
                m_hi, m_hi_s = b / scale, b_s
            try:
                mant = _nonneg_decimal(m_lo, m_lo_s, m_hi, m_hi_s)
            except ValueError:
                continue
            if mant:
                forms.append(f"{_alt(mant)} [eE] {_exp_range(e, e)}")
        if forms:
            body = _alt(forms)
            out.append(body if sign == 1 else f'"-" {body}')
    return out


class NumberSpec:
    """A number's constraints: integer or not, bounds (exact rationals), divisor."""

    def __init__(
        self,
        integer: bool = False,
        lo: Fraction | None = None,
        lo_strict: bool = False,
        hi: Fraction | None = None,
        hi_strict: bool = False,
        multiple_of: tuple[Fraction, ...] = (),
    ) -> None:
        self.integer = integer
        self.lo, self.lo_strict, self.hi, self.hi_strict = lo, lo_strict, hi, hi_strict
        self.multiple_of = multiple_of

    def key(self) -> tuple[object, ...]:
        return (self.integer, self.lo, self.lo_strict, self.hi, self.hi_strict, self.multiple_of)

    def intersect(self, other: NumberSpec) -> NumberSpec:
        lo, lo_s = self.lo, self.lo_strict
        if other.lo is not None and (lo is None or other.lo > lo or (other.lo == lo and other.lo_strict)):
            lo, lo_s = other.lo, other.lo_strict
        hi, hi_s = self.hi, self.hi_strict
        if other.hi is not None and (hi is None or other.hi < hi or (other.hi == hi and other.hi_strict)):
            hi, hi_s = other.hi, other.hi_strict
        mult = tuple(sorted(set(self.multiple_of) | set(other.multiple_of)))
        return NumberSpec(self.integer or other.integer, lo, lo_s, hi, hi_s, mult)

    def empty(self) -> bool:
        if self.lo is not None and self.hi is not None:
            if self.hi < self.lo or (self.hi == self.lo and (self.lo_strict or self.hi_strict)):
                return True
            if self.integer and self._int_bounds()[0] > self._int_bounds()[1]:  # type: ignore[operator]
                return True
        return False

    def _int_bounds(self) -> tuple[int | None, int | None]:
        lo = None
        if self.lo is not None:
            lo = math.floor(self.lo) + 1 if self.lo_strict and self.lo.denominator == 1 else math.ceil(self.lo)
        hi = None
        if self.hi is not None:
            hi = math.ceil(self.hi) - 1 if self.hi_strict and self.hi.denominator == 1 else math.floor(self.hi)
        return lo, hi

    def body(
        self,
        rs: RuleSet,
        warn: Warn,
        non_integer: bool = False,
        zero_fraction: bool = True,
        multiple_fraction: bool | None = None,
    ) -> str:
        """GBNF for the numbers that meet these constraints (``warn(keyword, message)``
        is called for what is not enforced). ``zero_fraction``: an integer may be written
        ``1.0``; ``multiple_fraction`` (default: the same): a number that is a multiple of
        an integer may (draft 4's integer takes no fraction, its multiples of 1 do)."""
        divisor = self._divisor(warn)
        integer = self.integer or (divisor is not None and divisor[0].denominator == 1)
        if not self.integer and multiple_fraction is not None:
            zero_fraction = multiple_fraction
        zero = _ZERO_FRAC if zero_fraction else ""  # 1.0 is an integer to a validator
        bounded = self.lo is not None or self.hi is not None
        if integer:
            ilo, ihi = self._int_bounds()
            if divisor is not None:
                d = int(divisor[0])
                if ilo is not None and ihi is not None and (ihi - ilo) // d <= MAX_ENUMERATED:
                    first = -(-ilo // d) * d
                    vals = list(range(first, ihi + 1, d))
                    if not vals:
                        return ""
                    return "(" + " | ".join(f'"{v}"' for v in vals) + f") {zero}".rstrip()
                if bounded:
                    body = _bounded_multiples(rs, d, ilo, ihi)
                    if body is not None:
                        return f"{body} {zero}".rstrip() if body else ""
                    warn("multipleOf", f"multipleOf {d} together with these bounds: only the bounds are enforced")
                elif d <= MAX_DIVISOR:
                    return f"{_divisible(rs, d)} {zero}".rstrip()
                else:
                    warn("multipleOf", f"multipleOf {d}: a divisor over {MAX_DIVISOR} is not enforced")
            r = int_range(ilo, ihi)
            if zero_fraction and divisor is None:
                # a validator's view: integral floats from 1e16 on, as json.dumps writes them
                # (a multipleOf number is written in plain digits)
                r = _alt([r, *_exponent_forms(self.lo, self.lo_strict, self.hi, self.hi_strict, integer=True)])
            return f"{r} {zero}".rstrip() if r else ""
        if divisor is not None:
            m = divisor[0]
            if bounded:
                warn("multipleOf", f"multipleOf {m} together with bounds on a number: only the bounds are enforced")
            else:
                k = len(_frac_digits(m - math.floor(m)) or "")
                big = int(m * 10**k)
                if big == 1:
                    # a multiple of 10**-k; exponent spellings d.ddd(j digits)e<E> with E >= j - k
                    exp = " | ".join(f'"-"? [1-9] {_frac_j(j)}[eE] {_exp_range(j - k, None)}' for j in range(18))
                    return f"({_decimal_divisible(rs, big, k)} | {exp})"
                if big <= MAX_DIVISOR:
                    return _decimal_divisible(rs, big, k)
                warn("multipleOf", f"multipleOf {float(m)}: a divisor over {MAX_DIVISOR} units is not enforced")
        if non_integer:
            if divisor is not None:
                warn("multipleOf", "multipleOf on a number that must not be an integer is not enforced")
            if not bounded:
                return f'"-"? {_INT} "." [0-9]* [1-9] [0-9]*'
        elif not bounded:
            return f'"-"? {_INT} {_FRAC}? {_EXP}?'
        alts = []
        lo, hi = self.lo, self.hi
        if not non_integer:
            alts += _exponent_forms(self.lo, self.lo_strict, self.hi, self.hi_strict)
        if hi is None or hi >= 0:
            alts += _nonneg_decimal(
                lo if lo is not None and lo > 0 else Fraction(0),
                self.lo_strict if lo is not None and lo >= 0 else False,
                hi,
                self.hi_strict,
                non_integer,
            )
        if lo is None or lo < 0:
            nlo = -hi if hi is not None and hi < 0 else Fraction(0)
            nlo_s = self.hi_strict if hi is not None and hi <= 0 else False
            neg = _nonneg_decimal(nlo, nlo_s, None if lo is None else -lo, self.lo_strict, non_integer)
            if neg:
                alts.append(f'"-" {_alt(neg)}')
        return _alt(alts)

    def _divisor(self, warn: Warn) -> tuple[Fraction] | None:
        if not self.multiple_of:
            return None
        if self.integer:
            # an integer x is a multiple of p/q (lowest terms) iff p divides x
            ds = [m.numerator for m in self.multiple_of]
            return (Fraction(math.lcm(*ds)),)
        ms = self.multiple_of
        if len(ms) == 1:
            return (ms[0],)
        if all(m.denominator == 1 for m in ms):
            return (Fraction(math.lcm(*(int(m) for m in ms))),)
        # lcm of rationals: lcm(numerators) / gcd(denominators)
        return (Fraction(math.lcm(*(m.numerator for m in ms)), math.gcd(*(m.denominator for m in ms))),)


#: digits a generated number may have in each part where the schema sets no bound
#: (llama.cpp's converter allows 16): a model could otherwise write digits without end
GENERATION_DIGITS = 16
_DIGIT_RUN = re.compile(r'(\[0-9\]|"0")(?:([*+])|\{(\d+),(\d*)\})')


def cap_digits(body: str, cap: int, rs: RuleSet | None = None) -> str:
    """``body`` with each open-ended run of digits (``[0-9]*``, ``[0-9]+``, ``[0-9]{k,}``,
    ``"0"*``, ``"0"+``) limited to ``cap`` digits. With ``rs``, every run of ``m`` to
    ``n > m + 1`` digits (capped or not) is a reference to a rule of its own, named for
    its item and counts (``digits-1-16 ::= [0-9]{1,16}``) and shared by the grammar's
    numbers: llama.cpp's parser expands ``x{m,n}`` into ``n - m`` rules at each place it
    is written (a number's range writes a handful of such runs), and a rule whose text
    is the same in every grammar is parsed once per process."""

    def one(m: re.Match[str]) -> str:
        item = m.group(1)
        if m.group(2):
            lo = 0 if m.group(2) == "*" else 1
            hi = max(lo, cap)
        else:
            lo = int(m.group(3))
            hi = max(lo, cap) if m.group(4) == "" else int(m.group(4))
        text = f"{item}{{{lo},{hi}}}"
        if rs is None or hi - lo < 2:
            return text
        return rs.add(f"{'digits' if item == '[0-9]' else 'zeros'}-{lo}-{hi}", text)

    return _DIGIT_RUN.sub(one, body)


Positions = list[tuple[int, int]]  # per digit position, the digit range


def _fixed_positions(lo: int, hi: int, width: int) -> list[Positions]:
    """The ``width``-digit numerals in [lo, hi] as sequences of per-position digit ranges."""
    if width == 0:
        return [[]]
    unit = 10 ** (width - 1)
    lo_d, lo_r = divmod(lo, unit)
    hi_d, hi_r = divmod(hi, unit)
    if lo_d == hi_d:
        return [[(lo_d, lo_d), *rest] for rest in _fixed_positions(lo_r, hi_r, width - 1)]
    out: list[Positions] = []
    start, end = lo_d, hi_d
    if lo_r != 0:
        out += [[(lo_d, lo_d), *rest] for rest in _fixed_positions(lo_r, unit - 1, width - 1)]
        start += 1
    if hi_r != unit - 1:
        end -= 1
    if start <= end:
        out.append([(start, end), *[(0, 9)] * (width - 1)])
    if hi_r != unit - 1:
        out += [[(hi_d, hi_d), *rest] for rest in _fixed_positions(0, hi_r, width - 1)]
    return out


def _nat_positions(lo: int, hi: int | None) -> list[tuple[Positions, bool]]:
    """The numerals of [lo, hi] as (digit ranges, whether any further digits may follow)."""
    lo = max(lo, 0)
    if hi is not None and hi < lo:
        return []
    out: list[tuple[Positions, bool]] = []
    width = len(str(lo))
    while True:
        w_lo = max(lo, 10 ** (width - 1) if width > 1 else 0)
        if hi is not None and hi <= 10**width - 1:
            return out + [(p, False) for p in _fixed_positions(w_lo, hi, width)]
        if hi is None and width > 1 and w_lo == 10 ** (width - 1):
            return [*out, ([(1, 9), *[(0, 9)] * (width - 1)], True)]
        out += [(p, False) for p in _fixed_positions(w_lo, 10**width - 1, width)]
        width += 1


#: the most automaton states (digit positions x remainders) a bounded multipleOf gets
MAX_MULTIPLE_STATES = 20000


def _bounded_multiples(rs: RuleSet, d: int, lo: int | None, hi: int | None) -> str | None:
    """The multiples of d in [lo, hi]: each digit-range alternative of the range crossed
    with the remainder automaton; None when that is too large."""
    sides: list[tuple[str, list[tuple[Positions, bool]]]] = []
    if hi is None or hi >= 0:
        sides.append(("", _nat_positions(max(lo if lo is not None else 0, 0), hi)))
    if lo is None or lo < 0:
        sides.append(('"-" ', _nat_positions(max(1, -hi) if hi is not None else 1, None if lo is None else -lo)))
    cost = sum(len(p) + 1 for _, alts in sides for p, _ in alts) * d
    if cost > MAX_MULTIPLE_STATES:
        return None
    heads = []
    for sign, alts in sides:
        for positions, open_end in alts:
            pre = f"mult{d}"
            states: dict[str, list[tuple[str, str | None]]] = {}
            for i, (a, b) in enumerate(positions):
                for r in range(d if i else 1):
                    by_next: dict[int, list[int]] = {}
                    for dig in range(a, b + 1):
                        by_next.setdefault((r * 10 + dig) % d, []).append(dig)
                    states[f"{i}-{r}"] = [(_digit_set(ds), f"{i + 1}-{r2}") for r2, ds in by_next.items()]
            w = len(positions)
            for r in range(d):
                alts_end: list[tuple[str, str | None]] = [("", None)] if r == 0 else []
                if open_end:
                    by_next = {}
                    for dig in range(10):
                        by_next.setdefault((r * 10 + dig) % d, []).append(dig)
                    alts_end += [(_digit_set(ds), f"{w}-{r2}") for r2, ds in by_next.items()]
                states[f"{w}-{r}"] = alts_end
            head = automaton(rs, pre, "0-0", states.__getitem__)
            if head is not None:
                heads.append(f"{sign}{head}")
    return "(" + " | ".join(heads) + ")" if heads else ""


def _digit_set(ds: list[int]) -> str:
    if len(ds) == 1:
        return f'"{ds[0]}"'
    return "[" + "".join(str(x) for x in ds) + "]"


def _divisible(rs: RuleSet, d: int) -> str:
    """Integers (``-``, no leading zeros) divisible by d: an automaton over the digits."""
    if d == 1:
        return f'"-"? {_INT}'
    hit = rs.memo.get(("div", d))
    if hit is not None:
        return str(hit)
    states: dict[str, list[tuple[str, str | None]]] = {}
    for r in range(d):
        states[str(r)] = [(f'"{dig}"', str((r * 10 + dig) % d)) for dig in range(10)]
        if r == 0:
            states[str(r)].append(("", None))
    states["start"] = [('"0"', None), *((f'"{dig}"', str(dig % d)) for dig in range(1, 10))]
    head = automaton(rs, f"div{d}", "start", states.__getitem__)
    rs.memo[("div", d)] = out = f'"-"? {head}'
    return out


def _decimal_divisible(rs: RuleSet, m: int, k: int) -> str:
    """Decimals that are multiples of m / 10**k (m, k integers): the digits with the point
    moved k places right are divisible by m; past k fraction digits only zeros."""
    hit = rs.memo.get(("dec", m, k))
    if hit is not None:
        return str(hit)
    st: dict[str, list[tuple[str, str | None]]] = {}

    def end_ok(r: int, j: int) -> bool:  # j fraction digits read, state r
        return (r * 10 ** (k - j)) % m == 0 if j <= k else False

    for r in range(m):
        # integer part, state r (at least one digit read)
        st[f"i{r}"] = [(f'"{dig}"', f"i{(r * 10 + dig) % m}") for dig in range(10)]
        st[f"i{r}"] += [("", None)] if end_ok(r, 0) else []
        st[f"i{r}"] += [('"."', f"p1-{r}")]
        for j in range(1, k + 1):  # needs fraction digit j
            st[f"p{j}-{r}"] = []
            for dig in range(10):
                r2 = (r * 10 + dig) % m
                if j < k:
                    st[f"p{j}-{r}"].append((f'"{dig}"', f"q{j}-{r2}"))
                elif r2 == 0:
                    st[f"p{j}-{r}"].append((f'"{dig}" "0"*', None))
            if j < k:
                st[f"q{j}-{r}"] = [("", None)] if end_ok(r, j) else []
                st[f"q{j}-{r}"].append(("", f"p{j + 1}-{r}"))
        if k == 0:
            st[f"p1-{r}"] = [('"0"+', None)] if r == 0 else []
    st["zero"] = [("", None), ('"."', "p1-0")]
    st["start"] = [('"0"', "zero"), *((f'"{dig}"', f"i{dig % m}") for dig in range(1, 10))]
    head = automaton(rs, f"dec{m}e{k}", "start", st.__getitem__)
    rs.memo[("dec", m, k)] = out = f'"-"? {head}'
    return out
