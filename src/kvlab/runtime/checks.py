"""Argument checks every part of kvlab shares: a count (an integer, not a bool, at least a minimum) and a
comma-separated list typed on the command line. Standard library only; no torch.

``check_int("block_size", 0, 1)``  -> ``ValueError: `block_size` must be an int >= 1, got 0``
``parse_list("256,,512", int)``    -> ``ListError: empty item in '256,,512': separate items by single commas``

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
