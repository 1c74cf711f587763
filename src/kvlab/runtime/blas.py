"""Threads of the BLAS library numpy calls (OpenBLAS), set at run time.

numpy reads ``OPENBLAS_NUM_THREADS`` / ``OMP_NUM_THREADS`` only when it is first imported, and ``kvlab`` has
imported it long before a command parses ``--threads``; ``torch.set_num_threads`` does not reach numpy's BLAS. So
this module finds the OpenBLAS libraries loaded in this process (``/proc/self/maps``, plus numpy's bundled
``numpy.libs``) and calls their ``*openblas_set_num_threads*`` entry point through ``ctypes``, as threadpoolctl
does (https://github.com/joblib/threadpoolctl), without the dependency. Linux only; elsewhere, or with another
BLAS, nothing is changed and :func:`blas_threads` yields ``None``.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
from collections.abc import Iterator

from kvlab.runtime.checks import check_int

# entry points of OpenBLAS builds: plain, 64-bit-int symbol suffixes, and scipy-openblas' prefixed names
_SET = (
    "openblas_set_num_threads",
    "openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads64_",
    "scipy_openblas_set_num_threads",
)
_GET = (
    "openblas_get_num_threads",
    "openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads64_",
    "scipy_openblas_get_num_threads",
)


def _loaded_openblas() -> list[str]:
    """Paths of the OpenBLAS shared libraries mapped into this process (Linux), numpy's first."""
    paths: list[str] = []
    try:
        import numpy

        libs = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
        paths += sorted(glob.glob(os.path.join(libs, "*openblas*.so*")))
    except ImportError:
        pass
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(" ", 1)[-1].strip()
                if "openblas" in os.path.basename(path).lower() and ".so" in path and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _entry_points() -> list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]:
    """``(set, get)`` function pairs of every loaded OpenBLAS that exports them."""
    found = []
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)  # only libraries already loaded
        except (OSError, AttributeError):
            continue
        setter = next((getattr(lib, n) for n in _SET if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GET if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            found.append((setter, getter))
    return found


def get_blas_threads() -> int | None:
    """Threads of the first loaded OpenBLAS (numpy's), or ``None`` when none is found."""
    points = _entry_points()
    return int(points[0][1]()) if points else None


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[int | None]:
    """Run the ``with`` body with every loaded OpenBLAS at ``n`` threads; the previous counts are restored after.

    Yields the count now in effect (``n``), or ``None`` when no OpenBLAS was found (nothing changed).

    Raises:
        ValueError: ``n`` is not an int >= 1.
    """
    check_int("BLAS threads", n, 1)
    points = _entry_points()
    previous = [int(get()) for _, get in points]
    for setter, _ in points:
        setter(ctypes.c_int(n))
    try:
        yield n if points else None
    finally:
        for (setter, _), count in zip(points, previous):
            setter(ctypes.c_int(count))
