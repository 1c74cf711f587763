"""The reference model's abilities, measured with kvlab eval's own long-context probes (:mod:`kvlab.eval.longctx`):
the model card's copy and passkey tables, the training log's small monitor, and a packaged model's card measured
again with its weights untouched."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

from .card import finish_package
from .data import sha256_file

ABILITY_COPY_CONTEXTS = (512, 2048, 4352)
ABILITY_COPY_FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.92)  # at 4352 tokens the far distance is 4004
ABILITY_PASSKEY_CONTEXTS = (512, 2048, 4096)
ABILITY_PARTS = ("copy", "passkey")  # the probes of measure_abilities, in its order
ABILITY_PROTECTED_TAIL = 160  # what kvlab eval keeps probes out of by default: R = 128 plus G = 32


def _copy_rows(model, ids: list[int], ctx: int, copy_rows: int) -> list[dict]:
    """The card's copy rows at context ``ctx``: one per distance of :data:`ABILITY_COPY_FRACTIONS`."""
    from transformers import DynamicCache

    from kvlab.eval.longctx import build_recall_probe, measure_long_context

    probe = build_recall_probe(
        ids,
        ctx,
        protected_tail=ABILITY_PROTECTED_TAIL,
        rows_per_distance=copy_rows,
        fractions=ABILITY_COPY_FRACTIONS,
        seed=f"model-card-copy-{ctx}",
    )
    rec = measure_long_context(model, DynamicCache, {"recall": probe})["recall"]
    rows = [
        {
            "context": ctx,
            "distance": d["distance_tokens"],
            "accuracy": round(d["accuracy"], 4),
            "nll": round(d["mean_nll"], 4),
            "trials": d["rows"],
            "scored_tokens": d["scored_tokens"],
        }
        for d in rec["distances"]
    ]
    print(f"abilities: copy at {ctx}: {[(c['distance'], c['accuracy']) for c in rows]}", flush=True)
    return rows


def _passkey_rows(model, tokenizer, ids: list[int], ctx: int, trials: int) -> list[dict]:
    """The card's passkey rows at context ``ctx``: one per depth of kvlab eval's passkey probe."""
    from transformers import DynamicCache

    from kvlab.eval.longctx import build_passkey_probe, measure_long_context

    probe = build_passkey_probe(
        tokenizer,
        ids,
        ctx,
        protected_tail=ABILITY_PROTECTED_TAIL,
        trials=trials,
        seed=f"model-card-passkey-{ctx}",
    )
    pk = measure_long_context(model, DynamicCache, {"passkey": probe})["passkey"]
    rows = [
        {
            "context": ctx,
            "depth": d["depth"],
            "accuracy": d["accuracy"],
            "correct": d["correct"],
            "trials": d["trials"],
            "ci95": [round(x, 4) for x in d["ci95"]],
        }
        for d in pk["depths"]
    ]
    print(f"abilities: passkey at {ctx}: {[(p['depth'], p['accuracy']) for p in rows]}", flush=True)
    return rows


def measure_abilities(
    model,
    tokenizer,
    heldout_text: str,
    passkey_trials: int = 20,
    copy_rows: int = 24,
    parts: tuple[str, ...] = ABILITY_PARTS,
) -> dict:
    """Copy and passkey abilities of ``model`` through a float ``DynamicCache``, with kvlab eval's own probes.

    The probes are :mod:`kvlab.eval.longctx`'s (the same code and templates ``kvlab eval`` measures caches
    with), on the held-out text; placement keeps what is probed out of the newest 160 tokens, as the eval does.
    ``parts`` (a subset of :data:`ABILITY_PARTS`) names the probes run; a probe left out gets an empty list.
    Returns the ``abilities`` block of provenance (read by the model card).
    """
    from kvlab.eval.longctx import RECALL_SPAN_TOKENS, encode_heldout

    ids = encode_heldout(tokenizer, heldout_text)
    copy = [
        r for ctx in ABILITY_COPY_CONTEXTS if "copy" in parts for r in _copy_rows(model, ids, ctx, copy_rows)
    ]
    passkey = [
        r
        for ctx in ABILITY_PASSKEY_CONTEXTS
        if "passkey" in parts
        for r in _passkey_rows(model, tokenizer, ids, ctx, passkey_trials)
    ]
    return {
        "method": "kvlab.eval.longctx (recall and passkey probes, decoded through the cache)",
        "cache": "DynamicCache",
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "protected_tail": ABILITY_PROTECTED_TAIL,
        "copy_span_tokens": RECALL_SPAN_TOKENS,
        "passkey_trials": passkey_trials,
        "copy_rows": copy_rows,
        "copy": copy,
        "passkey": passkey,
    }


def monitor_abilities(model, tokenizer, heldout_ids: list[int], context: int, seed: int | str) -> dict:
    """Log-only: greedy copy accuracy at kvlab eval's recall distances (4 rows each) and passkey accuracy at depth
    50 % (8 trials) for prompts of ``context`` tokens, with the same :mod:`kvlab.eval.longctx` probes as
    :func:`measure_abilities` (a smaller sample), through a float ``DynamicCache``.

    Returns:
        ``{"copy_<distance>": accuracy, ..., "passkey_mid": accuracy}``.
    """
    from transformers import DynamicCache

    from kvlab.eval.longctx import build_passkey_probe, build_recall_probe, measure_long_context

    tail = ABILITY_PROTECTED_TAIL
    probes = {
        "recall": build_recall_probe(
            heldout_ids, context, protected_tail=tail, rows_per_distance=4, seed=f"monitor-copy-{seed}"
        ),
        "passkey": build_passkey_probe(
            tokenizer,
            heldout_ids,
            context,
            protected_tail=tail,
            trials=8,
            depths=(0.5,),
            seed=f"monitor-pk-{seed}",
        ),
    }
    model.eval()
    got = measure_long_context(model, DynamicCache, probes)
    out = {f"copy_{d['distance_tokens']}": round(d["accuracy"], 3) for d in got["recall"]["distances"]}
    out["passkey_mid"] = got["passkey"]["depths"][0]["accuracy"]
    return out


def remeasure_abilities(model_dir: Path, copy_rows: int, parts: tuple[str, ...], argv: list[str]) -> dict:
    """Measure the abilities of the packaged model in ``model_dir`` again and rewrite its provenance and card.

    The weights are not touched: they must be the ones provenance names (``package.weights_sha256``). The probes
    in ``parts`` are run (:func:`measure_abilities`, bf16 weights, on the package's own ``heldout.txt``) and
    replace their figures; the others keep theirs. The replaced block is kept under
    ``evaluation.abilities_history`` with when and by which command it was replaced, so no figure is lost. The
    package is rewritten in a sibling folder and swapped in (:func:`finish_package`).

    Returns:
        The new ``abilities`` block.

    Raises:
        ValueError: the weights differ from those provenance names, or provenance has no abilities to keep for
            a probe not re-measured.
    """
    prov = json.loads((model_dir / "provenance.json").read_text(encoding="utf-8"))
    digest = sha256_file(model_dir / "model.safetensors")
    if digest != prov["package"]["weights_sha256"]:
        raise ValueError(
            f"{model_dir}/model.safetensors has sha256 {digest}, provenance names {prov['package']['weights_sha256']}"
        )
    old = prov["evaluation"].get("abilities")
    kept = [part for part in ABILITY_PARTS if part not in parts]
    if kept and not (old and all(old.get(part) for part in kept)):
        raise ValueError(f"provenance holds no {' / '.join(kept)} figures to keep: re-measure all parts")
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    heldout_text = (model_dir / "heldout.txt").read_text(encoding="utf-8")
    t0 = time.perf_counter()
    new = measure_abilities(model, tokenizer, heldout_text, copy_rows=copy_rows, parts=parts)
    for part in kept:
        new[part] = old[part]
        for key in ("copy_rows",) if part == "copy" else ("passkey_trials",):
            if key in old:
                new[key] = old[key]
            else:
                new.pop(key, None)
    new["remeasured"] = {
        "parts": list(parts),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.perf_counter() - t0, 1),
        "command": " ".join([Path(sys.argv[0]).name, *argv]),
        "environment": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    if old is not None:
        replaced = {
            k: v for k, v in old.items() if k in ("copy_rows", "passkey_trials", "remeasured", *parts)
        }
        prov["evaluation"].setdefault("abilities_history", []).append(
            {"replaced_utc": new["remeasured"]["utc"], **replaced}
        )
    prov["evaluation"]["abilities"] = new
    tmp = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}-", dir=model_dir.parent))
    try:
        for f in model_dir.iterdir():
            if f.is_file() and f.name not in ("provenance.json", "MODEL_CARD.md"):
                shutil.copy2(f, tmp / f.name)
        finish_package(tmp, prov, model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return new
