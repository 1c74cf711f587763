"""Argument checks every part of kvlab shares: a count (an integer, not a bool, at least a minimum), one integer
typed on the command line (``6000``, ``6_000`` or ``6,000``, as kvlab's messages print numbers) and a
comma-separated list typed on the command line. Standard library only; no torch.

``check_int("block_size", 0, 1)``  -> ``ValueError: `block_size` must be an int >= 1, got 0``
``read_int("1,048,576")``          -> ``1048576``; ``read_int("6,00")`` -> ``ValueError`` naming '6,00'
``parse_list("256,,512", int)``    -> ``ListError: empty item in '256,,512': separate items by single commas``

A message that echoes a flag's value prints it with :func:`echoed_value`: plain for a list flag's item.

Every one-integer flag of kvlab has ``type=int_flag()`` (``int_flag(1)`` where the flag has a minimum), so a value
pasted from a message (``--max-len 6,000``) is read; a comma-separated LIST flag (``--contexts 256,512``) has
``type=int_list`` instead, its commas separating items.

:class:`ListError` is both a ``ValueError`` (for a library caller) and an ``argparse.ArgumentTypeError``, so a
parser given ``type=int_list`` prints its message after ``kvlab: error:`` and exits 2.
"""

from __future__ import annotations

import argparse
import math
import numbers
import re
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def is_int(value: object) -> bool:
    """True for an integer (Python or NumPy) that is not a bool: ``True`` is not one token, one block or one step."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int = 0, *, flag: str | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool, Python or NumPy) and at least ``minimum``.

    Args:
        name: what the caller calls the value (its parameter or flag), named in the error.
        value: the value to check.
        minimum: the least value accepted (0: a count; 1: a size).
        flag: the command-line flag that set it, named after ``name`` (``"--copy-mib"``).

    Raises:
        ValueError: ``value`` is a bool, not an integer (``1.0``, ``"4"``, ``None``) or below ``minimum``; the message
            names ``name``, ``minimum`` and the value.
    """
    if not is_int(value) or value < minimum:  # type: ignore[operator]
        where = f"`{name}`" + (f" ({flag})" if flag else "")
        raise ValueError(f"{where} must be an int >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[call-overload]


_GROUPED = re.compile(r"[+-]?[0-9]{1,3}(?:,[0-9]{3})+")  # 6,000 and 1,048,576: commas grouping digits by threes


def read_int(text: str, *, what: str = "a whole number") -> int:
    """The integer ``text`` writes: plain digits (``6000``), Python's underscores (``6_000``, as ``int`` reads
    them) or commas grouping the digits by threes (``6,000``, ``1,048,576``: how kvlab's messages and tables print
    numbers, so a value copied from one is read); spaces around it are ignored. ``what``: the value's kind in
    the message (``"a whole number >= 1"``).

    Raises:
        ValueError: ``text`` is not an integer (``"6.5"``, ``"x"``, ``""``), or its commas do not group its digits
            by threes (``"6,00"``, ``"60,00"``, ``"6,0000"``: a typo, never guessed); the message quotes ``text``.
    """
    plain = str(text).strip()
    if "," in plain:
        if not _GROUPED.fullmatch(plain):
            raise ValueError(
                f"expected {what}, got {text!r}: commas must group its digits by threes (6,000; 1,048,576)"
            )
        plain = plain.replace(",", "")
    try:
        return int(plain)
    except ValueError:
        raise ValueError(f"expected {what}, got {text!r}") from None


def _power_text(bound: int) -> str:
    """``2**62`` for a power of two, else the number with separators (a bound said in a message)."""
    exponent = bound.bit_length() - 1
    return f"2**{exponent}" if bound > 1024 and bound == 1 << exponent else f"{bound:,}"


def int_flag(minimum: int | None = None, *, below: int | None = None) -> Callable[[str], int]:
    """The argparse ``type`` of a one-integer flag: :func:`read_int` (``6000``, ``6_000``, ``6,000``), at least
    ``minimum`` where given, below ``below`` in magnitude where given (``2**62``: numpy int64 arrays).
    ``parser.add_argument("--max-len", type=int_flag(1))``.

    Argparse prints a refusal after the flag, as it does its own: ``kvlab plan: error: argument --context:
    expected a whole number, got '6,00': commas must group its digits by threes (6,000; 1,048,576)``;
    ``argument --keep-tokens: expected a whole number >= 1, got '0'``.

    Not for a comma-separated list flag (``--contexts``): its commas separate items (:func:`int_list`).
    """
    what = "a whole number" if minimum is None else f"a whole number >= {minimum}"

    def one_int(text: str) -> int:
        try:
            value = read_int(text, what=what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if below is not None and abs(value) >= below:
            raise argparse.ArgumentTypeError(f"must be below {_power_text(below)} in magnitude, got {text!r}")
        return value

    return one_int


def echoed_value(value: int, *, list_flag: bool) -> str:
    """``value`` as a message prints it beside the flag that set it, so the user can paste it back: plain
    (``99999999``) for an item of a comma-separated list flag (``--contexts``, ``--nbits``: :func:`int_list` reads
    ``99,999,999`` as three items), else with thousands separators (``99,999,999``, which a one-integer flag reads:
    :func:`read_int`)."""
    return str(value) if list_flag else f"{value:,}"


class ListError(argparse.ArgumentTypeError, ValueError):
    """A comma-separated list that cannot be read: the message names the text and the bad item."""


def parse_list(
    text: str, convert: Callable[[str], T] = str, *, what: str = "an item", unique: bool = True
) -> list[T]:
    """Items of ``text`` separated by commas (spaces around a comma, or spaces alone, also separate), each through
    ``convert``: ``"256, 512,1024"`` -> ``[256, 512, 1024]`` with ``convert=int``.

    Args:
        text: what the user typed.
        convert: turns one item into a value, raising ``ValueError`` for an item it refuses.
        what: one item's kind with its article, for the message (``"an integer >= 1"``, ``"a cache name"``).
        unique: refuse an item given twice (a context or cache named twice would be measured twice).

    Raises:
        ListError: no items (``""``), an empty item (``"256,,512"``, a trailing comma), an item ``convert`` refuses,
            or (``unique``) an item given twice; the message quotes ``text`` and the item.
    """
    parts = re.split(r"\s*,\s*|\s+", str(text).strip())
    if not any(parts):
        raise ListError(f"expected a comma-separated list, got {text!r}")
    if not all(parts):
        raise ListError(f"empty item in {text!r}: separate items by single commas")
    values: list[T] = []
    for part in parts:
        try:
            values.append(convert(part))
        except ValueError:
            raise ListError(f"{part!r} in {text!r} is not {what}") from None
    if unique:
        twice = [p for i, p in enumerate(parts) if p in parts[:i]]
        if twice:
            raise ListError(f"{twice[0]!r} is given twice in {text!r}")
    return values


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def one(item: str) -> int:
        value = int(item)
        if value < minimum:
            raise ValueError(item)
        return value

    return one


def int_list(text: str, minimum: int = 1, *, unique: bool = True) -> list[int]:
    """:func:`parse_list` of integers, each at least ``minimum`` (contexts, batch sizes, block sizes).

    Raises:
        ListError: as :func:`parse_list`, or an item that is not an integer or is below ``minimum`` (named).
    """
    return parse_list(text, _int_at_least(minimum), what=f"an integer >= {minimum}", unique=unique)


def _finite(item: str) -> float:
    value = float(item)
    if not math.isfinite(value):
        raise ValueError(item)
    return value


def float_list(text: str, *, unique: bool = True) -> list[float]:
    """:func:`parse_list` of finite numbers (``"0, 0.5,1"``).

    Raises:
        ListError: as :func:`parse_list`, or an item that is not a finite number (named).
    """
    return parse_list(text, _finite, what="a finite number", unique=unique)
