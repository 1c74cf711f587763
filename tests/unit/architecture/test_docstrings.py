"""Every public module-level function and class in src/kvlab has a docstring (the house rule: what it takes and
returns, shapes and units, the errors it raises or the exit codes it turns them into, the method's source).

A small AST walk over each module's top-level statements: a ``def``, ``async def`` or ``class`` whose name does not
start with ``_`` must begin with a string literal that is not blank. Methods and nested functions are not walked.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[3] / "src" / "kvlab"
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def undocumented(source: str) -> list[str]:
    """``"<name> (line N)"`` of each public module-level function or class of ``source`` without a docstring (an
    empty one counts as none)."""
    return [
        f"{node.name} (line {node.lineno})"
        for node in ast.parse(source).body
        if isinstance(node, DEFINITIONS) and not node.name.startswith("_") and not (ast.get_docstring(node) or "").strip()
    ]


def test_the_walk_sees_a_missing_docstring():
    source = '''
def documented():
    """Says what it does."""

def bare(x):
    return x  # "a string later in the body is no docstring"

async def bare_async():
    pass

class Bare:
    """"""

class Plain:
    x = 1

def _private():
    pass

def outer():
    """Documented; its nested function is not walked."""
    def inner():
        pass
'''
    assert undocumented(source) == ["bare (line 5)", "bare_async (line 8)", "Bare (line 11)", "Plain (line 14)"]


def test_every_public_module_level_function_and_class_has_a_docstring():
    paths = sorted(PKG.rglob("*.py"))
    assert len(paths) > 100 and PKG / "commands" / "bench.py" in paths  # the walk sees the package
    missing = [
        f"{path.relative_to(PKG).as_posix()}: {name}"
        for path in paths
        for name in undocumented(path.read_text(encoding="utf-8"))
    ]
    assert not missing, "public functions and classes without a docstring (say what each does):\n" + "\n".join(
        f"  {m}" for m in missing
    )
