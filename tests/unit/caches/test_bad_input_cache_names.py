"""Hostile cache names for the registry (:func:`kvlab.caches.registry.resolve`): an eviction setting the name
gives is the cache the user gets, or the name is refused naming it; the spelling ``kvlab eval`` asks for is one it
accepts."""

from __future__ import annotations

import pytest

from kvlab.cache_names import parse_cache_name
from kvlab.caches.registry import REGISTRY, resolve


@pytest.mark.parametrize(
    "name",
    ["snapkv:token_budget=0", "tova:token_budget=0", "kivi-4:token_budget=0", "kivi-k8v4:token_budget=0"],
)
def test_an_explicit_zero_token_budget_is_refused_not_replaced_by_the_default_ratio(name):
    # token_budget=0 is CacheSettings' "not given"; written in a name it used to run SnapKV/TOVA at the default
    # compression_ratio=0.5 (recorded as such) or fail only when the cache was made, per eval cell
    with pytest.raises(ValueError, match=r"`token_budget` must be an int >= 1, got 0"):
        resolve(name)


@pytest.mark.parametrize(
    "name",
    [
        "snapkv:compression_ratio=0.5:token_budget=10",
        "tova:token_budget=7:compression_ratio=0.3",
        "kivi-4:compression_ratio=0.25:token_budget=10",
    ],
)
def test_a_name_with_both_ratio_and_budget_is_refused(name):
    # the factories silently used token_budget and dropped the ratio; SnapKVCache itself refuses both
    with pytest.raises(ValueError, match=r"`compression_ratio` or `token_budget`, not both"):
        resolve(name)


@pytest.mark.parametrize("value", ["0.0000001", "0.00001", "0.5", "0.25"])
def test_the_canonical_spelling_of_a_decimal_setting_parses_back(value):
    # 'snapkv:compression_ratio=0.0000001' was to be written '...=1e-07', which the grammar refuses
    canonical = parse_cache_name(f"snapkv:compression_ratio={value}", REGISTRY).canonical
    again = parse_cache_name(canonical, REGISTRY)
    assert again.canonical == canonical and dict(again.settings)["compression_ratio"] == float(value)


def test_budget_and_ratio_alone_still_resolve():
    assert resolve("snapkv:token_budget=32").settings.token_budget == 32
    assert resolve("tova:compression_ratio=0.25").describe()["compression_ratio"] == 0.25
    assert resolve("kivi-4:token_budget=48").describe()["token_budget"] == 48


@pytest.mark.parametrize(
    "name", ["snapkv:token_budget=16", "kivi-4:token_budget=16", "kivi-k8v4:token_budget=31"]
)
def test_a_snapkv_budget_below_its_window_is_refused_by_name(name):
    # SnapKVCache refuses it when made: the registry says so at resolve, so kvlab eval refuses it before any work
    with pytest.raises(
        ValueError, match=rf"cache '{name}': `token_budget` \(\d+\) must be at least `window_size`"
    ):
        resolve(name)


def test_tova_takes_a_budget_below_snapkvs_window():
    assert resolve("tova:token_budget=16").settings.token_budget == 16


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("kivi-4:group_size=32:residual_length=48", "(48)"),
        ("kivi-k8v4:group_size=32:residual_length=48", "(48)"),
        ("kivi-4:group_size=3", "(3)"),  # against the default residual window 128
        ("kivi-4:compression_ratio=0.5:group_size=32:residual_length=48", "(48)"),
    ],
)
def test_a_kivi_residual_window_not_a_multiple_of_its_group_is_refused_at_resolve(name, fragment):
    # resolve used to accept it; the cache then failed only when made (per bench cell, after the model loaded)
    with pytest.raises(ValueError, match=r"`residual_length`.*multiple of `group_size`") as exc:
        resolve(name)
    assert name in str(exc.value) and fragment in str(exc.value)


def test_kivi_settings_that_fit_still_resolve():
    assert resolve("kivi-4:group_size=32:residual_length=96").settings.residual_length == 96
    assert resolve("kivi-k8v4:group_size=64:residual_length=0").settings.group_size == 64


@pytest.mark.parametrize("settings", [{"group_size": 64}, "x", 4])
def test_settings_that_are_not_cache_settings_are_named(settings):
    # was TypeError: replace() should be called on dataclass instances
    with pytest.raises(TypeError, match=r"`settings` must be a CacheSettings") as exc:
        resolve("kivi-4", settings)
    assert repr(settings) in str(exc.value)


@pytest.mark.parametrize("name", ["hqq-4", "quanto-2"])
def test_transformers_quantized_caches_without_a_model_config_are_named(name):
    from kvlab.caches.registry import make_cache

    # was AttributeError: 'NoneType' object has no attribute 'get_text_config' (inside transformers)
    with pytest.raises(ValueError, match=rf"{name} needs the model config"):
        make_cache(name, None)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("sink:sink_tokens=-1:window_length=64", "sink_tokens=-1"),  # the pair as written
        ("snapkv:token_budget=-5", "token_budget=-5"),
        ("snapkv:compression_ratio=nan", "compression_ratio=nan"),
        ("snapkv:compression_ratio=.5", "compression_ratio=.5"),
        ("snapkv:compression_ratio=5e-1", "compression_ratio=5e-1"),
        ("sink::window_length=64", ""),
        ("kivi-4:", ""),
    ],
)
def test_a_malformed_setting_is_named_not_only_the_grammar(name, bad):
    # was only "cache name ... is not family[-bits][-variant][:setting=value]..."
    with pytest.raises(ValueError) as exc:
        resolve(name)
    assert f"setting {bad!r}" in str(exc.value) and repr(name) in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    "name, setting, given",
    [
        ("mixed-demo:group_size=", "group_size", "nothing follows its '='"),
        ("mixed-demo:residual_length=", "residual_length", "nothing follows its '='"),
        ("mixed-demo:group_size=64:residual_length=", "residual_length", "nothing follows its '='"),
        ("sink:window_length=", "window_length", "nothing follows its '='"),
        ("kivi-4:dot=", "dot", "nothing follows its '='"),
        ("kivi-4:group_size", "group_size", "it has no '='"),
    ],
)
def test_a_setting_with_an_empty_value_is_named_with_the_setting(name, setting, given):
    """``mixed-demo:group_size=`` was refused with the grammar's generic "setting 'group_size=' must be name=value
    with a non-negative value ..."; the message names the setting and says its value is empty."""
    expected = f"cache name {name!r}: setting {setting!r} has an empty value ({given}); write {setting}=<value>"
    with pytest.raises(ValueError) as exc:
        resolve(name)
    assert str(exc.value) == expected
    with pytest.raises(ValueError) as exc:  # the planner's grammar is the same one
        parse_cache_name(name, ("mixed", "sink", "kivi"))
    assert str(exc.value) == expected


def test_kvlab_eval_and_plan_name_an_empty_setting_of_a_mixed_cache(tmp_path, capsys):
    from kvlab.cli import main

    said = "setting 'group_size' has an empty value (nothing follows its '='); write group_size=<value>"
    argv = ["eval", "--dry-run", "--quick", "--candidates", "mixed-demo:group_size=", "--out-dir", str(tmp_path)]
    assert main(argv) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert main(["plan", "smollm2-135m", "--kv-dtype", "mixed-demo:group_size="]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--kv-dtype 'mixed-demo:group_size='" in err and said in err, err


def test_kvlab_plan_refuses_a_setting_on_a_mixed_plan_saying_it_takes_none(capsys):
    """'--kv-dtype mixed-demo:group_size=64' (a valid cache name for kvlab eval) was refused as a bad plan name
    ("plan name 'demo:group_size=64' must be one or two words ..."): the planner takes no settings on a plan."""
    from kvlab.cli import main

    assert main(["plan", "smollm2-135m", "--kv-dtype", "mixed-demo:group_size=64"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "takes no settings on a per-layer plan" in err and "drop ':group_size=64' (--kv-dtype mixed-demo)" in err
    assert "must be one or two words" not in err
