"""The --kv-dtype names of kvlab plan and kvlab paging come from the planner's ledger, and the planner reads each."""

from __future__ import annotations

import pytest

from kvlab.cli import build_parser, main
from kvlab.plan.kv_formats import FP8_CACHES, KIVI_NBITS, KV_DTYPE_NAMES, kv_dtype


@pytest.mark.parametrize("name", KV_DTYPE_NAMES)
def test_every_listed_name_is_read_by_the_planner(name):
    kvd = kv_dtype(name, "bfloat16")
    assert kvd.bytes_per_element > 0


def test_the_list_covers_every_fp8_cache_and_kivi_bit_pair():
    assert set(FP8_CACHES) <= set(KV_DTYPE_NAMES)
    for k in KIVI_NBITS:
        assert f"kivi-{k}" in KV_DTYPE_NAMES and f"kivi{k}" in KV_DTYPE_NAMES
        for v in KIVI_NBITS:
            if k != v:
                assert f"kivi-k{k}v{v}" in KV_DTYPE_NAMES
    assert len(set(KV_DTYPE_NAMES)) == len(KV_DTYPE_NAMES)


def _option(argv_prefix: list[str], dest: str):
    parser = build_parser()
    sub = parser
    for word in argv_prefix:
        action = next(a for a in sub._actions if a.choices and word in a.choices)
        sub = action.choices[word]
    return next(a for a in sub._actions if a.dest == dest)


@pytest.mark.parametrize("command", [["plan"], ["roofline"], ["video"]])
def test_planner_commands_offer_exactly_the_ledger_names(command):
    """Each planner command offers the ledger's names; ``kvlab plan`` also the pattern of its per-layer plans."""
    extra = ("mixed-<plan>",) if command == ["plan"] else ()
    assert tuple(_option(command, "kv_dtype").choices) == (*KV_DTYPE_NAMES, *extra)


@pytest.mark.parametrize(
    ("command", "dest"), [(["paging", "static"], "kv_dtype"), (["paging", "simulate"], "quant_kv_dtype")]
)
def test_paging_help_lists_the_ledger_names(command, dest):
    help_text = _option(command, dest).help
    assert all(name in help_text for name in KV_DTYPE_NAMES)


def _plan(capsys, kv: str, *argv: str):
    import json

    from kvlab.cli import main

    code = main(["plan", "llama-3-8b", "--context", "8192", "--json", "--kv-dtype", kv, *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), " ".join(err.split())


@pytest.mark.parametrize("command", ["plan", "roofline", "video"])
def test_planner_commands_take_a_cache_name_with_settings(command):
    """``kivi-4:dot=int8`` and ``kivi-4:group_size=64`` (names the cache registry takes) were argparse's 'invalid
    choice'; the settings cannot be listed, so the choices hold them."""
    choices = _option([command], "kv_dtype").choices
    for name in ("kivi-4:dot=int8", "kivi-4:group_size=64", "kivi-4-fused:residual_length=64", "fp8-e4m3:x=1"):
        assert name in choices, name
    for name in ("bf16:x=1", "hqq-4", "paged:block_size=16", "kivx"):  # not a cache the planner sizes
        assert name not in choices, name


def test_a_dot_setting_changes_no_bytes_and_group_size_residual_are_honoured(capsys):
    code, plain, _ = _plan(capsys, "kivi-4")
    assert code == 0
    code, dot, _ = _plan(capsys, "kivi-4:dot=int8")
    assert code == 0 and dot["kv_dtype"] == plain["kv_dtype"] and dot["kv_bytes_per_token"] == plain["kv_bytes_per_token"]
    code, g64, _ = _plan(capsys, "kivi-4:group_size=64")
    assert code == 0 and g64["kv_dtype"]["group_size"] == 64
    code, flag, _ = _plan(capsys, "kivi-4", "--group-size", "64")
    assert g64["kv_bytes_per_token"] == flag["kv_bytes_per_token"] < plain["kv_bytes_per_token"]
    code, r64, _ = _plan(capsys, "kivi-4-fused:residual_length=64")
    assert code == 0 and r64["kv_dtype"]["residual_length"] == 64


@pytest.mark.parametrize(
    ("kv", "argv", "said"),
    [
        ("kivi-4:foo=1", (), "--kv-dtype kivi-4:foo=1: kivi settings are"),
        ("kivi-4:dot=int9", (), "--kv-dtype kivi-4:dot=int9: dot must be one of ['exact', 'int8', 'int8-keys']"),
        ("kivi-4:residual_length=100", (), "residual_length (100) must be a multiple of group_size (32)"),
        ("kivi-4-snapkv", (), "--kv-dtype kivi-4-snapkv: kivi variants are ['fused', 'dequant']"),
        ("kivi5", (), "--kv-dtype kivi5: kivi needs bits in [2, 4, 8], got 5"),  # the registry says why
        ("fp8-e4m3:group_size=2", (), "--kv-dtype fp8-e4m3:group_size=2: fp8 settings are none"),
        # a setting the registry takes but the planner cannot size: refused, not sized as plain kivi-4
        ("kivi-4:token_budget=64", (), "the KIVI settings the planner sizes are group_size and residual_length"),
        ("kivi-4:group_size=64", ("--group-size", "32"), "--group-size 32 and --kv-dtype kivi-4:group_size=64 both set"),
    ],
)
def test_a_cache_name_the_planner_cannot_take_is_refused_naming_it(capsys, kv, argv, said):
    code, _, err = _plan(capsys, kv, *argv)
    assert code == 2 and said in err and "invalid choice" not in err, err


def test_the_planner_library_reads_a_dot_setting_as_the_plain_kivi_name():
    assert kv_dtype("kivi-4:dot=int8-keys", "bfloat16") == kv_dtype("kivi-4", "bfloat16")
    with pytest.raises(ValueError, match="`dot` must be one of"):
        kv_dtype("kivi-4:dot=fast", "bfloat16")
    with pytest.raises(ValueError, match=r"got \['compression_ratio'\]"):
        kv_dtype("kivi-4:compression_ratio=0.5", "bfloat16")


@pytest.mark.parametrize("setting", ["group_size=-1", "residual_length=-5"])
def test_a_negative_kivi_setting_gets_the_value_error_not_argparses_list(setting, capsys):
    """kivi-4:group_size=-1 printed argparse's 'invalid choice' with the whole --kv-dtype list while =0 got a
    value error; -1 now names its setting and value too."""
    assert main(["plan", "llama-3-8b", "--kv-dtype", f"kivi-4:{setting}"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" not in err
    assert f"--kv-dtype kivi-4:{setting}: setting '{setting}' must be name=value with a non-negative value" in err
