"""Numbers as people write them: digit strings of many lengths, English number words, and the
grouping and decimal conventions of English, French, German and Spanish.

The calculator reads plain digits with a `.` decimal point: a question shows a localised or worded
form, and the tool call carries the plain one.
"""

from __future__ import annotations

import random

__all__ = ["LOCALES", "digits", "localise", "number_words", "operand"]

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int, *, use_and: bool = False) -> str:
    """0 <= n < 1,000,000 in English words: 23 -> 'twenty-three', 312 -> 'three hundred twelve'
    ('three hundred and twelve' with `use_and`)."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number_words covers 0 .. 999999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        t, o = divmod(n, 10)
        return _TENS[t] + (f"-{_ONES[o]}" if o else "")
    if n < 1000:
        h, r = divmod(n, 100)
        head = f"{_ONES[h]} hundred"
        return head if r == 0 else head + (" and " if use_and else " ") + number_words(r)
    th, r = divmod(n, 1000)
    head = f"{number_words(th, use_and=use_and)} thousand"
    if r == 0:
        return head
    return head + (" and " if use_and and r < 100 else " ") + number_words(r, use_and=use_and)


def digits(rng: random.Random, lo: int = 1, hi: int = 12) -> str:
    """A whole number of `lo`..`hi` digits; one in four has runs of a repeated digit (7777, 100000,
    5999), the strings a copying model most often gets wrong."""
    n = rng.randint(lo, hi)
    if rng.random() < 0.25 and n >= 3:
        d = rng.choice("123456789")
        fill = rng.choice(("0", "9", d, d))
        run = rng.randint(2, n - 1)
        body = d + fill * run
        tail = "".join(rng.choice("0123456789") for _ in range(n - len(body)))
        return body + tail
    first = rng.choice("123456789") if n > 1 else rng.choice("0123456789")
    return first + "".join(rng.choice("0123456789") for _ in range(n - 1))


def operand(rng: random.Random) -> str:
    """A calculator operand: mostly 1-4 digits, sometimes long, sometimes a short decimal."""
    r = rng.random()
    if r < 0.35:
        return str(rng.randint(1, 99))
    if r < 0.75:
        return str(rng.randint(10, 9999))
    if r < 0.9:
        return digits(rng, 4, 12)
    return f"{rng.randint(0, 999)}.{rng.randint(1, 99)}"


# locale -> (group separator, decimal separator); the French group is a (narrow) space
LOCALES: dict[str, tuple[str, str]] = {"en": (",", "."), "fr": (" ", ","), "de": (".", ","), "es": (".", ",")}


def localise(number: str, locale: str, *, group: bool = True) -> str:
    """A canonical number (`1234567.5`) as `locale` writes it (`1 234 567,5` in French)."""
    sep, dec = LOCALES[locale]
    whole, _, frac = number.partition(".")
    sign = "-" if whole.startswith("-") else ""
    whole = whole.lstrip("-")
    if group and len(whole) > 4:
        rev = whole[::-1]
        whole = sep.join(rev[i : i + 3] for i in range(0, len(rev), 3))[::-1]
    return sign + whole + (dec + frac if frac else "")
