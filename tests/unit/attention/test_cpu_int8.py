"""The integer KIVI path and the float baseline of the CPU kernel, on every instruction-set path this CPU runs:
integer key scores within their stated bound of the exact scores, the attention output within the bound that
follows, the paths agreeing with each other, the float baseline equal to SDPA."""

import ctypes
import math
import shutil

import pytest
import torch
import torch.nn.functional as F

from kvlab.attention import cpu_baseline, cpu_kernel
from kvlab.quant import KIVIConfig, KIVIState


def _qscale(nbits: int) -> int:
    """The query's steps (_kivi_int.c): a = max_c |q_c| * max_c s_c / QSCALE per row and key group; two digits
    (16 bits) for 4-bit keys, one signed byte for 2-bit keys (their own rounding dwarfs an 8-bit query's)."""
    return 32766 if nbits == 4 else 126

needs_kernel = pytest.mark.skipif(
    shutil.which(cpu_kernel.COMPILER) is None or cpu_kernel.unavailable_reason() is not None,
    reason=f"the CPU kernel cannot be built here: {cpu_kernel.unavailable_reason()}",
)


def _paths() -> list[str]:
    if cpu_kernel.unavailable_reason() is not None:
        return ["scalar"]
    return list(cpu_kernel.ISAS[: cpu_kernel.ISAS.index(cpu_kernel.best_isa()) + 1])


def _state(nbits, head_dim, tokens, group=32, seed=0, kv_heads=2, dtype=torch.float32):
    torch.manual_seed(seed)
    st = KIVIState(KIVIConfig(nbits, group, group))
    st.append(*(torch.randn(1, kv_heads, tokens, head_dim).to(dtype) for _ in range(2)))
    return st


def _codes(packed: torch.Tensor, nbits: int) -> torch.Tensor:
    """[..., D * nbits / 8] uint8 -> [..., D] codes (code i of byte j is channel j * (8 / nbits) + i)."""
    k = 8 // nbits
    shifts = torch.arange(k, dtype=torch.uint8) * nbits
    return ((packed.unsqueeze(-1) >> shifts) & ((1 << nbits) - 1)).flatten(-2).to(torch.int64)


def _int_scores(path, nbits, seg, q, group):
    """kivi_int_key_scores of the C library for head 0 of ``seg``: q [M, D] fp32 -> [M, tokens]."""
    lib = cpu_kernel._loaded("test")
    m, d = q.shape
    kc, ks, kz = (t[0, 0].contiguous() for t in (seg.k_codes, seg.k_scale, seg.k_zero))
    q = q.contiguous()
    out = torch.zeros(m, seg.tokens)
    ptr = ctypes.c_void_p
    lib.kivi_int_key_scores.restype = ctypes.c_int
    lib.kivi_int_key_scores.argtypes = [ctypes.c_int64] * 2 + [ptr] * 3 + [ctypes.c_int64] * 3 + [ptr] * 2
    lib.kivi_int_key_scores.argtypes += [ctypes.c_int64] * 3
    rc = lib.kivi_int_key_scores(
        cpu_kernel.ISAS.index(path), nbits, kc.data_ptr(), ks.data_ptr(), kz.data_ptr(), 0, seg.tokens, group,
        q.data_ptr(), out.data_ptr(), seg.tokens, m, d,
    )  # fmt: skip
    assert rc == 0
    return out


@needs_kernel
@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_integer_key_scores_within_the_stated_bound(nbits, head_dim):
    """|score_int - score_exact| <= a / 2 * sum_c code[t, c] with a = max_c |q_c| * max_c s_c / QSCALE per row and
    key group (the query rounded to 16 bits as a high and a low byte for 4-bit keys, to one byte for 2-bit keys: the
    bound of _kivi_int.c), plus fp32 rounding; every path within it of C."""
    group = 32
    st = _state(nbits, head_dim, 6 * group + 3)
    seg = next(iter(st.segments()))
    q = torch.randn(4, head_dim) * head_dim**-0.5
    codes = _codes(seg.k_codes[0, 0], nbits).double()  # [T, D]
    s, z = seg.k_scale[0, 0].double(), seg.k_zero[0, 0].double()  # [T / G, D]
    keys = codes * s.repeat_interleave(group, 0) + z.repeat_interleave(group, 0)
    exact = q.double() @ keys.T  # [M, T]
    a = q.double().abs().amax(-1)[:, None] * s.abs().amax(-1)[None] / _qscale(nbits)  # [M, T / G]
    bound = a.repeat_interleave(group, 1) / 2 * codes.sum(-1)[None] + 1e-5 * exact.abs().amax()
    got = {p: _int_scores(p, nbits, seg, q, group) for p in _paths()}
    for p, g in got.items():
        err = (g.double() - exact).abs()
        assert (err <= bound).all(), f"{p}: error {err.max():.3g} above the bound"
        assert err.max() > 0, f"{p}: no quantization error at all: the exact path ran"
        # the paths differ only where the query rounds the other way (FMA contraction): within the bound
        assert ((g.double() - got["scalar"].double()).abs() <= bound).all(), f"{p} and scalar differ"


def _attend(st, q, nbits, dot, group=32):
    segs = list(st.segments())
    kw, vw = st.key_residual, st.value_residual
    return cpu_kernel.decode_attention(
        q, segs, kw, vw, nbits, group, q.shape[-1] ** -0.5, None, kw.shape[2] - 1, dot
    )


@needs_kernel
@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_integer_attention_within_the_bound_of_its_two_roundings(nbits, path, dtype, monkeypatch):
    """The int8 path's output against the exact path's: scores off by at most delta (the key bound) move each
    probability by a factor within exp(+-2 delta), so the output by at most (exp(2 delta) - 1) * 2 max|v|; the
    8-bit value weights (one scale per row and 32-token block) add at most sum_t beta/2 * code * u / l <=
    max(p') / 510 * (2^b - 1) * T / l per channel, l the softmax sum. The test checks the measured difference
    against that sum and that it is not zero (the integer path ran); fp32 and bf16 caches (bf16 scales, zeros and
    window, which the AVX paths convert themselves)."""
    monkeypatch.setenv("KVLAB_CPU_ISA", path)
    head_dim, tokens = 64, 700
    st = _state(nbits, head_dim, tokens, seed=1, dtype=dtype)
    assert next(iter(st.segments())).k_scale.dtype == dtype
    q = torch.randn(1, 4, 1, head_dim)
    exact = _attend(st, q, nbits, "exact")
    got = _attend(st, q, nbits, "int8")
    diff = (got - exact).abs().max().item()
    # the bound, from the exact path's pieces
    seg = next(iter(st.segments()))
    codes = _codes(seg.k_codes, nbits).double()  # [1, H, T, D]
    s = seg.k_scale.double().repeat_interleave(32, 2)
    z = seg.k_zero.double().repeat_interleave(32, 2)
    qg = q.double().reshape(1, 2, 2, head_dim) * head_dim**-0.5  # [1, H, rows, D]
    a = qg.abs().amax(-1)[..., None] * s.abs().amax(-1)[:, :, None] / _qscale(nbits)  # [1, H, rows, T]
    delta = (a / 2 * codes.sum(-1)[:, :, None]).amax().item()
    vcodes = _codes(seg.v_codes, nbits).double()
    u = seg.v_scale.double().repeat_interleave(head_dim // seg.v_scale.shape[-1], -1)
    w = seg.v_zero.double().repeat_interleave(head_dim // seg.v_scale.shape[-1], -1)
    v = torch.cat([vcodes * u + w, st.value_residual.double()], 2)
    k = torch.cat([codes * s + z, st.key_residual.double()], 2)
    sc = qg @ k.transpose(-1, -2)
    p = torch.exp(sc - sc.amax(-1, keepdim=True))
    denom = p.sum(-1)
    value_term = (
        p[..., : seg.tokens].amax(-1) * u.amax() / 510 * ((1 << nbits) - 1) * seg.tokens / denom
    ).amax()
    bound = (math.exp(2 * delta) - 1) * 2 * v.abs().amax().item() + value_term.item() + 1e-5
    assert 0 < diff <= bound, f"{path}: difference {diff:.3g}, bound {bound:.3g}"


@needs_kernel
def test_integer_paths_agree_and_exact_is_the_default(monkeypatch):
    st = _state(4, 128, 500, seed=2)
    q = torch.randn(1, 4, 1, 128)
    assert cpu_kernel.dot_path() == "exact"
    torch.testing.assert_close(_attend(st, q, 4, None), _attend(st, q, 4, "exact"), rtol=0, atol=0)
    outs = {}
    for p in _paths():
        monkeypatch.setenv("KVLAB_CPU_ISA", p)
        outs[p] = _attend(st, q, 4, "int8")
        assert cpu_kernel.key_score_path(4, 128, "int8") == f"int8 ({p})"
    for o in outs.values():
        torch.testing.assert_close(o, outs["scalar"], rtol=1e-4, atol=1e-5)
    assert cpu_kernel.key_score_path(8, 128, "int8").startswith("exact (int8 does not take 8-bit")


@needs_kernel
def test_no_environment_variable_chooses_the_key_score_path(monkeypatch):
    """$KVLAB_KIVI_DOT once set a process-wide default; caches now choose by their own ``:dot=`` and the variable
    no longer reached them, yet a call without ``dot`` (bench kernel's kivi<b> rows) still read it, and
    describe() named its value as the path of every call. It is read nowhere now, and describe() says so."""
    st = _state(4, 128, 500, seed=2)
    q = torch.randn(1, 4, 1, 128)
    exact = _attend(st, q, 4, None)
    monkeypatch.setenv("KVLAB_KIVI_DOT", "int8")
    assert cpu_kernel.dot_path() == "exact"
    torch.testing.assert_close(_attend(st, q, 4, None), exact, rtol=0, atol=0)
    assert "KIVI key scores exact unless a call asks another dot path" in cpu_kernel.describe()


@needs_kernel
def test_the_path_named_is_the_path_that_ran_where_int8_values_do_not_take_the_head_dim(monkeypatch):
    """At head_dim 96 the AVX paths' integer value sums do not take the problem and exact value sums run: the
    output equals the int8-keys path's, so the name says int8-keys, not int8 (the scalar path runs both in int8)."""
    st = _state(4, 96, 300, seed=3)
    q = torch.randn(1, 4, 1, 96)
    for p in _paths():
        monkeypatch.setenv("KVLAB_CPU_ISA", p)
        name = cpu_kernel.key_score_path(4, 96, "int8", 32)
        same = torch.equal(_attend(st, q, 4, "int8"), _attend(st, q, 4, "int8-keys"))
        assert name.startswith("int8-keys (") == same, f"{p}: {name!r}, outputs equal: {same}"
        assert name.startswith("int8") and p in name
    monkeypatch.delenv("KVLAB_CPU_ISA")
    assert cpu_kernel.key_score_path(4, 128, "int8", 32) == f"int8 ({cpu_kernel.isa()})"


@needs_kernel
def test_bad_isa_and_dot_values_are_named(monkeypatch):
    monkeypatch.setenv("KVLAB_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="KVLAB_CPU_ISA.*'sse9'"):
        cpu_kernel.isa()
    monkeypatch.delenv("KVLAB_CPU_ISA")
    with pytest.raises(ValueError, match="dot must be one of.*'int4'"):
        cpu_kernel.dot_path("int4")
    if cpu_kernel.best_isa() != "avx512":
        monkeypatch.setenv("KVLAB_CPU_ISA", "avx512")
        with pytest.raises(ValueError, match="above what this CPU runs"):
            cpu_kernel.isa()


@needs_kernel
@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("tokens,heads,head_dim", [(1000, (32, 8), 128), (77, (9, 3), 64)])
def test_float_baseline_equals_sdpa(path, dtype, tokens, heads, head_dim, monkeypatch):
    """The float baseline against SDPA in fp32 over the same (bf16/fp16/fp32) K/V: equal within 2e-6 (fp32
    rounding of reordered sums); a bf16 query and output round once, within one bf16 ulp of the fp32 result."""
    monkeypatch.setenv("KVLAB_CPU_ISA", path)
    torch.manual_seed(3)
    hq, hkv = heads
    k = torch.randn(2, hkv, tokens, head_dim).to(dtype)
    v = torch.randn(2, hkv, tokens, head_dim).to(dtype)
    q = torch.randn(2, hq, 1, head_dim)
    scale = head_dim**-0.5
    ref = F.scaled_dot_product_attention(q, k.float(), v.float(), scale=scale, enable_gqa=True)
    got = cpu_baseline.float_decode_attention(q, k, v, scale)
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=2e-6)
    got16 = cpu_baseline.float_decode_attention(q.bfloat16(), k, v, scale)
    ref16 = F.scaled_dot_product_attention(
        q.bfloat16().float(), k.float(), v.float(), scale=scale, enable_gqa=True
    )
    torch.testing.assert_close(got16.float(), ref16, rtol=8e-3, atol=8e-3)


def test_float_baseline_names_a_problem_it_cannot_take():
    q = torch.randn(1, 4, 1, 24)
    kv = torch.randn(1, 2, 10, 24)
    with pytest.raises(ValueError, match="head_dim 24"):
        cpu_baseline.float_decode_attention(q, kv, kv, 0.2)
    with pytest.raises(ValueError, match="differ"):
        cpu_baseline.float_decode_attention(q, kv, kv[:, :, :5], 0.2)

