"""The sensitivity sweep and the allocator: a layer made fragile on purpose (huge outlier channels in its keys) is
ranked first and gets the most bits; the sweep's round trip is what the caches read back; budgets are kept."""

import pytest
import torch

from kvlab.bench.sensitivity import ranking, roundtrip, sweep
from kvlab.caches.fp8 import FP8Cache
from kvlab.caches.kivi import KIVICache
from kvlab.plan.allocate import allocate, budget_bytes
from kvlab.plan.load import load_spec
from kvlab.plan.mixed import FORMATS, plan_kv_bytes
from tests.conftest import make_tiny_qwen2, random_prompt

G, R = 32, 0  # no residual window: at this short context every token is quantized, as at a long one
CONTEXT, NEW = 96, 8
FRAGILE = 2


@pytest.fixture(scope="module")
def fragile():
    """A tiny 4-layer Qwen2 whose layer 2 keys carry outlier channels 40x the others, which its queries read
    (x20): KVQuant's failure case, in a random model whose attention is otherwise nearly uniform."""
    model = make_tiny_qwen2(head_dim=32, max_positions=512, layers=4)
    attn = model.model.layers[FRAGILE].self_attn
    with torch.no_grad():
        attn.k_proj.weight[:4] *= 40.0  # channels 0-3 of KV head 0: [out, in] rows
        attn.k_proj.bias[:4] *= 40.0
        for head in (0, 1):  # the query heads of KV head 0 (GQA 4/2), the same channels
            attn.q_proj.weight[32 * head : 32 * head + 4] *= 20.0
            attn.q_proj.bias[32 * head : 32 * head + 4] *= 20.0
    return model


@pytest.fixture(scope="module")
def result(fragile):
    return sweep(fragile, random_prompt(2, CONTEXT + NEW), CONTEXT, group_size=G, residual_length=R, rows=6)


def _spec(model):
    return load_spec({**model.config.to_dict(), "torch_dtype": "float32"})


def test_the_fragile_layer_is_ranked_first(result):
    for fmt in ("kivi-2", "kivi-4", "fp8-e4m3"):
        assert ranking(result["kl"], fmt)[0][:2] == (FRAGILE, "k"), fmt
    kl = result["kl"]
    assert all(
        kl["kivi-2"][h][i] >= kl["kivi-8"][h][i] for h in "kv" for i in range(4)
    )  # fewer bits, more KL
    assert result["cost"]["forwards"] == 2 * -(-4 * 2 * 4 // 5)  # 2 prompts, 32 choices in rows of 5 + float


BITS = {"kivi-2": 2, "kivi-4": 4, "kivi-8": 8, "fp8-e4m3": 8, "float": 16}  # code bits per element


def test_the_allocator_gives_the_fragile_layer_the_most_bits(fragile, result):
    """A budget a little above uniform KIVI-2 (a third of the way to 4-bit keys): the bits go to the
    fragile keys first."""
    spec = _spec(fragile)
    low, high = (
        budget_bytes(spec, n, CONTEXT, group_size=G, residual_length=R) for n in ("kivi-2", "kivi-k4v2")
    )
    budget = low + (high - low) // 3  # room for one half two bits wider (each half is a quarter of it)
    out = allocate(spec, result["kl"], budget, CONTEXT, group_size=G, residual_length=R)
    fragile_k = BITS[out["layers"][str(FRAGILE)]["k"]]
    others = [BITS[e[h]] for i, e in out["layers"].items() for h in "kv" if (int(i), h) != (FRAGILE, "k")]
    assert fragile_k > max(others), out["layers"]
    formats = [(e["k"], e["v"]) for _, e in sorted(out["layers"].items(), key=lambda kv: int(kv[0]))]
    assert (
        out["plan_bytes"] == plan_kv_bytes(spec, formats, CONTEXT, group_size=G, residual_length=R) <= budget
    )
    assert out["predicted_kl"] < out["uniform"]["kivi-2"]["predicted_kl"]
    at4 = allocate(
        spec,
        result["kl"],
        budget_bytes(spec, "kivi-4", CONTEXT, group_size=G, residual_length=R),
        CONTEXT,
        group_size=G,
        residual_length=R,
    )
    assert (
        at4["predicted_kl"] <= at4["uniform"]["kivi-4"]["predicted_kl"]
    )  # uniform kivi-4 fits its own bytes


def test_a_larger_budget_never_predicts_more_damage(fragile, result):
    spec = _spec(fragile)
    last = float("inf")
    for fraction in ("0.2", "0.3", "0.5", "1"):
        budget = budget_bytes(spec, fraction, CONTEXT, group_size=G, residual_length=R)
        out = allocate(spec, result["kl"], budget, CONTEXT, group_size=G, residual_length=R)
        assert out["plan_bytes"] <= budget and out["predicted_kl"] <= last
        last = out["predicted_kl"]
    assert last == 0.0  # the whole float cache fits: every layer float


def test_a_budget_below_the_smallest_plan_is_refused_in_one_line(fragile, result):
    spec = _spec(fragile)
    smallest = budget_bytes(spec, "kivi-2", CONTEXT, group_size=G, residual_length=R)
    allocate(spec, result["kl"], smallest, CONTEXT, group_size=G, residual_length=R)  # exactly fits
    with pytest.raises(
        ValueError, match=rf"`budget` {smallest - 1:,} B is below the smallest plan: every layer "
    ):
        allocate(spec, result["kl"], smallest - 1, CONTEXT, group_size=G, residual_length=R)
    for bad, match in (("0", r"must be in \(0, 1\]"), ("kivi-3", "neither a fraction")):
        with pytest.raises(ValueError, match=match):
            budget_bytes(spec, bad, CONTEXT)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "float"])
def test_the_round_trip_is_what_the_cache_reads_back(fmt):
    """After a prefill, the next step's attention reads exactly ``roundtrip`` of the prefill's K and V."""
    torch.manual_seed(0)
    keys, values = torch.randn(2, 2, 100, 32), torch.randn(2, 2, 100, 32)
    if fmt.startswith("kivi"):
        cache = KIVICache(nbits=int(fmt[-1]), group_size=G, residual_length=R)
    else:
        cache = FP8Cache(attention="dequantize")
    cache.update(keys, values, 0)
    got_k, got_v = cache.update(torch.zeros(2, 2, 1, 32), torch.zeros(2, 2, 1, 32), 0)
    assert torch.equal(got_k[..., :100, :], roundtrip(keys, fmt, "k", G, R))
    assert torch.equal(got_v[..., :100, :], roundtrip(values, fmt, "v", G, R))


def test_allocate_writes_a_plan_the_mixed_cache_runs(fragile, result, tmp_path, capsys):
    """``kvlab sensitivity allocate`` on a sweep file: a plan file named for ``mixed-<name>``, which MixedCache
    builds for the model; a budget below the smallest plan is one error line, status 2."""
    import json

    from kvlab.caches.mixed import MixedCache
    from kvlab.cli import main
    from kvlab.commands.sensitivity import SWEEP_KIND

    sweep_file = tmp_path / "sweep.json"
    config = {**fragile.config.to_dict(), "torch_dtype": "float32"}
    sweep_file.write_text(
        json.dumps(
            {"kind": SWEEP_KIND, "model_config": config, "group_size": G, "residual_length": R, **result}
        )
    )
    args = ["sensitivity", "allocate", str(sweep_file), "--name", "tiny-b3", "--out-dir", str(tmp_path)]
    assert main([*args, "--budget", "kivi-k4v2"]) == 0
    plan = json.loads((tmp_path / "tiny-b3.json").read_text())
    assert plan["allocation"]["plan_bytes"] <= plan["allocation"]["budget_bytes"]
    cache = MixedCache(plan, fragile.config, group_size=G, residual_length=R)
    assert len(cache.layers) == 4
    capsys.readouterr()
    assert main([*args, "--budget", "0.01", "--force"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "below the smallest plan" in err[0], err


def test_the_verdict_compares_a_mixed_cache_with_uniform_caches_of_no_more_bytes():
    from kvlab.plan.allocate import mixed_verdict

    def row(name, nbytes, kl, recall=0.0, passkey=0.0, context=1024):
        return {
            "matrix": "capacity",
            "candidate": name,
            "context_length": context,
            "cache_bytes": nbytes,
            "kl_mean": kl,
            "recall_drop": recall,
            "passkey_drop": passkey,
        }

    rows = [
        row("dynamic", 100, 0.0),
        row("kivi-4", 30, 0.02),
        row("kivi-2", 20, 0.09),
        row("fp8-e4m3", 50, 0.001),  # more bytes: not compared
        row("mixed-a", 30, 0.015),
        row("mixed-b", 30, 0.015, recall=0.02),  # lower KL but a larger recall drop than kivi-4's
        row("kivi-2", 20, 0.0, context=512),  # another context: not compared
    ]
    verdicts = {v["candidate"]: v for v in mixed_verdict(rows)}
    assert [a["candidate"] for a in verdicts["mixed-a"]["against"]] == ["kivi-4", "kivi-2"]
    assert verdicts["mixed-a"]["wins"] and not verdicts["mixed-b"]["wins"]
    assert [a["beaten"] for a in verdicts["mixed-b"]["against"]] == [False, False]


def test_an_fp8_only_allocation_is_what_vllm_runs(fragile, result):
    """Restricted to FP8, the allocator keeps the layers it must in float: vLLM's skip layers."""
    from kvlab.commands.sensitivity import _chosen_formats, vllm_flags

    spec = _spec(fragile)
    kl = _chosen_formats(result["kl"], "fp8-e4m3")
    fp8 = budget_bytes(spec, "fp8-e4m3", CONTEXT, group_size=G, residual_length=R)
    # fp32 model, 4 layers: one float layer costs 3/4 of the FP8 cache more, two would cost 6/4
    out = allocate(spec, kl, 2 * fp8, CONTEXT, group_size=G, residual_length=R)
    assert {i for i, e in out["layers"].items() if e["k"] == "float"} == {str(FRAGILE)}
    assert vllm_flags(out["layers"]) == f"--kv-cache-dtype fp8 --kv-cache-dtype-skip-layers {FRAGILE}"
    assert vllm_flags({"0": {"k": "kivi-4", "v": "kivi-4"}}) is None
    with pytest.raises(ValueError, match="the sweep measured kivi-2"):
        _chosen_formats(result["kl"], "fp8-e5m2")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--group-size", "0"], "--group-size must be >= 1, got 0"),
        (
            ["--context", "128", "--residual", "128"],
            "--context 128 must be at least --residual 128 + --group-size 32",
        ),
        # one token short of a whole group before the window: every KL was 0, silently
        (
            ["--context", "63", "--residual", "32"],
            "--context 63 must be at least --residual 32 + --group-size 32",
        ),
        (["--out", "/proc/s.json"], "--out /proc/s.json: folder /proc takes no files"),
        (["--dtype", "bogus"], "--dtype must be one of ['bfloat16', 'float16', 'float32'] (or bf16, fp16, fp32; any case), got 'bogus'"),
    ],
)
def test_a_sweep_that_cannot_measure_or_save_is_refused_before_the_model_loads(
    argv, message, tmp_path, capsys
):
    from pathlib import Path

    from kvlab.cli import main

    if "/proc" in message and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    out = ["--out", str(tmp_path / "s.json")] if "--out" not in argv else []
    assert main(["sensitivity", "sweep", *out, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--name", "demo"], "plan name 'demo' is a built-in plan"),
        (["--name", "p2", "--formats", "kivi-2,kivi-2"], "kivi-2 given twice"),
    ],
)
def test_allocate_refuses_a_builtin_name_and_a_repeated_format(
    fragile, result, argv, message, tmp_path, capsys
):
    import json

    from kvlab.cli import main
    from kvlab.commands.sensitivity import SWEEP_KIND

    sweep_file = tmp_path / "sweep.json"
    config = {**fragile.config.to_dict(), "torch_dtype": "float32"}
    sweep_file.write_text(
        json.dumps(
            {"kind": SWEEP_KIND, "model_config": config, "group_size": G, "residual_length": R, **result}
        )
    )
    plans = tmp_path / "pd"
    args = ["sensitivity", "allocate", str(sweep_file), "--budget", "0.5", "--out-dir", str(plans)]
    assert main([*args, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
    assert not plans.exists()


def test_a_sweep_past_the_held_out_text_names_the_flags(tmp_path, capsys):
    # it said `offset` 0 + `n_tokens` 100000015: the library's names, and a sum the user never typed
    from kvlab.cli import main

    argv = ["sensitivity", "sweep", "--out", str(tmp_path / "s.json"), "--context", "99999999"]
    assert main([*argv, "--continuation", "16", "--prompts", "2", "--offset", "5"]) == 2
    err = capsys.readouterr().err.strip()
    said = (
        "--offset 5 + --prompts 2 x (--context 99999999 + --continuation 16) 200000030 = 200000035 exceeds it"
    )
    assert err.count("\n") == 0 and said in err and "`" not in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[1", "sweep file '{path}' is not JSON"),
        ("[1]", "sweep file '{path}' must hold a JSON object, got list"),
        ('{"kind": "other"}', "{path} is not a kvlab sensitivity sweep (its 'kind' is 'other', not 'kvlab-sensitivity'"),
        # "(kind None; ...)": Python's None for a field the file does not have
        ('{"a": 1}', "{path} is not a kvlab sensitivity sweep (it has no 'kind' field; kvlab sensitivity sweep"),
        # a sweep version field read as a plan's: 'plan file ... has kvlab_plan 3'
        ('{"kind": "kvlab-sensitivity", "kvlab_plan": 3}', "sweep file '{path}': the sweep's `layers`"),
        ('{"kind": "kvlab-sensitivity", "kvlab_plan": 3}', "`layers` must be a positive integer, got none"),
        # a KeyError traceback, then "its `model_config` must be an object, got None"
        (None, "sweep file '{path}': it has no `model_config`"),
    ],
)
def test_allocate_names_a_bad_sweep_file_as_a_sweep_file(result, text, said, tmp_path, capsys):
    """A bad sweep given to ``kvlab sensitivity allocate`` was called a 'plan file' (read by the plan reader),
    and a sweep without ``model_config`` crashed with a KeyError."""
    import json

    from kvlab.cli import main
    from kvlab.commands.sensitivity import SWEEP_KIND

    path = tmp_path / "sweep.json"
    if text is None:
        text = json.dumps({"kind": SWEEP_KIND, "group_size": G, "residual_length": R, **result})
    path.write_text(text)
    assert main(["sensitivity", "allocate", str(path), "--name", "p", "--budget", "0.5"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said.format(path=path) in err and "plan file" not in err and "None" not in err, err
    missing = tmp_path / "none.json"
    assert main(["sensitivity", "allocate", str(missing), "--name", "p", "--budget", "0.5"]) == 2
    assert f"sweep file '{missing}' cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda s: s["formats"].append({"kivi": 4}), "`formats` must list format names, got {'kivi': 4}"),
        (lambda s: s.update(cost=7), "`cost` must be an object, got 7"),
    ],
)
def test_allocate_names_a_format_that_is_not_a_name_and_a_cost_that_is_not_an_object(change, said, tmp_path, capsys):
    """A sweep whose `formats` held a list or an object (TypeError: unhashable type) or whose `cost` was not an
    object (AttributeError: no attribute 'get') ended ``kvlab sensitivity allocate`` in a traceback."""
    import json

    from kvlab.cli import main
    from kvlab.commands.sensitivity import SWEEP_KIND

    sweep = {"kind": SWEEP_KIND, "layers": 2, "formats": ["kivi-2"], "kl": {"kivi-2": {"k": [0.1, 0.2], "v": [0.1, 0.1]}},
             "cost": {"context": 256}, "model_config": {}, "group_size": G, "residual_length": R}  # fmt: skip
    change(sweep)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(sweep))
    assert main(["sensitivity", "allocate", str(path), "--name", "p", "--budget", "0.5", "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"sweep file '{path}'" in err and said in err, err
    assert not (tmp_path / "p.json").exists()
