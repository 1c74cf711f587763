"""``kvlab eval --help`` shows each setting's default as ``EvalConfig`` / ``Gates`` hold it (written once there)."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields

from kvlab.cli import build_parser
from kvlab.commands.eval.settings import _FIELDS
from kvlab.eval.config import QUICK_SETTINGS, EvalConfig, Gates


def _eval_parser() -> argparse.ArgumentParser:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["eval"]
    raise AssertionError("no subcommands")


def _shown(value) -> str:
    if isinstance(value, tuple):
        return ",".join(_shown(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def test_help_defaults_are_the_config_defaults():
    defaults = {f.name: f.default for f in fields(EvalConfig)}
    gates = {f.name: f.default for f in fields(Gates)}
    checked = []
    for action in _eval_parser()._actions:
        match = re.search(r"\(default:? ([^);]+)", action.help or "")
        if not match or action.dest not in {**_FIELDS, **gates}:
            continue
        if action.dest in _FIELDS and defaults[_FIELDS[action.dest]] is None:  # a default told in words
            continue
        shown = match.group(1)
        if action.dest in gates:
            assert float(shown) == gates[action.dest], action.dest
        else:
            assert shown == _shown(defaults[_FIELDS[action.dest]]), action.dest
        checked.append(action.dest)
    assert {"contexts", "residual", "group_size", "window_residuals", "max_kl_mean", "passkey_depths"} <= set(
        checked
    )


def test_quick_help_names_the_quick_settings():
    quick = next(a for a in _eval_parser()._actions if a.dest == "quick")
    text = " ".join(quick.help.split())
    assert f"contexts {_shown(QUICK_SETTINGS['contexts'])}," in text
    assert f"residual windows {_shown(QUICK_SETTINGS['window_residuals'])}," in text
    assert f"(--repeat {QUICK_SETTINGS['repeat']})" in text
    assert f"{QUICK_SETTINGS['passkey_trials']} passkey trials" in text


def test_the_choice_marked_default_is_the_config_default():
    defaults = {f.name: f.default for f in fields(EvalConfig)}
    helps = {a.dest: " ".join(a.help.split()) for a in _eval_parser()._actions if a.help}
    for dest in ("kivi_attention", "cpu_matmul", "dtype"):
        assert f"{defaults[dest]} (default)" in helps[dest], dest
    first = helps["prompt_mode"].split(";")[0]  # "heldout: held-out text cut to exact lengths (default)"
    assert first.startswith(f"{defaults['prompt_mode']}:") and first.endswith("(default)")
