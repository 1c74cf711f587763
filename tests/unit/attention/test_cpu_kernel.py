"""The compiled CPU decode kernel equals dequantize-then-attention; where it cannot run, torch runs and says why."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import kvlab.attention.torch_kivi as torch_kivi
from kvlab.attention import cpu_kernel
from kvlab.attention.quantized import kivi_attention
from kvlab.quant import KIVIConfig, KIVIState

needs_kernel = pytest.mark.skipif(
    shutil.which(cpu_kernel.COMPILER) is None or cpu_kernel.unavailable_reason() is not None,
    reason=f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}",
)


@pytest.fixture
def quick_build(monkeypatch):
    """The build-machinery tests compile with -O0 (about 1 s instead of ~13 s at -O2 on a 2-core VM, where three
    full builds under load once crossed the compile timeout): the same build path, flags, naming and pruning."""
    monkeypatch.setattr(cpu_kernel, "CFLAGS", ("-O0", *cpu_kernel.CFLAGS[1:]))


def reference(query, keys, values, scaling, mask):
    """Float attention with repeated KV heads; ``mask`` bool [B,1,q,kv] (True = attend)."""
    g = query.shape[1] // keys.shape[1]
    k = keys.repeat_interleave(g, dim=1).float()
    v = values.repeat_interleave(g, dim=1).float()
    scores = (query.float() @ k.transpose(-1, -2) * scaling).masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _problem(nbits, group, head_dim, history, residual, block, dtype=torch.float32, batch=2, q_len=1, seed=0):
    """A KIVI state of ``history`` tokens (``batch`` rows, 2 KV heads, 4 query heads), its segments and window
    after appending ``q_len`` new tokens, the dequantized keys/values of everything, and a query."""
    torch.manual_seed(seed)
    cfg = KIVIConfig(nbits=nbits, group_size=group, residual_length=residual, block_tokens=block)
    state = KIVIState(cfg)
    state.append(
        torch.randn(batch, 2, history, head_dim).to(dtype), torch.randn(batch, 2, history, head_dim).to(dtype)
    )
    segments, deq = list(state.segments()), state.dequantize_prefix()
    kw, vw = state.append(
        torch.randn(batch, 2, q_len, head_dim).to(dtype), torch.randn(batch, 2, q_len, head_dim).to(dtype)
    )
    keys = kw if deq is None else torch.cat([deq[0].to(dtype), kw], dim=-2)
    values = vw if deq is None else torch.cat([deq[1].to(dtype), vw], dim=-2)
    query = torch.randn(batch, 4, q_len, head_dim).to(dtype)
    return segments, kw, vw, keys, values, query


@needs_kernel
@pytest.mark.parametrize("nbits", [2, 4, 8])
@pytest.mark.parametrize("group,head_dim", [(32, 64), (64, 128), (128, 128), (16, 64)])
@pytest.mark.parametrize("residual_groups", [0, 1])
def test_kernel_equals_dequantize_then_attention(nbits, group, head_dim, residual_groups):
    """Batch 2, GQA 4/2, several blocks, left padding in row 1, with and without a full-precision window (R = 0
    keeps only the new token in it)."""
    residual = residual_groups * group
    block = 2 * group if group >= 64 else 4 * group
    segments, kw, vw, keys, values, query = _problem(nbits, group, head_dim, 9 * group + 5, residual, block)
    assert len(segments) >= 2
    total = keys.shape[-2]
    mask = torch.ones(2, 1, 1, total, dtype=torch.bool)
    mask[1, ..., :7] = False
    scale = head_dim**-0.5
    got = kivi_attention(
        query, segments, kw, vw, nbits, group, scale, attention_mask=mask, backend="cpu-kernel"
    )
    torch.testing.assert_close(got, reference(query, keys, values, scale, mask), rtol=5e-4, atol=5e-4)
    plain = kivi_attention(query, segments, kw, vw, nbits, group, scale, backend="cpu-kernel")
    full = torch.ones_like(mask)
    torch.testing.assert_close(plain, reference(query, keys, values, scale, full), rtol=5e-4, atol=5e-4)


@needs_kernel
@pytest.mark.parametrize("nbits", [2, 4])
def test_kernel_bf16_cache_matches_torch_path(nbits):
    """The bench's case: a bf16 cache (bf16 scales, zeros and window), the kernel against the torch path."""
    segments, kw, vw, _, _, query = _problem(nbits, 32, 64, 700, 128, 256, dtype=torch.bfloat16, batch=1)
    a = kivi_attention(query, segments, kw, vw, nbits, 32, 0.125, backend="cpu-kernel").float()
    b = kivi_attention(query, segments, kw, vw, nbits, 32, 0.125, backend="torch").float()
    torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)  # both round the output to bf16


@needs_kernel
@pytest.mark.parametrize("q_len", [2, 3])
def test_kernel_short_queries_causal_in_the_window(q_len):
    """q_len > 1 without a mask: the causal rule inside the window (``window_offset``), and with a full mask."""
    segments, kw, vw, keys, values, query = _problem(4, 32, 64, 300, 64, 128, q_len=q_len)
    total = keys.shape[-2]
    past = total - q_len
    causal = torch.arange(total)[None, :] <= (past + torch.arange(q_len))[:, None]
    mask = causal[None, None].expand(2, 1, q_len, total)
    ref = reference(query, keys, values, 0.125, mask)
    got = kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="cpu-kernel")
    torch.testing.assert_close(got, ref, rtol=5e-4, atol=5e-4)
    got_mask = kivi_attention(
        query, segments, kw, vw, 4, 32, 0.125, attention_mask=mask, backend="cpu-kernel"
    )
    torch.testing.assert_close(got_mask, ref, rtol=5e-4, atol=5e-4)


@needs_kernel
def test_kernel_fully_masked_row_is_zero_and_threads_agree():
    segments, kw, vw, keys, values, query = _problem(2, 32, 64, 500, 32, 128)
    mask = torch.ones(2, 1, 1, keys.shape[-2], dtype=torch.bool)
    mask[1] = False  # a padding row: every key masked
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kivi_attention(query, segments, kw, vw, 2, 32, 0.125, attention_mask=mask, backend="cpu-kernel")
        torch.set_num_threads(2)
        two = kivi_attention(query, segments, kw, vw, 2, 32, 0.125, attention_mask=mask, backend="cpu-kernel")
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(one[1], torch.zeros_like(one[1]))
    assert torch.equal(one, two)  # items are split over threads, each computed the same way


@needs_kernel
def test_auto_takes_the_kernel_on_cpu_decode(monkeypatch):
    segments, kw, vw, _, _, query = _problem(4, 32, 64, 200, 32, 128)

    def torch_path(*a, **k):
        raise AssertionError("the torch two-pass path ran")

    monkeypatch.setattr(torch_kivi, "_two_pass", torch_path)
    kivi_attention(query, segments, kw, vw, 4, 32, 0.125)  # auto: the kernel, not _two_pass


def test_missing_compiler_falls_back_and_says_why(monkeypatch, tmp_path):
    segments, kw, vw, _, _, query = _problem(4, 32, 64, 200, 32, 128)
    monkeypatch.setattr(cpu_kernel, "COMPILER", "kvlab-no-such-cc")
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path))
    cpu_kernel.reset()
    try:
        reason = cpu_kernel.unavailable_reason()
        assert reason is not None and "no C compiler" in reason and "kvlab-no-such-cc" in reason
        assert cpu_kernel.describe().startswith("torch (no C compiler")
        got = kivi_attention(query, segments, kw, vw, 4, 32, 0.125)  # auto: torch
        ref = kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="torch")
        assert torch.equal(got, ref)
        with pytest.raises(RuntimeError, match="cpu-kernel.*no C compiler"):
            kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="cpu-kernel")
        assert list(tmp_path.iterdir()) == []
    finally:
        cpu_kernel.reset()


def test_disabled_by_environment(monkeypatch):
    segments, kw, vw, _, _, query = _problem(4, 32, 64, 200, 32, 128)
    monkeypatch.setenv("KVLAB_CPU_KERNEL", "0")

    def kernel(*a, **k):
        raise AssertionError("the kernel ran")

    monkeypatch.setattr(cpu_kernel, "decode_attention", kernel)
    assert cpu_kernel.unavailable_reason() == "disabled by KVLAB_CPU_KERNEL=0"
    kivi_attention(query, segments, kw, vw, 4, 32, 0.125)
    with pytest.raises(RuntimeError, match="KVLAB_CPU_KERNEL=0"):
        kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="cpu-kernel")


@needs_kernel
def test_failed_build_is_reported(monkeypatch, tmp_path, quick_build):
    monkeypatch.setattr(cpu_kernel, "CFLAGS", (*cpu_kernel.CFLAGS, "-fno-such-flag-kvlab"))
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path))
    cpu_kernel.reset()
    try:
        reason = cpu_kernel.unavailable_reason()
        assert reason is not None and "could not be built" in reason and "no-such-flag-kvlab" in reason
        assert list(tmp_path.iterdir()) == []  # no half-written library left behind
    finally:
        cpu_kernel.reset()


@needs_kernel
def test_build_goes_to_the_cache_dir_once(monkeypatch, tmp_path, quick_build, capsys):
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path / "k"))
    cpu_kernel.reset()
    try:
        assert cpu_kernel.unavailable_reason() is None
        err = capsys.readouterr().err  # the one-time wait is said, and how long it took (no fixed "~13 s")
        assert "building kvlab's CPU decode kernel once" in err and " s on two cores" not in err
        took = re.search(r"built kvlab's CPU decode kernel in (\d+\.\d) s", err)
        assert took is not None and float(took.group(1)) >= 0, err
        built = list((tmp_path / "k").iterdir())
        assert [p.suffix for p in built] == [".so"] and built[0] == cpu_kernel.library_path()
        mtime = built[0].stat().st_mtime_ns
        cpu_kernel.reset()
        assert cpu_kernel.unavailable_reason() is None  # loaded from the cache, not rebuilt
        assert "building" not in capsys.readouterr().err
        assert built[0].stat().st_mtime_ns == mtime and list((tmp_path / "k").iterdir()) == built
    finally:
        cpu_kernel.reset()


@needs_kernel
def test_a_built_kernel_still_loads_when_the_compiler_is_gone(monkeypatch, tmp_path, quick_build):
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path))
    cpu_kernel.reset()
    try:
        assert cpu_kernel.unavailable_reason() is None  # built with the real compiler
        built = list(tmp_path.iterdir())
        monkeypatch.setattr(cpu_kernel, "COMPILER", "kvlab-no-such-compiler")
        cpu_kernel.reset()
        assert cpu_kernel.unavailable_reason() is None  # the cached build, found by source, flags and CPU
        assert list(tmp_path.iterdir()) == built and built[0].name in cpu_kernel.describe()
        monkeypatch.setattr(cpu_kernel, "CFLAGS", (*cpu_kernel.CFLAGS, "-DKVLAB_OTHER_BUILD"))
        cpu_kernel.reset()  # other flags: nothing cached matches, and nothing can build it
        assert "no C compiler" in cpu_kernel.unavailable_reason()
    finally:
        cpu_kernel.reset()


@pytest.mark.parametrize("index", [0, 1])
def test_the_headers_are_in_the_build_key(monkeypatch, tmp_path, index):
    """The sources include _kivi_simd.h and _kivi_int_x86.h: a change to either names another kernel file, so it
    is rebuilt."""
    included = cpu_kernel.SOURCE.read_text() + cpu_kernel.INT_SOURCE.read_text()
    assert all(f'#include "{h.name}"' in included for h in cpu_kernel.HEADERS)
    header = tmp_path / cpu_kernel.HEADERS[index].name
    header.write_bytes(cpu_kernel.HEADERS[index].read_bytes())
    headers = list(cpu_kernel.HEADERS)
    headers[index] = header
    monkeypatch.setattr(cpu_kernel, "HEADERS", tuple(headers))
    before = cpu_kernel._build_key()
    header.write_text(header.read_text() + "/* changed */\n")
    assert cpu_kernel._build_key() != before


def test_prune_keeps_the_newest_builds_and_the_new_one(tmp_path):
    old = []
    for i in range(6):  # kivi_cpu-0.so is the oldest
        q = tmp_path / f"kivi_cpu-{i}.so"
        q.write_bytes(b"x")
        os.utime(q, (1000 + i, 1000 + i))
        old.append(q)
    other = tmp_path / "notes.txt"  # not a kernel: never touched
    other.write_text("keep")
    new = tmp_path / "kivi_cpu-new.so"
    new.write_bytes(b"x")
    os.utime(new, (10, 10))  # even with an old mtime, the kernel just built stays
    removed = cpu_kernel.prune_builds(new, limit=3)
    assert sorted(removed) == sorted(old[:4])
    assert sorted(tmp_path.iterdir()) == sorted([new, old[4], old[5], other])
    assert cpu_kernel.prune_builds(new, limit=3) == []  # nothing more to delete
    with pytest.raises(ValueError, match="limit must be >= 1.*0"):
        cpu_kernel.prune_builds(new, limit=0)


@needs_kernel
def test_a_build_prunes_stale_kernels(monkeypatch, tmp_path, quick_build):
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path))
    stale = []
    for i in range(cpu_kernel.KEEP_BUILDS + 2):
        q = tmp_path / f"kivi_cpu-stale{i}.so"
        q.write_bytes(b"x")
        os.utime(q, (1000 + i, 1000 + i))
        stale.append(q)
    cpu_kernel.reset()
    try:
        assert cpu_kernel.unavailable_reason() is None  # built now
        left = sorted(tmp_path.glob("kivi_cpu-*.so"))
        assert len(left) == cpu_kernel.KEEP_BUILDS and cpu_kernel.library_path() in left
        assert set(left) - {cpu_kernel.library_path()} == set(stale[-(cpu_kernel.KEEP_BUILDS - 1) :])
    finally:
        cpu_kernel.reset()


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("KVLAB_KERNEL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cpu_kernel.cache_dir() == tmp_path / "kvlab" / "kernels"
    monkeypatch.setenv("KVLAB_KERNEL_DIR", str(tmp_path / "mine"))
    assert cpu_kernel.cache_dir() == tmp_path / "mine"


def test_import_compiles_nothing(tmp_path):
    env = dict(os.environ, KVLAB_KERNEL_DIR=str(tmp_path))
    code = "import kvlab, kvlab.attention, kvlab.attention.quantized, kvlab.bench.decode"
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert list(tmp_path.iterdir()) == []


@needs_kernel
def test_unsupported_problems_keep_torch_or_name_the_reason():
    segments, kw, vw, _, _, query = _problem(4, 32, 64, 200, 32, 128, dtype=torch.float16)
    got = kivi_attention(query, segments, kw, vw, 4, 32, 0.125)  # fp16: torch
    assert torch.equal(got, kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="torch"))
    with pytest.raises(RuntimeError, match="float16"):
        kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="cpu-kernel")


@needs_kernel
def test_segment_tensors_in_another_layout_are_read_right():
    """A segment whose tensors are not row-major in their last two dims (not what a cache hands over) is copied."""
    segments, kw, vw, _, _, query = _problem(4, 32, 64, 300, 32, 128)

    def column_major(t):
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)

    odd = [
        type(s)(
            *(
                column_major(getattr(s, f))
                for f in ("k_codes", "k_scale", "k_zero", "v_codes", "v_scale", "v_zero")
            ),
            s.tokens,
        )
        for s in segments
    ]
    assert odd[0].k_codes.stride(-1) != 1
    got = kivi_attention(query, odd, kw, vw, 4, 32, 0.125, backend="cpu-kernel")
    assert torch.equal(got, kivi_attention(query, segments, kw, vw, 4, 32, 0.125, backend="cpu-kernel"))


@needs_kernel
@pytest.mark.parametrize("dot", ["exact", "int8"])
@pytest.mark.parametrize("q_len", [1, 2])
def test_items_split_over_token_ranges_equal_the_unsplit_kernel(dot, q_len):
    """3 threads over 4 (batch row, KV head) items: each item is split into 3 token ranges whose softmax states are
    merged (flash-decoding); the output equals one thread's up to fp32 rounding, masks and padding rows included."""
    segments, kw, vw, keys, _, query = _problem(4, 32, 64, 40 * 32 + 5, 64, 256, q_len=q_len)
    mask = torch.ones(2, 1, q_len, keys.shape[-2], dtype=torch.bool)
    mask[0, ..., 100:900] = False  # a whole part of row 0 masked
    mask[1] = False  # a padding row: every key masked
    valid = mask[:, 0]
    saved = torch.get_num_threads()
    outs = {}
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            outs[n] = cpu_kernel.decode_attention(
                query, segments, kw, vw, 4, 32, 0.125, valid, kw.shape[2] - q_len, dot=dot
            )
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outs[1][1], torch.zeros_like(outs[1][1]))
    assert not torch.equal(outs[1][0], torch.zeros_like(outs[1][0]))
    torch.testing.assert_close(outs[3], outs[1], rtol=1e-5, atol=1e-6)
