"""The cache registry: its grammar, and every registered cache through ``generate()`` against ``DynamicCache``.

The matrix is :func:`kvlab.caches.registry.cache_names`: a cache is tested the moment it is registered. Exact
caches must give DynamicCache's tokens and logits; lossy caches must stay within their entry's stated relative
logit error (and show some error, or the setup did not quantize anything).
"""

import pytest
import torch

from kvlab.cache_names import parse_cache_name
from kvlab.caches.registry import REGISTRY, CacheSettings, cache_names, resolve
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

PROMPT_TOKENS, NEW_TOKENS = 96, 12
SETTINGS = CacheSettings(group_size=32, residual_length=32, hqq_group_size=32, block_size=16)


@pytest.fixture(scope="module")
def model():
    """A tiny Qwen2 (head_dim 32) running kvlab attention: SDPA for every cache, fused KIVI where asked."""
    import kvlab.attention

    return kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512))


@pytest.fixture(scope="module")
def prompt():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(1, 256, (2, PROMPT_TOKENS), generator=gen)  # [batch, tokens]


def _generate(model, prompt, cache):
    out = model.generate(
        prompt,
        **{cache_kwarg(model): cache},
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    return out.sequences[:, PROMPT_TOKENS:], torch.stack(out.logits, dim=1)  # [B, new], [B, new, vocab]


def _bytes_per_token(model) -> int:
    """Bytes a DynamicCache holds per token and batch row (all layers, K and V) for ``model``."""
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * model.dtype.itemsize


@pytest.fixture(scope="module")
def reference(model, prompt):
    return _generate(model, prompt, resolve("dynamic", SETTINGS).make(model.config))


@pytest.mark.parametrize("name", cache_names())
def test_every_registered_cache_matches_dynamic_cache(name, model, prompt, reference):
    cache = resolve(name, SETTINGS)
    reason = cache.unavailable_reason()
    if reason:
        pytest.skip(reason)
    made = cache.make(model.config)
    tokens, logits = _generate(model, prompt, made)
    ref_tokens, ref_logits = reference
    scale = float(ref_logits.abs().max())
    if cache.entry.evicts:  # exact while nothing is evicted (the defaults keep 108 tokens), else smaller
        if made.evicted_tokens() == 0:
            assert torch.equal(tokens, ref_tokens) and torch.equal(logits, ref_logits), name
        else:
            assert made.nbytes() < prompt.numel() * _bytes_per_token(model), name  # below the prompt's bytes
        return
    if cache.exact:
        assert torch.equal(tokens, ref_tokens), name
        assert float((logits - ref_logits).abs().max()) <= 1e-5 * scale, name
        return
    # compare steps up to the first differing token of any row: until then both saw the same context
    same = (tokens == ref_tokens).all(dim=0)  # [new]
    steps = int(same.long().cumprod(0).sum()) + 1
    rel = float((logits[:, :steps] - ref_logits[:, :steps]).abs().max()) / scale
    assert 0.0 < rel <= cache.logit_bound, (
        f"{name}: relative logit error {rel:.4g}, bound {cache.logit_bound}"
    )


# families whose attention path only the run chooses (no -fused name: mixed-<plan>'s variant is the plan's name)
RUN_PATH_ONLY = [
    n
    for n in cache_names()
    if REGISTRY[parse_cache_name(n, REGISTRY).family].attention_path is not None
    and not REGISTRY[parse_cache_name(n, REGISTRY).family].attention_variants
]


@pytest.mark.parametrize("name", RUN_PATH_ONLY)
def test_a_family_the_run_puts_on_the_fused_path_equals_its_dequantize_path(name, model, prompt, reference):
    """The matrix above runs these at the default path (dequantize); with ``--kivi-attention fused`` the same name
    needs kvlab attention, records the path, and gives the dequantize path's tokens and logits within the fused
    KIVI tests' 1e-4 (its distance to DynamicCache is then the bound the matrix checks)."""
    fused = resolve(name, CacheSettings(**SETTINGS.values(), kivi_attention="fused"))
    plain = resolve(name, SETTINGS)
    assert fused.uses_kvlab_attention and fused.describe()["attention"] == "fused"
    assert plain.describe()["attention"] == "dequantize"
    got, want = (
        _generate(model, prompt, fused.make(model.config)),
        _generate(model, prompt, plain.make(model.config)),
    )
    assert torch.equal(got[0], want[0]), name
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)
    assert float((got[1] - reference[1]).abs().max()) > 0, name  # quantized: not a float copy


def test_grammar_reads_old_spellings_and_settings():
    assert resolve("kivi4-fused").name.canonical == "kivi-4-fused"
    assert resolve("hqq4").name.canonical == "hqq-4"
    r = resolve("kivi-2-dequant:group_size=64:residual_length=256", CacheSettings(kivi_attention="fused"))
    assert (r.settings.group_size, r.settings.residual_length) == (64, 256)
    assert r.describe()["attention"] == "dequantize" and not r.uses_kvlab_attention
    assert resolve("kivi-4", CacheSettings(kivi_attention="fused")).uses_kvlab_attention
    assert resolve("paged:block_size=4").settings.block_size == 4
    assert parse_cache_name("FP8", {"fp8"}).family == "fp8"  # a family ending in digits is not split


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("kivi-3", r"needs bits in \[2, 4, 8\], got 3"),
        ("kivi", r"needs bits in \[2, 4, 8\], got none \(e.g. kivi-4\)"),
        ("kivi:bits=4", r"`kivi` settings are \[.*\], got \['bits'\]"),  # the unknown setting, not the bits
        ("dynamic-4", "takes no bits, got 4"),
        ("kivi-4-fast", "variants are .*got 'fast'"),
        ("paged:group_size=4", r"settings are \['block_size'\], got \['group_size'\]"),
        ("kivi-4:group_size=0", "`group_size` must be an int >= 1, got 0"),
        ("kivi-4:group_size=4:group_size=8", "given twice"),
        ("lru-4", "unknown cache family 'lru'"),
        ("kivi 4", "not family"),
        (4, "must be a string, got 4"),
    ],
)
def test_bad_names_are_refused_with_the_value(name, match):
    with pytest.raises(ValueError, match=match):
        resolve(name)


def test_every_entry_is_listed_and_lossy_ones_state_bounds():
    names = cache_names()
    assert set(REGISTRY) == {resolve(n).family for n in names}
    for n in names:
        r = resolve(n)
        assert r.exact or r.logit_bound > 0, n
        assert r.describe()["name"] == n


def test_planner_reads_the_registry_names_of_the_caches_it_sizes():
    """``kvlab plan --kv-dtype`` takes the registry's grammar for every entry marked ``planner`` (torch-free)."""
    from kvlab.plan.kv_formats import kv_dtype

    for name in cache_names():
        r = resolve(name)
        if not r.entry.planner:
            continue
        if r.family == "fp8":  # takes no settings; the scale decides the metadata bytes
            kvd = kv_dtype(name)
            assert (kvd.name, kvd.element_bytes, kvd.fp8_scale) == (name, 1, r.describe()["scale"]), name
            continue
        kvd = kv_dtype(name + ":group_size=64:residual_length=256")
        bits = (kvd.nbits, kvd.value_code_bits)
        assert (bits, kvd.group_size, kvd.residual_length) == (r.name.bits, 64, 256), name
        if r.nbits is not None:
            assert kv_dtype(name.replace("-", "", 1).split("-")[0]).nbits == r.nbits  # old spelling: kivi4
    with pytest.raises(ValueError, match="kivi-N.*got 'kivix'"):
        kv_dtype("kivix")


def test_kvlab_plan_sizes_each_family_from_the_planner_bytes_its_entry_declares():
    """The registry path of ``kvlab plan --kv-dtype`` (the entry's planner bytes, a PlannedName) gives the format
    the torch-free planner reads from the name alone, for every name of every family that declares planner bytes."""
    from kvlab.commands.plan.flags import kv_dtype_names, planned_kv
    from kvlab.plan.kv_formats import PlannedName, kv_dtype

    sized = [n for n in cache_names() if resolve(n).entry.planner is not None]
    assert {resolve(n).family for n in sized} == {"kivi", "fp8"}
    for name in sized:
        for model_dtype in ("bfloat16", "float32"):
            planned = kv_dtype(PlannedName(name, resolve(name).entry.planner), model_dtype, group_size=64)
            assert planned == kv_dtype(name, model_dtype, group_size=64), name
    for (
        name
    ) in kv_dtype_names():  # every listed name reaches the ledger through its entry (or is a plain dtype)
        planned = planned_kv(name)
        assert isinstance(planned, PlannedName) == (name not in ("auto", "bf16", "fp16", "fp32", "fp8")), name


def test_the_name_grammar_and_the_planner_import_no_torch():
    import subprocess
    import sys

    code = "import sys, kvlab.cache_names, kvlab.plan.ledger; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
