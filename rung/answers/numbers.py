"""Numbers as people write them, read one way, and answers that hedge.

One reading for the grader (`verdict`, before every task family's scorer in rung.answers.verify, so that
math-verify, reasoning-gym's exact match and its regex scorers see the same answer) and for dedup
(`plain`, in rung.data.filters.normalise, so that one problem written two ways is one problem).
Hand-written: math-verify reads LaTeX, not `1.5e3`, `12 345` or `1 1/2`; reasoning-gym's scorers each
read their own subset; no installed library reads number words.
"""

from __future__ import annotations

import re
from fractions import Fraction

# Minus signs other than ASCII's: U+2212 (the Unicode minus), U+FE63 (small), U+FF0D (full-width).
_MINUS = str.maketrans(dict.fromkeys("\u2212\ufe63\uff0d", "-"))
# Thousands separators, one kind throughout a number: comma, a thin, narrow no-break, no-break or plain
# space, LaTeX's thin space `\,` and its `{,}`. Not "(1,2)" or "1,2345": a group is 3 digits.
_SEPARATORS = (",", "\u2009", "\u202f", "\u00a0", " ", "\\,", "{,}")
_SEPARATED = re.compile(
    "|".join(rf"(?<![\d.,])\d{{1,3}}(?:{re.escape(s)}\d{{3}})+(?!\d|{re.escape(s)}\d)" for s in _SEPARATORS)
)
# Scientific notation in LaTeX or text: `1.5 \times 10^{3}`, `1.5·10^3` (read as 1.5e3). Exponents of at
# most 3 digits: a model's `1e99999999` must not make the grader build a number of that size.
_TIMES_TEN = re.compile(
    r"(\d)\s*(?:\\times|\\cdot|×|·|\*)\s*10\s*\^\s*(?:\{\s*([-+]?\d{1,3})\s*\}|([-+]?\d{1,3})(?!\d))"
)
# `\frac{3}{4}`, `\dfrac{3}{4}`, `\frac34`: read as 3/4; after a digit a mixed number (`1\frac{1}{2}`: 1 1/2).
_FRAC = re.compile(r"(?:(\d)\s*)?\\[dt]?frac\s*(?:\{\s*(-?\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
# One number of plain text: an integer, decimal or fraction, a mixed number (`1 1/2`), `1.5e3`; a sign
# only where it is not a binary minus ("5-3" holds 5 and 3).
_NUMBER = re.compile(
    r"(?<![\w./])[-+]?(?:\d+[ \t]+\d+/\d+|(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d{1,3})?(?:/\d+)?)(?!\w|\.\d|/\d)"
)

# Number words: cardinals and their compounds ("twenty-three", "three hundred"). "one" alone is left a
# word, as it is as often a pronoun ("which one"); in a compound it is a number.
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
_UNITS += "seventeen eighteen nineteen"
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS.split())}
_WORD_VALUES |= {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9}
_WORD = "|".join(sorted(_WORD_VALUES | _SCALES, key=len, reverse=True))
_WORDS = re.compile(rf"\b(?:{_WORD})(?:[ \t-]+(?:{_WORD}))*\b", re.IGNORECASE)

# Words that hedge an answer; with a single-number reference also "or"/"either" (a multi-valued reference
# may be listed "2 or 3"). Checked only where the reference lacks them.
_HEDGES = re.compile(
    r"\b(?:maybe|perhaps|probably|possibly|likely|unlikely|not\s+sure|unsure|not\s+certain|uncertain|i\s+think|"
    r"guess|approximately|approx|roughly|about|around|nearly|almost)\b|\?|≈|\\approx|\\sim",
    re.IGNORECASE,
)
_ALTERNATIVES = re.compile(r"\b(?:or|either)\b", re.IGNORECASE)
# What may stand around a single-number answer, nothing else: `x =` before it, a currency sign, a unit
# after it (`\text{cm}`, degrees, a few words; not `%`, which some tasks read as
# a hundredth and others not).
_ASSIGNED = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*")
_CURRENCY = re.compile(r"^(?:\\\$|\$|€|£)\s*")
_UNIT = re.compile(
    r"\s*(?:\\(?:text|mathrm|mbox)\s*\{[A-Za-z .]*\}|\^\s*\{?\\circ\}?|°|[A-Za-z]+(?:\s+[A-Za-z]+){0,2})\s*$"
)


def _spelled(m: re.Match[str]) -> str:
    """A run of number words in digits: one number per well-formed compound ("one two" is 1 2)."""
    out: list[str] = []
    total = current = 0
    last = ""  # "" (none yet), "unit", "tens" or "scale"
    words = [w.lower() for w in re.split(r"[ \t-]+", m.group())]
    for w in words:
        if w in _SCALES:
            if last == "":
                current = 1
            if _SCALES[w] == 100:
                current *= 100
            else:
                total, current = total + current * _SCALES[w], 0
            last = "scale"
            continue
        value = _WORD_VALUES[w]
        if last == "unit" or (last == "tens" and not 0 < value < 10):
            out.append(str(total + current))
            total = current = 0
        current += value
        last = "tens" if value >= 20 else "unit"
    out.append(str(total + current))
    if words == ["one"]:
        return m.group()
    return " ".join(out)


def plain(text: str) -> str:
    """The text with its numbers written plainly: ASCII minus, no thousands separators, LaTeX fractions as
    `3/4`, scientific notation as `1.5e3`, number words as digits ("twelve" is 12, "twenty-three" 23)."""
    text = _WORDS.sub(_spelled, text.translate(_MINUS))
    text = _SEPARATED.sub(lambda m: re.sub(r"\D", "", m.group()), text)
    text = _TIMES_TEN.sub(lambda m: f"{m.group(1)}e{m.group(2) or m.group(3)}", text)
    return _FRAC.sub(
        lambda m: f"{m.group(1) + ' ' if m.group(1) else ''}{m.group(2) or m.group(3)}/{m.group(4) or m.group(5)}",
        text,
    )


def _value(token: str) -> Fraction | str:
    """A number token's value; the token itself where it has none (`1/0`, digits past Python's int limit)."""
    body = token.lstrip("+-")
    try:
        whole, _, part = body.rpartition(" ") if "/" in body else ("", "", body)
        value = int(whole or 0) + Fraction(part.strip())
    except (ValueError, ZeroDivisionError):
        return token
    return -value if token.startswith("-") else value


def values(text: str) -> list[Fraction | str]:
    """Every number of the text, each standard form read as one number (see `plain`)."""
    return [_value(m.group().replace("\t", " ")) for m in _NUMBER.finditer(plain(text))]


def single(text: str) -> Fraction | None:
    """The number the text is, where it is one number and nothing else but an `x =` before it, a currency
    sign or a unit around it (`x = 4`, `\\$5`, `12\\text{ cm}`, `5 apples`); else None."""
    rest = _CURRENCY.sub("", _ASSIGNED.sub("", plain(text).strip()))
    found = list(_NUMBER.finditer(rest))
    if len(found) != 1 or found[0].start() != 0:
        return None
    after = rest[found[0].end() :]
    value = _value(found[0].group())
    return value if isinstance(value, Fraction) and (not after or _UNIT.fullmatch(after)) else None


def written(value: Fraction) -> str:
    """One way to write a number: `1500`, `-0.75`, `1/3` (a decimal where it ends)."""
    d = value.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return str(value)
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    digits = str(abs(value.numerator) * 10**places // value.denominator).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[: len(digits) - places]}.{digits[-places:]}" if places else f"{sign}{digits}"


def _hedge_words(text: str) -> set[str]:
    return {" ".join(m.group().lower().split()) for m in _HEDGES.finditer(text)}


def hedges(answer: str, gold: str) -> bool:
    """Whether the answer hedges or offers several candidates where the reference gives one: a hedge word
    (maybe, probably, not sure, approximately, `?`, ...) the reference does not hold, or, against a
    reference that is one number, "or"/"either" or more than one distinct number (`12 (13)`, `12, 13`)."""
    if _hedge_words(answer) - _hedge_words(gold):
        return True
    if single(gold) is None:
        return False
    return bool(_ALTERNATIVES.search(answer)) or len(set(values(answer))) > 1


def verdict(answer: str, gold: str) -> bool | None:
    """The grade wherever numbers decide it, the same in every task family: False where the answer hedges
    (`hedges`); where answer and reference are each one number in a standard form (`single`), whether they
    are the same number (`1,000`, `1.0e3` and `1000` are all right against `1000`; a rounded `0.333333`
    is not 1/3); else None, for the task's own scorer to decide. The numbers are compared here, not by the
    scorer: reasoning-gym's gsm_symbolic scorer reads `-3` as 3 and its default one compares strings."""
    if hedges(answer, gold):
        return False
    value, reference = single(answer), single(gold)
    return None if value is None or reference is None else value == reference
