"""MixedCache(attention="fused"): each layer hands kvlab attention its own history (a KIVI layer its packed prefix at
its bits, an FP8 layer its codes, a float layer nothing), and the output equals the dequantize path's within the
tolerance of the KIVI/FP8 fused tests (1e-4) for greedy, sampled and beam generate and across crop and reset, at the
same bytes (the planner's)."""

import pytest
import torch

import kvlab.attention
from kvlab.attention import interface
from kvlab.attention.context import current
from kvlab.attention.kivi_checks import check_fused_settings
from kvlab.caches.mixed import MixedCache
from kvlab.plan.load import load_spec
from kvlab.plan.mixed import layer_attention, plan_kv_bytes
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2, random_prompt

G = R = 32
PROMPT, NEW = 90, 12  # 32 tokens quantized after the prefill; a flush of 32 more in the 6th decode step
PLAN = {  # every kind of layer; layer 5's own key and value bits stay on the dequantize path in a fused cache
    "layers": {
        "0": {"k": "float", "v": "float"},
        "1": {"k": "fp8-e4m3", "v": "fp8-e4m3"},
        "2": {"k": "kivi-2", "v": "kivi-2"},
        "3": {"k": "kivi-4", "v": "kivi-4"},
        "4": {"k": "kivi-8", "v": "kivi-8"},
        "5": {"k": "kivi-8", "v": "kivi-4"},
    }
}
FUSED_LAYERS = {1, 2, 3, 4}


@pytest.fixture(scope="module")
def model():
    m = kvlab.attention.enable(make_tiny_qwen2(head_dim=32, max_positions=512, layers=6))
    yield m
    assert current() is None  # every forward closed its context


@pytest.fixture
def handed(monkeypatch):
    """``{layer index: hand-offs read}`` of the fused KIVI and FP8 readers during the test."""
    seen: dict[int, int] = {}
    for kind in (interface.PendingPrefix, interface.PendingFP8):
        real = kind.attend

        def spy(self, module, *args, _real=real, **kwargs):
            seen[module.layer_idx] = seen.get(module.layer_idx, 0) + 1
            return _real(self, module, *args, **kwargs)

        monkeypatch.setattr(kind, "attend", spy)
    return seen


def _cache(model, attention):
    return MixedCache(PLAN, model.config, group_size=G, residual_length=R, attention=attention)


def _generate(model, prompt, cache, seed=None, **kw):
    if seed is not None:
        torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(
            prompt,
            **{cache_kwarg(model): cache},
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            output_logits=True,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            **kw,
        )
    return out


def _bytes(model, cache, tokens, batch):
    spec = load_spec({**model.config.to_dict(), "torch_dtype": "float32"})
    return plan_kv_bytes(spec, cache.formats, tokens, batch, group_size=G, residual_length=R)


def test_layers_take_the_path_their_format_can(model):
    fused, plain = _cache(model, "fused"), _cache(model, "dequantize")
    assert fused.layer_attention == ["float", "fused", "fused", "fused", "fused", "dequantize"]
    assert plain.layer_attention == ["float"] + ["dequantize"] * 5
    assert [layer.attention for layer in fused.layers[1:]] == ["fused"] * 4 + ["dequantize"]


@pytest.mark.parametrize(
    "mode",
    [
        {"do_sample": False},
        {"do_sample": True, "top_k": 0, "temperature": 1.0},
        {"do_sample": False, "num_beams": 3, "num_return_sequences": 1},
    ],
    ids=["greedy", "sampled", "beam"],
)
def test_fused_generate_equals_the_dequantize_path(model, handed, mode):
    prompt = random_prompt(2, PROMPT, seed=3)
    plain = _cache(model, "dequantize")
    ref = _generate(model, prompt, plain, seed=7, **mode)
    assert handed == {}  # the dequantize path hands nothing off
    fused = _cache(model, "fused")
    got = _generate(model, prompt, fused, seed=7, **mode)
    assert set(handed) == FUSED_LAYERS  # float and own-bits KIVI layers read by SDPA, the others fused
    assert all(n >= NEW - 1 for n in handed.values())  # every decode step (the prefill hands nothing off)
    assert torch.equal(got.sequences, ref.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(ref.logits), rtol=1e-4, atol=1e-4)
    rows = got.sequences.shape[0] * mode.get("num_beams", 1)
    tokens = PROMPT + NEW - 1  # the last token is sampled, never written
    assert fused.nbytes() == plain.nbytes() == _bytes(model, fused, tokens, rows)
    assert fused.nbytes_layers() == plain.nbytes_layers()
    if "num_beams" in mode:
        torch.testing.assert_close(got.sequences_scores, ref.sequences_scores, rtol=1e-4, atol=1e-4)


def _steps(model, cache, ids, start):
    """Logits ``[steps, B, vocab]`` of feeding ``ids[:, start:]`` one token at a time into ``cache``."""
    out = []
    with torch.no_grad():
        for i in range(start, ids.shape[1]):
            out.append(
                model(input_ids=ids[:, i : i + 1], use_cache=True, **{cache_kwarg(model): cache}).logits[
                    :, -1
                ]
            )
    return torch.stack(out)


def _run(model, cache, ids):
    """Prefill 90 tokens, 8 decode steps, crop inside the residual window then into the quantized prefix, 4 more
    steps: every step's logits and the bytes after each stage."""
    kw = cache_kwarg(model)
    with torch.no_grad():
        first = model(input_ids=ids[:, :PROMPT], use_cache=True, **{kw: cache}).logits[:, -1:]
    a = _steps(model, cache, ids[:, : PROMPT + 8], PROMPT)  # a flush at the 6th step: 64 tokens quantized
    nbytes = [cache.nbytes()]
    cache.crop(-5)  # 93 kept >= 64 quantized: the residual window shortened
    nbytes.append(cache.nbytes())
    cache.crop(50)  # a positive n keeps the first 50: into the quantized prefix
    assert cache.get_seq_length() == 50
    nbytes.append(cache.nbytes())
    b = _steps(model, cache, torch.cat((ids[:, :50], ids[:, PROMPT + 8 :]), dim=1), 50)
    nbytes.append(cache.nbytes())
    return torch.cat((first.transpose(0, 1), a, b)), nbytes


def test_fused_crop_and_reset_equal_the_dequantize_path(model, handed):
    ids = random_prompt(2, PROMPT + 12, seed=4)
    ref, ref_bytes = _run(model, _cache(model, "dequantize"), ids)
    fused = _cache(model, "fused")
    got, got_bytes = _run(model, fused, ids)
    assert set(handed) == FUSED_LAYERS
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert got_bytes == ref_bytes
    assert got_bytes[0] == _bytes(model, fused, PROMPT + 8, 2)  # before the crops: the planner's bytes
    fused.reset()
    assert fused.get_seq_length() == 0 and fused.nbytes() == 0
    again, _ = _run(model, fused, ids)  # a reset cache runs the next sequence as a fresh one
    torch.testing.assert_close(again, got, rtol=0, atol=0)


def test_a_fused_cache_without_kvlab_attention_raises_before_a_wrong_step():
    one = make_tiny_qwen2(head_dim=32, max_positions=512, layers=6)  # SDPA: no forward context
    with pytest.raises(RuntimeError, match=r"kvlab\.attention\.enable\(model\)"):
        _generate(one, random_prompt(1, 40), _cache(one, "fused"))
    assert current() is None


def test_a_bad_attention_path_is_named(model):
    with pytest.raises(
        ValueError, match=r"`attention` must be one of \['dequantize', 'fused'\], got 'flash'"
    ):
        MixedCache(PLAN, model.config, attention="flash")


@pytest.mark.parametrize("group_size", [1, 2, 3, 4, 8, 12, 16, 32])
def test_the_fused_layers_are_those_the_fused_reader_accepts(group_size):
    """:func:`kvlab.plan.mixed.layer_attention` (torch-free) puts a KIVI layer on the fused path exactly when fused
    KIVI attention's own check accepts its settings; FP8 always, float never."""
    for kb in (2, 4, 8):
        for vb in (2, 4, 8):
            try:
                check_fused_settings(kb, group_size, value_bits=vb)
                want = "fused"
            except ValueError:
                want = "dequantize"
            assert layer_attention(f"kivi-{kb}", f"kivi-{vb}", "fused", group_size) == want, (kb, vb)
            assert layer_attention(f"kivi-{kb}", f"kivi-{vb}", "dequantize", group_size) == "dequantize"
    assert layer_attention("fp8-e4m3", "fp8-e4m3", "fused", group_size) == "fused"
    assert layer_attention("float", "float", "fused", group_size) == "float"


def test_a_fused_cache_filled_from_a_float_prefill_decodes_as_its_own_prefill(model, handed):
    """``kvlab eval`` shares the baseline's float prefill (:func:`kvlab.eval.longctx.scoring.fill_cache`: one
    ``update`` per layer outside a forward, nothing handed off): the fused cache then decodes with the logits and
    bytes of one that ran its own prefill, and within 1e-4 of the dequantize path filled the same way."""
    from transformers import DynamicCache

    from kvlab.eval.longctx.scoring import fill_cache

    ids, kw = random_prompt(2, PROMPT + 8, seed=5), cache_kwarg(model)
    with torch.inference_mode():  # as the eval runs it
        source = DynamicCache()
        model(input_ids=ids[:, :PROMPT], use_cache=True, **{kw: source})
        states = [(layer.keys, layer.values) for layer in source.layers]
        filled = fill_cache(_cache(model, "fused"), states)
        own = _cache(model, "fused")
        model(input_ids=ids[:, :PROMPT], use_cache=True, **{kw: own})
        got = _steps(model, filled, ids, PROMPT)
        assert torch.equal(got, _steps(model, own, ids, PROMPT)) and filled.nbytes() == own.nbytes()
        plain = fill_cache(_cache(model, "dequantize"), states)
        torch.testing.assert_close(got, _steps(model, plain, ids, PROMPT), rtol=1e-4, atol=1e-4)
    assert set(handed) == FUSED_LAYERS


def test_a_fused_mixed_cache_without_kvlab_attention_names_itself():
    """On a model without kvlab attention (never enabled: no forward context; enabled, then switched back to SDPA:
    the hand-off left unread) the decode step's error names MixedCache, not the KIVI or FP8 cache whose layer kind
    it holds."""
    plain = make_tiny_qwen2(head_dim=32, max_positions=512, layers=6)
    plain.set_attn_implementation("sdpa")
    prompt = random_prompt(1, PROMPT, seed=3)
    with pytest.raises(RuntimeError) as info:
        _generate(plain, prompt, _cache(plain, "fused"))
    message = str(info.value)
    assert message.startswith("MixedCache(attention='fused') needs kvlab attention on the model")
    assert "has no forward" in message and "KIVICache" not in message and "FP8Cache" not in message
    kvlab.attention.enable(plain)
    plain.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match=r"^MixedCache\(attention='fused'\) needs kvlab .*was never read"):
        _generate(plain, prompt, _cache(plain, "fused"))
    assert current() is None
