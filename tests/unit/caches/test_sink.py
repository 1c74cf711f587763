"""SinkCache (StreamingLLM): equal to DynamicCache while nothing is evicted, StreamingLLM's positions inside the
cache after eviction (checked against an independent re-rotation of every kept key), flat bytes, bad settings."""

import pytest
import torch
from transformers import DynamicCache, Qwen2Config

from kvlab.caches.sink import SinkCache
from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

NEW_TOKENS = 12


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def model():
    return make_tiny_qwen2(head_dim=32, max_positions=512)


def _prompt(batch, tokens, seed=0):
    return torch.randint(1, 256, (batch, tokens), generator=torch.Generator().manual_seed(seed))


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
    return out.sequences, torch.stack(out.logits, dim=1)  # [B, T], [B, new, vocab]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize(("sinks", "window"), [(4, 60), (0, 60), (4, 200)])
def test_window_covering_the_sequence_equals_dynamic_cache(model, batch, sinks, window):
    prompt = _prompt(batch, 48)
    tokens, logits = _generate(model, prompt, SinkCache(sinks, window, config=model.config))
    ref_tokens, ref_logits = _generate(model, prompt, DynamicCache())
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(logits, ref_logits)


def _rotate(keys, offset, head_dim, theta):
    """Independent RoPE shift (float64): keys rotated at p -> rotated at p + offset, offset [tokens]."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = offset.double()[:, None] * inv_freq  # [tokens, D/2]
    cos, sin = torch.cat((angle.cos(), angle.cos()), -1), torch.cat((angle.sin(), angle.sin()), -1)
    k = keys.double()
    rotated = torch.cat((-k[..., head_dim // 2 :], k[..., : head_dim // 2]), -1)
    return (k * cos + rotated * sin).to(keys.dtype)


def _streaming_reference(model, prompt, steps, sinks, window):
    """StreamingLLM by its definition: before every step, each kept key is re-rotated from the position it was
    computed at to its index inside the cache, and the new token gets position = tokens held."""
    cfg = model.config
    full = DynamicCache()
    out = model(prompt, **{cache_kwarg(model): full}, use_cache=True)
    layers = [[layer.keys, layer.values] for layer in full.layers]  # keys rotated at their positions
    pos = torch.arange(prompt.shape[1])  # position each kept key was rotated at
    logits, token = [out.logits[:, -1]], out.logits[:, -1].argmax(-1, keepdim=True)

    def evict(layers, pos):
        keep = torch.cat(
            (torch.arange(min(sinks, len(pos))), torch.arange(max(sinks, len(pos) - window), len(pos)))
        )
        return [[k[..., keep, :], v[..., keep, :]] for k, v in layers], pos[keep]

    layers, pos = evict(layers, pos)
    for _ in range(steps):
        held = len(pos)
        cache = DynamicCache()
        for i, (k, v) in enumerate(layers):
            cache.update(
                _rotate(k, torch.arange(held) - pos, cfg.head_dim, cfg.rope_parameters["rope_theta"]), v, i
            )
        out = model(
            token,
            **{cache_kwarg(model): cache},
            position_ids=torch.tensor([[held]]).expand(token.shape[0], 1),
            use_cache=True,
        )
        layers = [[layer.keys, layer.values] for layer in cache.layers]
        pos = torch.arange(held + 1)
        layers, pos = evict(layers, pos)
        logits.append(out.logits[:, -1])
        token = out.logits[:, -1].argmax(-1, keepdim=True)
    return torch.stack(logits, 1)


@pytest.mark.parametrize(("sinks", "window"), [(2, 8), (4, 5), (0, 8)])
def test_positions_inside_the_cache_after_eviction(model, sinks, window):
    """A 14-token prefill (already over the cache) and 30 decode steps: logits equal the definition's, and differ
    from an uncapped DynamicCache (the eviction changed what the model reads)."""
    prompt = _prompt(2, 14, seed=1)
    ref = _streaming_reference(model, prompt, 30, sinks, window)
    cache = SinkCache(sinks, window, config=model.config)
    out = model(prompt, **{cache_kwarg(model): cache}, use_cache=True)
    logits, token = [out.logits[:, -1]], out.logits[:, -1].argmax(-1, keepdim=True)
    for _ in range(30):
        out = model(token, **{cache_kwarg(model): cache}, use_cache=True)
        logits.append(out.logits[:, -1])
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        assert cache.held_tokens() == sinks + window
    logits = torch.stack(logits, 1)
    scale = float(ref.abs().max())
    assert float((logits - ref).abs().max()) <= 1e-4 * scale
    assert cache.evicted_tokens() == 14 + 30 - sinks - window
    assert cache.get_seq_length() == 14 + 30


def test_bytes_stay_flat_once_the_window_fills(model):
    from kvlab.caches.measure import cache_nbytes

    cache = SinkCache(4, 16, config=model.config)
    per_token = 2 * 2 * 2 * 32 * 4  # layers * (K, V) * kv_heads * head_dim * fp32 bytes
    nbytes, storage = [], []
    token = _prompt(1, 1)
    for _ in range(40):
        model(token, **{cache_kwarg(model): cache}, use_cache=True)
        nbytes.append(cache.nbytes())
        storage.append(
            sum(
                t.untyped_storage().nbytes()
                for layer in cache.layers
                for t in (layer.sink_keys, layer.sink_values, layer.keys, layer.values)
            )
        )
    assert nbytes[:20] == [per_token * (i + 1) for i in range(20)]
    assert set(nbytes[19:]) == {per_token * 20} and set(storage[19:]) == {per_token * 20}
    assert cache_nbytes(cache) == per_token * 20


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_sink_tokens": -1}, "`num_sink_tokens` must be an int >= 0, got -1"),
        ({"window_length": 0}, "`window_length` must be an int >= 1, got 0"),
        ({"window_length": 2.5}, "`window_length` must be an int >= 1, got 2.5"),
        ({"num_sink_tokens": True}, "`num_sink_tokens` must be an int >= 0, got True"),
    ],
)
def test_bad_settings_are_named(model, kwargs, match):
    with pytest.raises(ValueError, match=match):
        SinkCache(**{"num_sink_tokens": 4, "window_length": 8, "config": model.config, **kwargs})


def test_models_the_cache_cannot_handle_are_refused():
    base = dict(
        vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1
    )
    sliding = Qwen2Config(**base, use_sliding_window=True, sliding_window=16, max_window_layers=0)
    with pytest.raises(
        ValueError, match=r"full-attention layers only; the model has \['sliding_attention'\]"
    ):
        SinkCache(4, 8, config=sliding)
    dynamic = Qwen2Config(**base, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    with pytest.raises(ValueError, match="RoPE type 'dynamic' is not handled"):
        SinkCache(4, 8, config=dynamic)
    with pytest.raises(ValueError, match="needs the model config"):
        SinkCache(4, 8)
    SinkCache(0, 8)  # no sinks: nothing to re-rotate, no config needed


def test_crop_only_before_eviction(model):
    cache = SinkCache(2, 8, config=model.config)
    model(_prompt(1, 6), **{cache_kwarg(model): cache}, use_cache=True)
    cache.crop(-2)
    assert cache.get_seq_length() == 4 and cache.held_tokens() == 4
    model(_prompt(1, 10), **{cache_kwarg(model): cache}, use_cache=True)
    cache.crop(0)
    with pytest.raises(ValueError, match="after evicting 4"):
        cache.crop(-1)


def test_registry_names_build_the_cache_with_their_settings(model):
    from kvlab.caches.registry import resolve

    r = resolve("sink:sink_tokens=2:window_length=16")
    assert r.describe() == {"name": "sink:sink_tokens=2:window_length=16", "family": "sink"} | {
        "sink_tokens": 2,
        "window_length": 16,
    }
    cache = r.make(model.config)
    assert (cache.num_sink_tokens, cache.window_length) == (2, 16) and r.entry.evicts and not r.exact
    with pytest.raises(ValueError, match="`window_length` must be an int >= 1, got 0"):
        resolve("sink:window_length=0")
    with pytest.raises(ValueError, match="settings are .*got \\['group_size'\\]"):
        resolve("sink:group_size=4")


def test_live_tensor_bytes_stay_flat_once_the_window_fills(model):
    """The issue's CPU measure: live tensor bytes after each step (``TensorBytesTracker``) stop growing."""
    from kvlab.runtime.tensor_bytes import TensorBytesTracker

    def live_bytes(cache):
        token, live = _prompt(1, 1), []
        with TensorBytesTracker() as tracker:
            for _ in range(40):
                out = model(token, **{cache_kwarg(model): cache}, use_cache=True)
                del out
                live.append(tracker.current_bytes)
        return live

    live = live_bytes(SinkCache(4, 16, config=model.config))
    assert live[25:] == [live[25]] * 15  # flat once 4 + 16 tokens are held
    assert live[19] > live[5]  # and it did grow while the window filled
    dynamic = live_bytes(DynamicCache())
    assert dynamic[39] - dynamic[25] == 14 * 2 * 2 * 2 * 32 * 4  # the same measure sees a growing cache grow
