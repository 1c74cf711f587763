"""Atomic file writes: a temporary file in the target's folder, then ``os.replace``.

A reader never sees a half-written file, and a crash leaves the old file (or none). The file gets the
permissions an ordinary ``open(path, "w")`` would give (``0o666`` minus the umask), not ``mkstemp``'s private
``0o600``. Pure Python; no torch.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(
    path: str | os.PathLike, write: Callable[[IO], Any], *, binary: bool = False, newline: str | None = None
) -> Path:
    """Call ``write(f)`` on a temporary file next to ``path``, then move it onto ``path``; returns ``path``.

    ``f`` is opened in binary mode with ``binary``, else as UTF-8 text with ``newline`` (``""`` for ``csv``).
    The parent folder must exist. On any error the temporary file is removed and ``path`` is left as it was.

    Raises:
        OSError: ``path`` exists and is neither a regular file nor a folder (a character device such as
            ``/dev/null``, a FIFO, a socket: :func:`special_file`; errno ``EINVAL``, nothing written), or the
            temporary file cannot be created, written or moved onto ``path`` (a folder that does not
            exist or takes no files, no permission, a full disk, ``path`` a directory): the same error class and
            errno, with ``filename`` ``path`` (never the hidden temporary file, which the user never named).
        Exception: whatever ``write`` raises, unchanged.
    """
    path = Path(path)
    odd = special_file(path)
    if odd:  # os.replace would put a regular file where a device, FIFO or socket stood
        raise OSError(errno.EINVAL, f"exists and is {odd}, not a regular file: kvlab replaces only files", str(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _naming(exc, path) from exc
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would make the file private to its writer
        text_kwargs = {} if binary else {"encoding": "utf-8", "newline": newline}
        with os.fdopen(fd, "wb" if binary else "w", **text_kwargs) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename in (tmp, None):
            raise _naming(exc, path) from exc
        raise
    return path


_SPECIAL = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def special_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is (``"a character device"``, ``"a FIFO"``, ...) when it exists, links included, and is
    neither a regular file nor a folder; None otherwise (absent, a broken link, a file, a folder). An output that
    is one is never written: replacing it swaps a device for a file, opening a FIFO waits for a reader."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return next((what for test, what in _SPECIAL if test(mode)), "not a regular file")


def special_input_problem(path: str | os.PathLike, what: str) -> str | None:
    """``"<path> is a character device, not a regular file; pass <what>"`` where the input ``path`` exists and is
    neither a regular file nor a folder (:func:`special_file`: ``/dev/null`` reads as an empty
    file, ``/dev/urandom`` or a FIFO never ends), else None: a missing file or a folder is named by the reader."""
    odd = special_file(path)
    return None if odd is None else f"{path} is {odd}, not a regular file; pass {what}"


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` (its class, errno and reason) about ``path``: ``[Errno 2] No such file or directory: '<path>'``."""
    return type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), str(path))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda f: f.write(text))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2, **dumps_kwargs: Any) -> Path:
    """Write ``obj`` as JSON (``indent`` 2, a final newline) to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, **dumps_kwargs) + "\n")


def output_problem(path: str | os.PathLike, flag: str, *, folder_must_exist: bool = False) -> str | None:
    """Why ``path`` cannot take an output file, as far as can be told before writing (``None`` when it can): it is a
    folder, it exists and is not a regular file (a device, a FIFO, a socket: :func:`special_file`), a file stands where a folder of it should be, its folder does not exist (``folder_must_exist``: for a
    writer that creates no folders), or its nearest existing folder is not writable (a file is created there and
    removed to tell, since ``os.access`` trusts root even on ``/proc``). Commands call it before spending minutes
    measuring; ``flag`` names the option in the message."""
    p = Path(path)
    if p.is_dir():
        return f"{flag} {p} is a folder; pass a file"
    odd = special_file(p)
    if odd:  # --force would replace a device with a file; reading the old page would wait on a FIFO
        return f"{flag} {p} is {odd}, not a regular file; pass a file"
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag} {p}: {ancestor} is a file, not a folder"
    if folder_must_exist and ancestor != p.parent:
        return f"{flag} {p}: folder {p.parent} does not exist"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{flag} {p}: folder {ancestor} is not writable"
    try:  # access() says yes to root everywhere, and a folder such as /proc takes no files even then: try one
        fd, probe = tempfile.mkstemp(prefix=".kvlab-probe.", dir=ancestor)
    except OSError as exc:
        return f"{flag} {p}: folder {ancestor} takes no files ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(probe)
    return None


@contextmanager
def staged_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """A set of files written together or not at all: the ``with`` body writes them into the temporary folder it is
    given (hidden, beside ``folder`` on the same file system); on a clean exit they are moved into ``folder``
    (a new ``folder`` is the temporary one renamed, so it appears complete; into an existing one each file is moved
    by ``os.replace``, replacing a file of the same name). On any exception, ``KeyboardInterrupt`` included, the
    temporary folder and what it holds are removed and ``folder`` is left as it was. The parent of ``folder`` must
    exist; where it takes no files, or ``folder`` is a mount point, the temporary folder is made inside ``folder``.

    Raises:
        OSError: the temporary folder cannot be made or a file not moved (no permission, a full disk), naming
            ``folder``. Exceptions of the body propagate, after the cleanup.
    """
    folder = Path(folder)
    where = folder.resolve().parent
    if folder.is_dir() and (not os.access(where, os.W_OK) or os.stat(folder).st_dev != os.stat(where).st_dev):
        where = folder
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.resolve().name}.", suffix=".tmp", dir=where))
    except OSError as exc:
        raise _naming(exc, folder) from exc
    try:
        yield tmp
        if not folder.exists():
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 would make the new folder private to its writer
            os.rename(tmp, folder)
            return
        for entry in sorted(tmp.iterdir()):
            os.replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone after a rename; emptied after the moves
