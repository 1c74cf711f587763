"""A compiled C kernel for one KIVI or FP8 decode step on the CPU, built at first use, loaded with ctypes.

The pure-torch fused path (:mod:`kvlab.attention.torch_kivi`) spends most of a short-context decode step on operator
overhead (~30 operators per layer); this kernel does a layer's attention over the packed blocks and the
full-precision window in one call: scores with the key scale folded into the query once per key group, softmax,
and ``p @ V`` with each value token dequantized in registers (fp32 accumulation, IEEE arithmetic: no fast-math).
The (batch row, KV head) items are split over OpenMP threads, as many as ``torch.get_num_threads()``; the kernel
links the ``libgomp.so.1`` torch has already loaded, so both share one thread pool.

The same library reads an FP8 cache's float8 codes in place (:func:`fp8_decode_attention`, for
``FP8Cache(attention="fused")``): each e4m3/e5m2 code becomes fp32 with integer ops in registers (exact, subnormals
included), the per-head scales fold into the query and the output, so a decode step never widens the history to a
float copy.

An integer path for KIVI (``_kivi_int.c``; :func:`dot_path`: ``dot="int8"``, exact fp32 the default and the
reference): the query, key scale folded in, rounded per row and key group to 16 bits (a signed high and an
unsigned low byte) for 4-bit keys, to one signed byte for 2-bit keys; key scores are integer dot products over the
codes, one token per 32-bit lane; value
sums weight the codes by 8-bit probabilities (times the per-token value scale, one scale per row and 32-token
block), four tokens per lane: llama.cpp's q8 dot product (AVX512-VNNI ``dpbusd`` / AVX2 ``maddubs`` + ``madd``)
over KIVI's per-channel keys and per-token values (arXiv:2402.02750, section 3.2). The instruction-set path is
chosen at run time (:func:`best_isa`), a lower one forced by ``KVLAB_CPU_ISA`` (:func:`isa`). The same file holds
the float baseline (:mod:`kvlab.attention.cpu_baseline`).

Build: the C sources ship with the package; the first call that needs them runs the system C compiler (``cc``, or
``$KVLAB_CC``), ``_kivi_cpu.c`` with :data:`CFLAGS` (``-O2 -fpeel-loops -march=native ...``) and ``_kivi_int.c`` without
``-march`` (each path has its own ``__attribute__((target))``), the two in parallel, linked into
``$KVLAB_KERNEL_DIR`` or ``$XDG_CACHE_HOME/kvlab/kernels`` (default ``~/.cache/kvlab/kernels``), named by a hash of
the sources, :data:`HEADERS`, the flags, the CPU (``-march=native`` code runs only where it was built) and one of
the compiler's version; where no compiler can run, a build of the same sources, flags and CPU by an earlier compiler
is loaded. Written to a temporary name and moved into place (concurrent processes are safe); after a build, all but
the :data:`KEEP_BUILDS` newest kernels of the folder are deleted. Nothing is compiled on ``import kvlab``.
Where it cannot be built or loaded (no compiler, a failed build) or ``KVLAB_CPU_KERNEL=0``,
:func:`unavailable_reason` says why and ``kivi_attention(backend="auto")`` keeps the torch path.

Source: KIVI (arXiv:2402.02750) section 3.3 (dequantization fused into the attention kernel).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kvlab.runtime.cache_dirs import build_once
from kvlab.runtime.cache_dirs import cache_dir as runtime_cache_dir

SOURCE = Path(__file__).with_name("_kivi_cpu.c")
# integer key scores and the float baseline, one __attribute__((target)) per instruction-set path: built without
# -march=native so that a lower path (KVLAB_CPU_ISA) really runs the lower instructions
INT_SOURCE = Path(__file__).with_name("_kivi_int.c")
# included beside the sources: _kivi_simd.h (both: bf16, exp, vector types), _kivi_int_x86.h (_kivi_int.c's x86 paths)
HEADERS = (Path(__file__).with_name("_kivi_simd.h"), Path(__file__).with_name("_kivi_int_x86.h"))
COMPILER = os.environ.get("KVLAB_CC", "cc")
# -O2 + complete peeling (the -O3 part the kernels need): ~13 s of one core for _kivi_cpu.c where -O3 took ~46 s
CFLAGS = ("-O2", "-fpeel-loops", "-march=native", "-fPIC", "-shared", "-fopenmp")
# INT_SOURCE's flags after CFLAGS' optimisation level (CFLAGS[0])
INT_CFLAGS = ("-fpeel-loops", "-fPIC", "-fopenmp", "-Wno-psabi")
COMPILE_TIMEOUT_S = 600  # several times a 2-core VM's ~20 s build of one core, for a loaded machine
# kernels kept in cache_dir() after a build, the new one among them (other installs' builds stay usable)
KEEP_BUILDS = 4
# query rows (GQA heads x query tokens) one item may have: decode and short speculative steps; longer queries
# (prefill chunks) keep the torch path
MAX_ROWS = 64
# below this many keys a call runs on one thread (items are split over threads, one (batch row, KV head) each)
PARALLEL_MIN_TOKENS = 256
SEG_FIELDS = 19  # int64 entries per segment in the kernel's argument array (see _kivi_cpu.c)
_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}

_lib: ctypes.CDLL | None = None
_failure: str | None = None  # why the last build/load failed (cached for the process)
_path: Path | None = None  # the file the loaded kernel came from


def cache_dir() -> Path:
    """Where built kernels are kept: ``$KVLAB_KERNEL_DIR``, else ``$XDG_CACHE_HOME/kvlab/kernels``, else
    ``~/.cache/kvlab/kernels``."""
    return runtime_cache_dir("kernels", "KVLAB_KERNEL_DIR")


def _machine_key() -> str:
    """The CPU the kernel is built for (``-march=native``): architecture, model name and feature flags."""
    parts = [platform.machine(), platform.system()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                if not line.strip():  # first processor only
                    break
    except OSError:
        parts.append(platform.processor())
    return "\n".join(parts)


def _compiler_version() -> str:
    """``$COMPILER --version``'s first line; raises ``OSError`` when there is no such compiler."""
    done = subprocess.run([COMPILER, "--version"], capture_output=True, text=True, timeout=30, check=False)
    return (done.stdout or done.stderr).splitlines()[0] if (done.stdout or done.stderr) else ""


def _build_key() -> str:
    """Hash of what the binary depends on besides the compiler: the sources, their headers, the flags, the CPU."""
    h = hashlib.sha256()
    flags = " ".join(CFLAGS) + " | " + " ".join(_int_flags())
    files = (SOURCE, INT_SOURCE, *HEADERS)
    for part in (*(p.read_bytes() for p in files), flags.encode(), _machine_key().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:20]


def library_path() -> Path:
    """The path the kernel for this source, flags, CPU and compiler is built to (it may not exist yet):
    ``kivi_cpu-<source, flags, CPU>-<compiler version>.so``.

    Raises:
        OSError: the compiler cannot be run.
    """
    cc = hashlib.sha256(_compiler_version().encode()).hexdigest()[:8]
    return cache_dir() / f"kivi_cpu-{_build_key()}-{cc}.so"


def _prebuilt() -> Path | None:
    """The newest kernel already built for this source, flags and CPU by any compiler (used when none can run)."""
    found = sorted(cache_dir().glob(f"kivi_cpu-{_build_key()}-*.so"), key=lambda q: q.stat().st_mtime)
    return found[-1] if found else None


def _int_flags() -> tuple[str, ...]:
    """Flags of :data:`INT_SOURCE`: :data:`CFLAGS`' optimisation level, then :data:`INT_CFLAGS`."""
    return (CFLAGS[0], *INT_CFLAGS)


def _run_compilers(commands: list[list[str]]) -> None:
    """Run the compile commands at once (one process each: the two translation units build in parallel on two
    cores), each within :data:`COMPILE_TIMEOUT_S`.

    Raises:
        RuntimeError: a compiler failed (its message's tail is included). OSError: it could not be run.
        subprocess.TimeoutExpired: one ran past the timeout (all are killed).
    """
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    try:
        for p in procs:
            out, err = p.communicate(timeout=COMPILE_TIMEOUT_S)
            if p.returncode != 0:
                raise RuntimeError(f"{COMPILER} exited with {p.returncode}: {(err or out).strip()[-400:]}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _build(target: Path) -> None:
    """Compile :data:`SOURCE` (``CFLAGS``, ``-march=native``) and :data:`INT_SOURCE` (no ``-march``: each
    instruction-set path has its own ``target`` attribute) in parallel and link them to ``target`` (a temporary
    name in the same folder, then ``os.replace``).

    Raises:
        RuntimeError: the compiler failed (its message's tail is included). OSError: it could not be run.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    # a one-time step that would look like a hang between two progress lines (10-20 s on a 2-core VM: said after)
    print(
        f"building kvlab's CPU decode kernel once ({COMPILER} {CFLAGS[0]}; tens of seconds at most; kept in "
        f"{target.parent}) ...",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    fd, tmp = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp.so", dir=target.parent)
    os.close(fd)
    objects = [f"{tmp}.{n}.o" for n in ("main", "int")]
    try:
        _run_compilers(
            [
                [COMPILER, *CFLAGS, "-c", str(SOURCE), "-o", objects[0]],
                [COMPILER, *_int_flags(), "-c", str(INT_SOURCE), "-o", objects[1]],
            ]
        )
        _run_compilers([[COMPILER, "-shared", "-fopenmp", *objects, "-o", tmp]])
        os.replace(tmp, target)
        print(f"built kvlab's CPU decode kernel in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    finally:
        for f in (tmp, *objects):
            if os.path.exists(f):
                os.unlink(f)


def prune_builds(keep: Path, limit: int = KEEP_BUILDS) -> list[Path]:
    """Delete all but the ``limit`` most recently written ``kivi_cpu-*.so`` files in ``keep``'s folder; ``keep``
    itself (the kernel just built) always stays. A file that cannot be deleted (another user's, already gone) is
    left alone. Returns the deleted paths.

    Raises:
        ValueError: ``limit < 1``.
    """
    if limit < 1:
        raise ValueError(f"limit must be >= 1 (the kernel just built stays), got {limit!r}")
    found = []
    for q in keep.parent.glob("kivi_cpu-*.so"):
        try:
            found.append((q.stat().st_mtime, q))
        except OSError:
            continue
    others = [q for _, q in sorted(found, reverse=True) if q != keep]
    removed = []
    for q in others[limit - 1 :]:
        try:
            q.unlink()
            removed.append(q)
        except OSError:
            continue
    return removed


def _load() -> ctypes.CDLL:
    """Build (if needed) and load the kernel; raises on failure."""
    global _path
    try:
        path = library_path()
    except OSError:  # no compiler: a kernel built earlier for this source and CPU still runs
        path = _prebuilt()
        if path is None:
            raise
    if build_once(path, _build):  # once, also when eval's probe helper needs it at the same time
        prune_builds(path)
    lib = ctypes.CDLL(str(path))
    _path = path
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.kivi_decode_step.restype = ctypes.c_int
    lib.kivi_decode_step.argtypes = [ptr, i64, ctypes.c_double, *[i64] * 7, ptr, i64, ptr, ptr, *[i64] * 8]
    lib.kivi_decode_step.argtypes += [ptr, *[i64] * 4, ptr, ptr, ptr, i64, i64, i64]
    lib.kvlab_int_roof.restype = i64
    lib.kvlab_int_roof.argtypes = [i64, i64, i64]
    lib.kvlab_isa_best.restype = ctypes.c_int
    lib.kvlab_isa_best.argtypes = []
    lib.kivi_int_supported.restype = ctypes.c_int
    lib.kivi_int_supported.argtypes = [i64, i64, i64]
    lib.kivi_int_values_supported.restype = ctypes.c_int
    lib.kivi_int_values_supported.argtypes = [i64, i64, i64, i64]
    lib.float_decode_step.restype = ctypes.c_int
    lib.float_decode_step.argtypes = [i64, ptr, i64, ctypes.c_double, *[i64] * 4, ptr, ptr, i64, i64, ptr]
    lib.float_decode_step.argtypes += [ptr, ptr, ptr, i64, i64]
    lib.kivi_work_floats.restype = i64
    lib.kivi_work_floats.argtypes = [i64, i64]
    lib.fp8_decode_step.restype = ctypes.c_int
    lib.fp8_decode_step.argtypes = [ptr, i64, ctypes.c_double, *[i64] * 5, ptr, ptr, i64, ptr, ptr, ptr, ptr]
    lib.fp8_decode_step.argtypes += [ptr, ptr, *[i64] * 8, ptr, *[i64] * 4, ptr, ptr, ptr, i64, i64]
    return lib


def unavailable_reason() -> str | None:
    """``None`` when the kernel is loaded (building it now if needed), else why it cannot run here: disabled by
    ``KVLAB_CPU_KERNEL=0``, no compiler, a failed build or load. A failure is remembered for the process."""
    global _lib, _failure
    if os.environ.get("KVLAB_CPU_KERNEL", "1").strip() == "0":
        return "disabled by KVLAB_CPU_KERNEL=0"
    if _lib is not None:
        return None
    if _failure is not None:
        return _failure
    try:
        _lib = _load()
    except FileNotFoundError:
        _failure = f"no C compiler: {COMPILER!r} not found (set KVLAB_CC to one)"
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        _failure = f"the CPU kernel could not be built or loaded: {type(e).__name__}: {e}"
    return _failure


def reset() -> None:
    """Forget the loaded kernel and any remembered failure (tests; a changed ``COMPILER`` or cache dir)."""
    global _lib, _failure
    _lib, _failure = None, None


def describe() -> str:
    """One line for benchmark records: which path CPU ``kivi_attention(backend="auto")`` decode steps take, and the
    instruction-set path (:func:`isa`); the key-score path is each call's ``dot`` (:func:`dot_path`), not one."""
    reason = unavailable_reason()
    if reason is None:
        return (
            f"compiled C kernel ({_path.name}, {' '.join(CFLAGS)}; KIVI key scores exact unless a call asks "
            f"another dot path, instruction-set path {isa()} of {best_isa()})"
        )
    return f"torch ({reason})"


# the instruction-set paths of _kivi_int.c, lowest first (their index is the C code)
ISAS = ("scalar", "avx2", "avx512")
# KIVI attention: "exact" (fp32 dot products over dequantized codes, the reference), "int8" (the query quantized
# to 16 bits (two bytes; one byte for 2-bit keys) per row and key group, integer dot products over the codes for the key scores, 8-bit value
# weights per 32-token block for the value sums: _kivi_int.c) or "int8-keys" (integer key scores, exact fp32 values)
DOT_PATHS = ("exact", "int8", "int8-keys")
INT_KEYS_ONLY = 256  # added to the instruction-set code: integer key scores only (_kivi_cpu.c)


def best_isa() -> str:
    """The highest path of :data:`ISAS` this CPU runs (``avx512``: AVX512 F/BW/VL/DQ and VNNI; ``avx2``: AVX2,
    FMA and F16C; else ``scalar``). Raises ``RuntimeError`` where the kernel is not available (the reason named)."""
    return ISAS[_loaded("the CPU kernel").kvlab_isa_best()]


def isa() -> str:
    """The instruction-set path the integer key scores and the float baseline run: ``$KVLAB_CPU_ISA`` when set
    (one of :data:`ISAS`, at most :func:`best_isa`: a lower path can be forced, e.g. to test the AVX2 code on an
    AVX512 CPU), else :func:`best_isa`.

    Raises:
        ValueError: ``KVLAB_CPU_ISA`` is not a path of :data:`ISAS` or is above what this CPU runs.
        RuntimeError: the kernel is not available.
    """
    best = best_isa()
    want = os.environ.get("KVLAB_CPU_ISA", "").strip().lower()
    if not want:
        return best
    if want not in ISAS:
        raise ValueError(f"KVLAB_CPU_ISA must be one of {list(ISAS)}, got {want!r}")
    if ISAS.index(want) > ISAS.index(best):
        raise ValueError(f"KVLAB_CPU_ISA={want!r} is above what this CPU runs ({best!r})")
    return want


def dot_path(dot: str | None = None) -> str:
    """The KIVI key-score path: ``dot`` if given, else ``"exact"`` (one of :data:`DOT_PATHS`; no environment variable:
    the former ``$KVLAB_KIVI_DOT`` is not read). ``"int8"`` runs where :func:`int8_supported`; elsewhere the exact
    path runs. Raises ``ValueError`` for a value outside :data:`DOT_PATHS`."""
    value = (dot if dot is not None else "exact").strip().lower()
    if value not in DOT_PATHS:
        raise ValueError(f"dot must be one of {list(DOT_PATHS)}, got {value!r}")
    return value


def int8_supported(nbits: int, head_dim: int, path: str | None = None) -> bool:
    """Whether the integer key scores take ``nbits`` (2 or 4) and ``head_dim`` on instruction-set ``path``
    (default :func:`isa`): AVX512 needs head_dim a multiple of 64, AVX2 of 32. Raises ``RuntimeError`` where
    the kernel is not available, ``ValueError`` for a bad ``KVLAB_CPU_ISA``."""
    return bool(_loaded("the CPU kernel").kivi_int_supported(ISAS.index(path or isa()), nbits, head_dim))


def key_score_path(nbits: int, head_dim: int, dot: str | None = None, group_size: int | None = None) -> str:
    """What :func:`decode_attention` runs for KIVI at ``nbits`` / ``head_dim`` (and ``group_size``): ``"exact"``,
    ``"int8 (avx512)"`` and the like, ``"int8-keys (...)"`` where ``int8`` was asked but the integer value sums do
    not take the group size (exact values run), or ``"exact (...)"`` where int8 does not take the problem."""
    want = dot_path(dot)
    if want == "exact":
        return "exact"
    path = isa()
    if not int8_supported(nbits, head_dim, path):
        return f"exact (int8 does not take {nbits}-bit codes at head_dim {head_dim} on {path})"
    values = _loaded("the CPU kernel").kivi_int_values_supported
    if want == "int8" and group_size and not values(ISAS.index(path), nbits, head_dim, group_size):
        return f"int8-keys ({path}; int8 value sums do not take head_dim {head_dim}, group {group_size})"
    return f"{want} ({path})"


def unsupported(query, segments, key_window, value_window) -> str | None:
    """Why this problem (``query [B, Hq, q, D]``, the window ``[B, Hkv, w, D]``) does not fit the kernel (``None``
    when it does): not on the CPU, more than :data:`MAX_ROWS` query rows per KV head, query, window or metadata
    dtypes other than bf16/fp32, window channels not contiguous, autograd recording."""
    m = query.shape[1] // key_window.shape[1] * query.shape[2]
    if query.device.type != "cpu":
        return f"the CPU kernel runs on the CPU, got {query.device}"
    if m > MAX_ROWS:
        return f"{m} query rows per KV head (the kernel takes at most {MAX_ROWS})"
    if torch.is_grad_enabled() and (query.requires_grad or key_window.requires_grad):
        return "autograd is recording"
    if key_window.dtype not in _DTYPE_CODE or value_window.dtype != key_window.dtype:
        return f"window dtype {key_window.dtype}/{value_window.dtype} (the kernel reads bf16 or fp32)"
    if query.dtype not in _DTYPE_CODE:
        return f"query dtype {query.dtype} (the kernel reads bf16 or fp32)"
    for w in (key_window, value_window):
        if w.stride(-1) != 1:
            return "a window whose channels are not contiguous"
    meta = {t.dtype for s in segments for t in (s.k_scale, s.k_zero, s.v_scale, s.v_zero)}
    if len(meta) > 1 or (meta and next(iter(meta)) not in _DTYPE_CODE):
        return f"scale/zero dtypes {sorted(map(str, meta))} (the kernel reads one of bf16 or fp32)"
    return None


def _loaded(what: str) -> ctypes.CDLL:
    """The loaded library (built now if needed).

    Raises:
        RuntimeError: ``what`` cannot run here, with :func:`unavailable_reason`'s reason.
    """
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"{what} cannot run: {reason}")
    return _lib


def _window_and_output_args(
    kw, vw, valid_args, q_len, window_offset, scratch, n_scores, out, nthreads
) -> tuple:
    """The arguments both kernels end with: the window ``kw``/``vw`` ``[B, Hkv, w, D]`` (pointers, length, (batch,
    head, token) strides, dtype code), the mask (:func:`_valid_args`), ``q_len`` and the window offset, the scratch
    buffer (``n_scores`` floats of scores, then the work area), the output and its dtype code, the thread count."""
    return (
        kw.data_ptr(), vw.data_ptr(), kw.shape[2], *kw.stride()[:3], *vw.stride()[:3], _DTYPE_CODE[kw.dtype],
        *valid_args, q_len, window_offset,
        scratch.data_ptr(), scratch.data_ptr() + 4 * n_scores, out.data_ptr(), _DTYPE_CODE[out.dtype], nthreads,
    )  # fmt: skip


def _valid_args(valid: torch.Tensor | None) -> tuple[torch.Tensor | None, tuple[int | None, int, int]]:
    """``valid`` (bool ``[1 or B, q_len, kv]``, or None) with contiguous keys, and the kernel's ``(pointer, batch
    stride, query stride)`` of it (batch stride 0 broadcasts one row; ``(None, 0, 0)`` without a mask). Keep the
    returned tensor alive until the call returns."""
    if valid is None:
        return None, (None, 0, 0)
    valid = valid if valid.stride(-1) == 1 else valid.contiguous()
    return valid, (valid.data_ptr(), 0 if valid.shape[0] == 1 else valid.stride(0), valid.stride(1))


def threads(total_tokens: int) -> int:
    """OpenMP threads for a call over ``total_tokens`` keys: ``torch.get_num_threads()``, or 1 below
    :data:`PARALLEL_MIN_TOKENS` (too little work per item to pay for waking another thread)."""
    return 1 if total_tokens < PARALLEL_MIN_TOKENS else torch.get_num_threads()


def _segment_args(segments) -> ctypes.Array:
    """Pointers and (batch, head) strides of every segment tensor, and its token count (see _kivi_cpu.c); a
    tensor whose last two dims are not contiguous is copied first (block views never are)."""
    vals: list[int] = []
    keep = []  # copies must live until the call returns
    for seg in segments:
        for t in (seg.k_codes, seg.k_scale, seg.k_zero, seg.v_codes, seg.v_scale, seg.v_zero):
            st = t.stride()
            if st[3] != 1 or (t.shape[2] > 1 and st[2] != t.shape[3]):
                t = t.contiguous()
                keep.append(t)
                st = t.stride()
            vals += (t.data_ptr(), st[0], st[1])
        vals.append(seg.tokens)
    args = (ctypes.c_int64 * max(1, len(vals)))(*vals)
    args._keep = keep
    return args


def decode_attention(
    query: torch.Tensor,
    segments: list,
    key_window: torch.Tensor,
    value_window: torch.Tensor,
    nbits: int,
    group_size: int,
    scaling: float,
    valid: torch.Tensor | None,
    window_offset: int,
    dot: str | None = None,
) -> torch.Tensor:
    """Attention of ``query [B, Hq, q_len, D]`` (bf16 or fp32; the query heads of a KV head become the rows of one
    item, GQA without repeating K/V) over ``segments`` (:class:`kvlab.quant.kivi.QuantSegmentView`, oldest first)
    and the window ``[B, Hkv, w, D]``, softmax scale ``scaling``; returns ``[B, Hq, q_len, D]`` in ``query.dtype``
    (fp32 accumulation, rounded once at the end).

    ``valid``: ``None`` (all quantized tokens attended; inside the window, query ``i`` sees window tokens
    ``<= i + window_offset``) or a bool ``[1 or B, q_len, Q + w]`` (True = attend). A row with every key masked
    comes out 0. The caller checks the problem first (:func:`unsupported`, ``kivi_attention``'s input checks).
    ``dot``: the key-score path (:func:`dot_path`; default exact). With ``"int8"`` the
    quantized keys' scores come from integer dot products against the query rounded per row and key group to 16 bits
    for 4-bit keys (``_kivi_int.c``: a high and a low byte) or one byte for 2-bit keys, score error at most
    ``a / 2 * sum_c code[t, c]`` with ``a = max_c |q_c| * max_c s_c / 32766`` (``/ 126`` for 2-bit keys);
    the value sums weight the codes by 8-bit probabilities (one scale per row and 32-token block); window and
    softmax stay fp32.

    Raises:
        RuntimeError: the kernel is not available (the reason is named) or rejected the sizes.
        ValueError: a bad ``dot`` or ``KVLAB_CPU_ISA``.
    """
    lib = _loaded("the KIVI CPU kernel")
    int_isa = -1
    path = dot_path(dot)
    if path != "exact":
        code = ISAS.index(isa())
        if lib.kivi_int_supported(code, nbits, query.shape[-1]):
            int_isa = code + (INT_KEYS_ONLY if path == "int8-keys" else 0)
    b, hq, q_len, d = query.shape
    h = key_window.shape[1]
    m = hq // h * q_len
    query = query.contiguous()  # [B, Hq, q, D] is [B, Hkv, M, D] row for row
    w = key_window.shape[2]
    total = sum(seg.tokens for seg in segments) + w
    scratch = torch.empty(b * h * (m * total + lib.kivi_work_floats(m, d)), dtype=torch.float32)
    out = torch.empty(b, hq, q_len, d, dtype=query.dtype)
    meta_bf16 = int(bool(segments) and segments[0].k_scale.dtype == torch.bfloat16)
    kw, vw = key_window, value_window
    valid, (vptr, vb, vq) = _valid_args(valid)
    bf16 = _DTYPE_CODE[query.dtype]
    rc = lib.kivi_decode_step(
        query.data_ptr(), bf16, scaling, b, h, m, d, nbits, group_size,
        len(segments), _segment_args(segments), meta_bf16,
        *_window_and_output_args(
            kw, vw, (vptr, vb, vq), q_len, window_offset, scratch, b * h * m * total, out, threads(total)
        ),
        int_isa,
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(
            f"the KIVI CPU kernel rejected nbits {nbits}, group_size {group_size}, head_dim {d}, q_len {q_len} "
            f"(code {rc})"
        )
    return out


FP8_FORMATS = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1}


def fp8_unsupported(query: torch.Tensor, key_codes: torch.Tensor, key_window: torch.Tensor) -> str | None:
    """Why :func:`fp8_decode_attention` cannot take this problem (``None`` when it can): :func:`unsupported`'s
    reasons for the query and window, codes not float8 e4m3fn/e5m2 on the CPU, a head_dim not a multiple of 8."""
    if key_codes.dtype not in FP8_FORMATS:
        return f"codes of dtype {key_codes.dtype} (the kernel reads float8_e4m3fn or float8_e5m2)"
    if key_codes.shape[-1] % 8:
        return f"head_dim {key_codes.shape[-1]} (the kernel takes multiples of 8)"
    return unsupported(query, (), key_window, key_window)


def _scale_arg(scale: torch.Tensor | None, b: int, h: int) -> tuple[torch.Tensor, int, int]:
    """An FP8 scale (``[B, H or 1, 1, 1]`` fp32, or None = 1.0) as ``(fp32 tensor, batch stride, head stride)``;
    stride 0 broadcasts."""
    if scale is None:
        return torch.ones(1, dtype=torch.float32), 0, 0
    s = scale.to(torch.float32).reshape(scale.shape[0], scale.shape[1]).contiguous()
    return s, (s.stride(0) if s.shape[0] == b else 0), (s.stride(1) if s.shape[1] == h else 0)


def fp8_decode_attention(
    query: torch.Tensor,
    key_codes: torch.Tensor,
    value_codes: torch.Tensor,
    key_scale: torch.Tensor | None,
    value_scale: torch.Tensor | None,
    key_window: torch.Tensor,
    value_window: torch.Tensor,
    scaling: float,
    valid: torch.Tensor | None,
    window_offset: int,
) -> torch.Tensor:
    """Attention of ``query [B, Hq, q_len, D]`` (bf16 or fp32) over ``T`` float8 tokens ``key_codes`` /
    ``value_codes [B, Hkv, T, D]`` (``float8_e4m3fn`` or ``float8_e5m2``, values ``code * scale``; scales
    ``[B, Hkv or 1, 1, 1]`` fp32 or None for 1.0) followed by the full-precision window ``[B, Hkv, w, D]`` (bf16 or
    fp32), softmax scale ``scaling``; returns ``[B, Hq, q_len, D]`` in ``query.dtype`` (fp32 accumulation, rounded
    once). ``valid`` and ``window_offset`` as :func:`decode_attention` (``Q = T``). The codes are read in place
    (never widened to a float copy of the history): vLLM's fp8 KV cache, dequantized inside the attention.

    Raises:
        RuntimeError: the kernel is not available (the reason is named) or rejected the sizes.
    """
    lib = _loaded("the FP8 CPU kernel")
    b, hq, q_len, d = query.shape
    h, t = key_codes.shape[1], key_codes.shape[2]
    m = hq // h * q_len
    query = query.contiguous()
    codes = []
    for c in (key_codes, value_codes):
        if c.stride(-1) != 1:
            c = c.contiguous()
        codes.append(c)
    kc, vc = codes
    strides = (ctypes.c_int64 * 6)(*kc.stride()[:3], *vc.stride()[:3])
    ks, k_sb, k_sh = _scale_arg(key_scale, b, h)
    vs, v_sb, v_sh = _scale_arg(value_scale, b, h)
    scale_strides = (ctypes.c_int64 * 4)(k_sb, k_sh, v_sb, v_sh)
    w = key_window.shape[2]
    total = t + w
    scratch = torch.empty(b * h * (m * total + lib.kivi_work_floats(m, d)), dtype=torch.float32)
    out = torch.empty(b, hq, q_len, d, dtype=query.dtype)
    valid, (vptr, vb, vq) = _valid_args(valid)
    kw, vw = key_window, value_window
    bf16 = _DTYPE_CODE[query.dtype]
    rc = lib.fp8_decode_step(
        query.data_ptr(), bf16, scaling, b, h, m, d, FP8_FORMATS[kc.dtype],
        kc.data_ptr(), vc.data_ptr(), t, strides, ks.data_ptr(), vs.data_ptr(), scale_strides,
        *_window_and_output_args(
            kw, vw, (vptr, vb, vq), q_len, window_offset, scratch, b * h * m * total, out, threads(total)
        ),
    )  # fmt: skip
    if rc != 0:
        raise RuntimeError(f"the FP8 CPU kernel rejected head_dim {d}, q_len {q_len} (code {rc})")
    return out
