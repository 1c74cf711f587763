"""Read a text file as the common tools write it (torch-free, standard library only).

Windows tools mark their text with a byte-order mark: Notepad and Excel's "CSV UTF-8" start UTF-8 with
``EF BB BF``, PowerShell's ``>`` writes UTF-16 with ``FF FE``. Read as plain UTF-8, the first gives a first
column named ``\\ufefftokens`` and the second is not readable as text at all. :func:`read_text` decodes by the
mark (UTF-8 without one) and refuses a file that is not text with its name.

``read_text("w.csv")``  -> the text, without the mark
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

# Longest first: a UTF-32-LE mark starts with the UTF-16-LE one.
_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_text(raw: bytes, name: str | os.PathLike, *, errors: str = "strict") -> str:
    """``raw`` decoded by its byte-order mark (UTF-8 without one), the mark dropped.

    Raises:
        ValueError: the bytes are not text in that encoding (with ``errors="strict"``), naming ``name``.
    """
    encoding, start = "utf-8", 0
    for mark, codec in _MARKS:
        if raw.startswith(mark):
            encoding, start = codec, len(mark)
            break
    try:
        return raw[start:].decode(encoding, errors=errors)
    except UnicodeDecodeError as exc:
        what = "UTF-8" if start == 0 else f"{encoding.upper()} (its byte-order mark says so)"
        raise ValueError(f"{name}: not a text file: not {what} at byte {start + exc.start}") from None


def read_text(path: str | os.PathLike, *, errors: str = "strict", newline: str | None = None) -> str:
    """The text of the file at ``path``, decoded as :func:`decode_text` does.

    ``newline`` as :func:`open` takes it: ``None`` turns ``\\r\\n`` and ``\\r`` into ``\\n``; ``""`` (for
    :mod:`csv`) keeps line ends as they are.

    Raises:
        OSError: the file cannot be read.
        ValueError: not text (naming the file).
    """
    text = decode_text(Path(path).read_bytes(), path, errors=errors)
    if newline is None:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text
