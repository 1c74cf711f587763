"""The model card and the package: ``MODEL_CARD.md`` written from ``provenance.json`` (every number read from it),
and the package folder written whole in a sibling folder, then moved into place."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path


def _stage_line(i: int, t: dict) -> str:
    """One training stage of the card: phases, tokens, time, threads, command."""
    if "phases" in t:
        shape = ", then ".join(f"{ph['steps']} of {ph['batch_size']} x {ph['seq_len']}" for ph in t["phases"])
    else:  # a stage written before curricula existed: a main and a long phase
        mp, lp = t["main_phase"], t["long_phase"]
        shape = (
            f"{mp['steps']} of {mp['batch_size']} x {mp['seq_len']}, then {lp['steps']} of "
            f"{lp['batch_size']} x {lp['seq_len']}"
        )
    if t.get("task_fraction"):
        counts = t.get("task_counts")
        what = f" ({counts['copy']:,} copy spans, {counts['passkey']:,} passkeys)" if counts else ""
        tasks = (
            f"; {t['task_fraction']:.0%} of windows carry long-range tasks{what}, answer tokens weighted "
            f"{t.get('task_weight', 1.0):g}x, {t.get('random_span_p', 0.5):.0%} of copy spans random tokens"
        )
    else:
        tasks = "; documentation text only"
    note = f" ({t['note']})" if t.get("note") else ""
    start = "from scratch" if i == 1 else f"continued from stage {i - 1}"
    device = t.get("device", "cpu")
    where = f"{t['threads']} CPU thread(s)" if device == "cpu" else f"on {device}"
    grown = t.get("grown")
    if grown:
        start += (
            f", grown from {grown['layers_before']} to {grown['layers_after']} layers (copies of layers "
            f"{', '.join(map(str, grown['copied_layers']))} with zeroed output projections: block expansion)"
        )
    return (
        f"{i}. {start}: {t['steps_done']} steps ({shape} tokens), {t['tokens_seen']:,} tokens{tasks}; peak lr "
        f"{t['lr']:g}, seed {t['seed']}; {where}, {t['train_wall_s'] / 60:.1f} minutes"
        f"{' (wall-clock bound)' if t['time_bound'] else ''}{note}; `python scripts/{t.get('command', '?')}`"
    )


def _ability_tables(ab: dict) -> str:
    """Markdown tables of the copy and passkey abilities recorded in provenance."""
    copy_rows = "\n".join(
        f"| {r['context']} | {r['distance']} | {r['accuracy']:.3f} | {r['nll']:.3f} | {r['trials']} |"
        for r in ab["copy"]
    )
    contexts = sorted({r["context"] for r in ab["passkey"]})
    depths = sorted({r["depth"] for r in ab["passkey"]})
    cell = {(r["context"], r["depth"]): r for r in ab["passkey"]}
    head = "| context | " + " | ".join(f"depth {d:.0%}" for d in depths) + " |"
    rule = "|---:|" + "---:|" * len(depths)
    pk_rows = "\n".join(
        f"| {c} | "
        + " | ".join(
            f"{cell[c, d]['accuracy']:.2f} [{cell[c, d]['ci95'][0]:.2f}, {cell[c, d]['ci95'][1]:.2f}]"
            for d in depths
        )
        + " |"
        for c in contexts
    )
    again = ab.get("remeasured")
    remeasured = (
        f"\n{' and '.join(again['parts']).capitalize()} figures measured again on {again['utc'][:10]} with the "
        f"weights unchanged (`{again['command']}`); the figures they replaced are kept in `provenance.json` "
        f"(`evaluation.abilities_history`).\n"
        if again
        else ""
    )
    return f"""Measured with `{ab["method"]}` ({ab["cache"]}, {ab["dtype"]} weights), on held-out text.
{remeasured}
Copy (induction): a {ab["copy_span_tokens"]}-token held-out span written once at `distance` tokens before the
end of the prompt and repeated as the continuation, decoded through the cache; accuracy of the greedy (argmax)
token on span tokens 2..{ab["copy_span_tokens"]}, and their mean NLL.

| context | distance | accuracy | NLL (nats) | trials |
|---:|---:|---:|---:|---:|
{copy_rows}

Passkey retrieval: a 5-digit key stated once at a depth of the context, asked for after it; a trial counts when
every answer token is the argmax. Accuracy with its 95 % Wilson interval, {ab["passkey_trials"]} trials a point.

{head}
{rule}
{pk_rows}
"""


def write_model_card(prov: dict) -> str:
    """MODEL_CARD.md text; every number is read from ``prov`` (the provenance written next to it)."""
    c, m, t, e, tok = prov["corpus"], prov["model"], prov["training"], prov["evaluation"], prov["tokenizer"]
    long = e["long_context"]
    stages = [*prov.get("previous_stages", []), t]
    total_min = sum(st["train_wall_s"] for st in stages) / 60
    total_tokens = sum(st["tokens_seen"] for st in stages)
    stage_lines = "\n".join(_stage_line(i + 1, st) for i, st in enumerate(stages))
    mixture = "\n".join(
        f"- {mx['component']}: {mx['source']} License: {mx['license']}" for mx in prov.get("data_mixture", [])
    )
    pos_rows = "\n".join(
        f"| {b['positions']} | {b['nll']:.3f} | {b['ppl']:.1f} |" for b in long["nll_by_position"]
    )
    abilities = _ability_tables(e["abilities"]) if e.get("abilities") else "Not measured for this model."
    return f"""# kvlab reference model

A small Qwen2-architecture decoder trained by `scripts/train_reference.py`, shipped inside kvlab so that KV-cache
experiments (`kvlab eval`, the tests) run on a real, trained model without any download. It is loaded like any
Hugging Face model: `AutoModelForCausalLM.from_pretrained(kvlab.models.reference_model_path())`. It is trained to
read its context (in-context copying and passkey retrieval at distances up to its window; how well, by distance
and depth, is under Abilities), so that what a cache does to distant tokens shows in the eval's quality columns.

**Intended use:** a test and reference model for KV-cache measurements (cache bytes, quantization error, NLL,
top-k, copy and retrieval changes, latency). **Not** a useful language model: it is tiny, trained for
{total_min:.0f} minutes on a CPU, on {total_tokens:,} tokens of one documentation set and synthetic tasks. Do not
use it to generate text for anyone.

## Architecture
| | |
|---|---|
| architecture | `{m["architecture"]}` (`model_type` `{m["model_type"]}`) |
| parameters | {m["parameters"]:,} (tied input/output embeddings) |
| layers / hidden / intermediate | {m["num_hidden_layers"]} / {m["hidden_size"]} / {m["intermediate_size"]} |
| attention | GQA: {m["num_attention_heads"]} query heads, {m["num_key_value_heads"]} KV heads, head_dim {m["head_dim"]} |
| positions | RoPE (theta {m["rope_theta"]:g}), `max_position_embeddings` {m["max_position_embeddings"]}; trained up to position {t["max_position_trained"]} |
| weights | {m["weights_dtype"]} safetensors, {prov["package"]["directory_bytes"] / 1e6:.1f} MB for this whole directory |
| tokenizer | byte-level BPE (`tokenizers`), vocabulary {tok["vocab_size"]}, `{tok["eos_token"]}` = eos = bos = pad |

## Data
- Source: the reST sources (`html/_sources/**/*.rst.txt`) of Debian's `{c["package"]}` package, version
  `{c["version"]}` (sha256 of the .deb: `{c["deb_sha256"]}`): {c["files_total"]} files, {c["bytes_total"]:,} bytes.
- License: {c["license"]}. See `{c["license_file"]}` in the package.
- Split by file: a file is held out when sha256 of its relative path, as a fraction of 2**64, is below
  {c["heldout_fraction"]}. {c["files_heldout"]} held-out files ({c["heldout_tokens"]:,} tokens), never seen by
  the tokenizer or the model; {c["files_train"]} training files ({c["train_tokens"]:,} tokens). The held-out text
  ships as `heldout.txt` for prompts.

Mixture of the last stage:
{mixture}

## Training
AdamW (betas 0.9/0.95, weight decay {t["weight_decay"]}), linear warm-up and cosine decay, bf16 autocast on the
CPU; torch {prov["environment"]["torch"]}, transformers {prov["environment"]["transformers"]}. Stages:

{stage_lines}

## Evaluation (held-out files, the saved {m["weights_dtype"]} weights)
| measure | held-out perplexity |
|---|---|
| this model, windows of {e["seq_len"]} tokens | **{e["heldout_ppl"]:.2f}** |
| add-one unigram (estimated on the training tokens), same {e["target_tokens"]:,} target tokens | {e["unigram_ppl"]:.2f} |

The unigram perplexity is {e["unigram_ppl"] / e["heldout_ppl"]:.1f}x the model's.
By position, windows of {long["seq_len"]} tokens ({long["windows"]} windows):

| positions | mean NLL (nats) | perplexity |
|---|---|---|
{pos_rows}

## Abilities
{abilities}
All numbers above are copied by the training script from `provenance.json`.
"""


def previous_stages(prior: dict | None) -> list[dict]:
    """The training stages of the model a run continued from (its own earlier stages first), curves dropped."""
    if prior is None:
        return []
    last = {k: v for k, v in prior["training"].items() if k not in ("loss_curve", "heldout_monitor_curve")}
    last.setdefault("command", prior.get("command"))
    return [*prior.get("previous_stages", []), last]


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def finish_package(tmp: Path, provenance: dict, out: Path) -> None:
    """Write ``provenance.json`` and ``MODEL_CARD.md`` into the package folder ``tmp``, then move it to ``out``
    (replacing a model there; ``tmp`` must be a sibling of ``out`` so that the moves are renames).

    The card and provenance state the folder's size, which includes them, so both are written until the size
    settles (``provenance["package"]["directory_bytes"]`` is updated in place).

    Raises:
        RuntimeError: the size did not settle in 10 rounds.
    """
    for _ in range(10):
        write_json(tmp / "provenance.json", provenance)
        card = write_model_card(json.loads((tmp / "provenance.json").read_text(encoding="utf-8")))
        (tmp / "MODEL_CARD.md").write_text(card, encoding="utf-8")
        size = directory_bytes(tmp)
        if size == provenance["package"]["directory_bytes"]:
            break
        provenance["package"]["directory_bytes"] = size
    else:
        raise RuntimeError("directory size did not settle")  # the size's digit count oscillates: never seen
    os.chmod(tmp, 0o755)  # mkdtemp makes 0700 and safetensors writes 0600: make the package readable
    for f in tmp.iterdir():
        os.chmod(f, 0o644)
    if out.exists():
        old = out.with_name(f".{out.name}-old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old)
    else:
        os.replace(tmp, out)
