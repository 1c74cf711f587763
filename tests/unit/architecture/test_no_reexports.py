"""A name is imported from the module that defines it: no kvlab module but a package's ``__init__`` (the public
API users type: ``kvlab.plan``, ``kvlab.caches``, ...) lists in ``__all__`` a name it imports from another kvlab
module, and no kvlab code or test imports a name through a module that only imports it. An AST walk, no imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src"


def _modules() -> dict[str, tuple[ast.Module, bool]]:
    """Module name -> (its tree, whether it is a package ``__init__``)."""
    out = {}
    for path in (SRC / "kvlab").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        init = parts[-1] == "__init__"
        if init:
            parts.pop()
        out[".".join(parts)] = (ast.parse(path.read_text()), init)
    return out


def _imported(tree: ast.Module) -> dict[str, str]:
    """Names a module imports at its top level from other kvlab modules -> the module they come from, less the
    names it also defines."""
    names = {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kvlab")
        for alias in node.names
    }
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.pop(node.name, None)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names.pop(n.id, None)
    return names


def _all(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
    return []


def test_no_module_re_exports_another_modules_name():
    found = {}
    for name, (tree, init) in _modules().items():
        if init:
            continue
        imported = _imported(tree)
        listed = {n: imported[n] for n in _all(tree) if n in imported}
        if listed:
            found[name] = listed
    assert not found, f"__all__ re-exports (import them from the defining module instead): {found}"


def test_no_import_goes_through_a_module_that_only_imports_the_name():
    modules = _modules()
    imported = {name: _imported(tree) for name, (tree, init) in modules.items() if not init}
    found = []
    for root in ("src", "tests", "scripts", "benchmarks"):
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.module not in imported:
                    continue
                for alias in node.names:
                    origin = imported[node.module].get(alias.name)
                    if origin and not origin.startswith(node.module + "."):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} (from {origin})")
    assert len(modules) > 100  # the walk saw the package
    assert not found, found
