"""No function in src/kvlab longer than 80 lines: a mechanism fits on one screen (as in nanoGPT and gpt-fast); no
file in src longer than 600 lines: a module does one job a reader can hold.

A small AST walk; a function's length runs from its first decorator to its last line, docstring and comments
included. Nested functions count on their own and inside their parent. A file's length is its line count.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"
PKG = SRC / "kvlab"
MAX_LINES = 80
MAX_FILE_LINES = 600


# Functions allowed past MAX_LINES for now, each with the reason. Remove an entry when its function is split;
# the test below fails on an entry that no longer needs to be here, so the list can only shrink.
def _visit(node: ast.AST, rel: str, prefix: str, lengths: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([child.lineno] + [d.lineno for d in child.decorator_list])
            assert child.end_lineno is not None
            lengths[f"{rel}::{prefix}{child.name}"] = child.end_lineno - start + 1
            _visit(child, rel, f"{prefix}{child.name}.", lengths)
        elif isinstance(child, ast.ClassDef):
            _visit(child, rel, f"{prefix}{child.name}.", lengths)
        else:
            _visit(child, rel, prefix, lengths)


@functools.cache
def _function_lengths() -> dict[str, int]:
    """``"<path under src/kvlab>::<qualified name>"`` -> lines, for every function and method."""
    lengths: dict[str, int] = {}
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        _visit(tree, path.relative_to(PKG).as_posix(), "", lengths)
    return lengths


def test_the_walk_sees_functions_and_methods():
    lengths = _function_lengths()
    assert "runtime/device.py::resolve_device" in lengths
    assert any("." in name.split("::")[1] for name in lengths), "methods are counted under their class"
    assert all(n >= 1 for n in lengths.values())


def test_no_function_longer_than_80_lines():
    too_long = {name: n for name, n in _function_lengths().items() if n > MAX_LINES}  # no exceptions
    assert not too_long, f"functions over {MAX_LINES} lines (split them into named steps):\n" + "\n".join(
        f"  {n:4d}  {name}" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1])
    )


def _file_lengths() -> dict[str, int]:
    """``"<path under src>"`` -> lines, for every Python file in src."""
    return {
        path.relative_to(SRC).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(SRC.rglob("*.py"))
    }


def test_the_file_count_sees_every_module():
    lengths = _file_lengths()
    assert "kvlab/cli.py" in lengths and "kvlab/commands/eval/run.py" in lengths
    assert all(n >= 0 for n in lengths.values())


def test_no_file_longer_than_600_lines():
    too_long = {name: n for name, n in _file_lengths().items() if n > MAX_FILE_LINES}
    assert not too_long, f"files over {MAX_FILE_LINES} lines (split them along a seam):\n" + "\n".join(
        f"  {n:5d}  {name}" for name, n in sorted(too_long.items(), key=lambda kv: -kv[1])
    )
