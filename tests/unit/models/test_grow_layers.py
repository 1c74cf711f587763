"""Block expansion in scripts/train_reference.py: a grown model computes exactly what the old one did, and the new
layers can learn (LLaMA Pro, arXiv:2401.02415 section 2)."""

import pytest
import torch

from kvlab.runtime.hf_api import cache_kwarg
from tests.conftest import make_tiny_qwen2

transformers = pytest.importorskip("transformers")


def tiny(layers: int = 4):
    return make_tiny_qwen2(head_dim=32, max_positions=64, layers=layers)


IDS = torch.randint(1, 256, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("n_new,copied", [(1, [3]), (2, [1, 3]), (3, [0, 2, 3]), (4, [0, 1, 2, 3])])
def test_grown_model_computes_exactly_what_the_old_one_did(tr, n_new, copied):
    model = tiny()
    with torch.no_grad():
        before = model(input_ids=IDS).logits
    assert tr.expand_layers(model, n_new) == copied
    assert model.config.num_hidden_layers == 4 + n_new == len(model.model.layers)
    assert len(model.config.layer_types) == 4 + n_new
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(4 + n_new))
    with torch.no_grad():
        after = model(input_ids=IDS).logits
        # cached decoding uses the new layer count (one cache slot per layer)
        cache = transformers.DynamicCache()
        kw = {cache_kwarg(model): cache}
        model(input_ids=IDS[:, :-1], use_cache=True, **kw)
        step = model(input_ids=IDS[:, -1:], use_cache=True, **kw).logits
    assert torch.equal(before, after)
    assert len(cache.layers) == 4 + n_new
    torch.testing.assert_close(step[:, -1], after[:, -1], rtol=1e-5, atol=1e-5)


def test_new_layers_start_as_zero_blocks_and_receive_gradient(tr):
    model = tiny(2)
    tr.expand_layers(model, 1)
    new = model.model.layers[2]
    assert not new.self_attn.o_proj.weight.any() and not new.mlp.down_proj.weight.any()
    assert new.self_attn.q_proj.weight.equal(model.model.layers[1].self_attn.q_proj.weight)
    assert new.self_attn.q_proj.weight.data_ptr() != model.model.layers[1].self_attn.q_proj.weight.data_ptr()
    model.train()
    model(input_ids=IDS, labels=IDS).loss.backward()
    assert new.self_attn.o_proj.weight.grad.abs().sum() > 0
    assert new.mlp.down_proj.weight.grad.abs().sum() > 0


def test_grown_model_saves_and_reloads(tr, tmp_path):
    model = tiny(2)
    tr.expand_layers(model, 2)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.add_(0.01)  # a trained new layer: not zero any more
        logits = model(input_ids=IDS).logits
    model.save_pretrained(tmp_path)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert again.config.num_hidden_layers == 4
    with torch.no_grad():
        assert torch.equal(again(input_ids=IDS).logits, logits)


@pytest.mark.parametrize("n_new", [0, -1, 5])
def test_bad_layer_counts_are_refused_by_value(tr, n_new):
    with pytest.raises(ValueError, match=rf"got {n_new}"):
        tr.expand_layers(tiny(), n_new)


def test_grow_layers_flag_needs_init_from(tr):
    with pytest.raises(SystemExit):
        tr.parse_args(["--grow-layers", "2"])
