"""PagedCache on the bundled reference model: greedy generate() equals DynamicCache (batch 1 and batch 2 with left
padding). Skipped until the bundled model exists in this checkout."""

import pytest
import torch
from transformers import DynamicCache

from kvlab.caches.paged import PagedCache
from kvlab.runtime.hf_api import cache_kwarg

models = pytest.importorskip("kvlab.models")
if not hasattr(models, "load_model") or not (models.reference_model_path() / "model.safetensors").exists():
    pytest.skip("the bundled reference model is not in this checkout", allow_module_level=True)


PAD = 0  # the id under the left padding; masked out, so any id works


@pytest.fixture(scope="module")
def model_and_tokenizer():
    model, tokenizer = models.load_model(dtype="float32")
    return model.eval(), tokenizer


def greedy(model, batch, cache, n=32):
    with torch.no_grad():
        return model.generate(
            **batch,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            **{cache_kwarg(model): cache},
            pad_token_id=PAD,
        )


def prompts(tokenizer, lengths):
    text = models.heldout_text()
    ids = tokenizer(text, return_tensors="pt")["input_ids"][0]
    rows = [ids[i * 300 : i * 300 + n] for i, n in enumerate(lengths)]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):  # left padding
        input_ids[i, width - len(row) :] = row
        mask[i, width - len(row) :] = 1
    return {"input_ids": input_ids, "attention_mask": mask}


@pytest.mark.parametrize("lengths", [[97], [120, 83]], ids=["batch1", "batch2-left-padded"])
def test_paged_generate_equals_dynamic(model_and_tokenizer, lengths):
    model, tokenizer = model_and_tokenizer
    batch = prompts(tokenizer, lengths)
    ref = greedy(model, batch, DynamicCache())
    cache = PagedCache(block_size=16)
    out = greedy(model, batch, cache)
    assert torch.equal(out, ref)
    cache.check_invariants()
    assert cache.get_seq_length() == max(lengths) + 32 - 1
