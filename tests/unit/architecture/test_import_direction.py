"""Imports flow one way: cli -> commands -> eval / bench / lab -> caches / attention -> quant; plan, paging and the
task generators (tasks) are torch-free leaves; run-time helpers (kvlab.runtime) import no other kvlab code. A small
AST walk over src/kvlab, every import counted (module level or inside a function), ``if TYPE_CHECKING:`` blocks excepted."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[3] / "src"
PKG = SRC / "kvlab"

# Which top-level parts of kvlab each part may import (besides itself and the root package's __version__).
# A part missing from a set is forbidden: that is the direction rule. ``runtime`` (run-time helpers) and
# ``cache_names`` (the cache-name grammar) and ``model_names`` (the named real models) are leaves every other part
# may use; the torch-free test below keeps plan and paging to the torch-free ones (``kvlab.runtime.atomic``,
# ``kvlab.cache_names``).
LEAVES = {"runtime", "cache_names", "model_names"}
ALLOWED: dict[str, set[str]] = {
    "runtime": set(),
    "cache_names": set(),
    "model_names": set(),
    "quant": set(),
    "plan": set(),
    "tasks": set(),
    "paging": {"plan"},
    "attention": {"quant"},
    "caches": {"attention", "quant", "paging", "plan"},
    "models": {"plan"},
    "lab": {"caches", "attention", "quant", "models", "plan", "paging"},
    "eval": {"caches", "attention", "quant", "models", "plan", "tasks"},
    "bench": {"eval", "lab", "caches", "attention", "quant", "models", "plan", "paging", "tasks"},
    "figures": {"lab", "paging", "plan", "eval", "tasks"},
    "task_figures": {"figures"},
    "sensitivity_figure": {"figures", "plan"},
    "report_html": {"figures", "eval"},
    "report_tasks": {"figures", "eval", "task_figures", "report_html"},
    "commands": {
        "eval",
        "bench",
        "lab",
        "caches",
        "attention",
        "quant",
        "models",
        "plan",
        "paging",
        "tasks",
        "figures",
        "task_figures",
        "sensitivity_figure",
        "report_html",
        "report_tasks",
    },
    "cli": {"commands"},
    "__main__": {"cli"},  # python -m kvlab: the command line, nothing else
}
for _part_name, _allowed in ALLOWED.items():
    if _part_name not in LEAVES:
        _allowed |= LEAVES
TORCH_FREE = ("kvlab.plan", "kvlab.paging", "kvlab.tasks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str]) -> set[str]:
    """kvlab modules ``path`` imports; ``from pkg import sub`` counts as importing ``pkg.sub`` when it is one."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "kvlab")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if mod.split(".")[0] != "kvlab":
                    continue
                subs = [f"{mod}.{a.name}" for a in child.names if f"{mod}.{a.name}" in modules]
                found.update(subs)
                if len(subs) < len(child.names):
                    found.add(mod)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    paths = sorted(PKG.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, modules) & modules for p in paths}


def _part(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_part_of_kvlab_has_a_rule():
    parts = {_part(m) for m in _graph()} - {None}
    assert parts <= set(ALLOWED), f"add a rule to ALLOWED for {sorted(parts - set(ALLOWED))}"


def test_imports_flow_one_way():
    bad = []
    for module, targets in _graph().items():
        part = _part(module)
        for target in targets:
            other = _part(target)
            if other is None:  # the root package: kvlab.__version__ only
                continue
            if other != part and other not in ALLOWED.get(part, set()):
                bad.append(f"{module} -> {target}")
    assert not bad, "imports against the direction rule:\n" + "\n".join(sorted(bad))


def test_root_package_imports_nothing_of_kvlab():
    assert _graph()["kvlab"] == set()


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """Import cycles of ``graph`` (a package importing its own submodules is not one)."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []
    cycles: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                dfs(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node)
    return cycles


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """Negative control: the walk finds a function-level import, relative imports and ``from pkg import sub``."""
    pkg = tmp_path / "kvlab"
    (pkg / "plan").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plan" / "__init__.py").write_text("from . import a\n")
    (pkg / "plan" / "a.py").write_text("def f():\n    from kvlab.plan import b\n")
    (pkg / "plan" / "b.py").write_text("from .a import f\nimport kvlab.eval\n")
    modules = {"kvlab", "kvlab.plan", "kvlab.plan.a", "kvlab.plan.b", "kvlab.eval"}
    monkeypatch.setattr(sys.modules[__name__], "SRC", tmp_path)
    assert _imports(pkg / "plan" / "a.py", modules) == {"kvlab.plan.b"}
    assert _imports(pkg / "plan" / "b.py", modules) == {"kvlab.plan.a", "kvlab.eval"}
    assert _imports(pkg / "plan" / "__init__.py", modules) == {"kvlab.plan.a"}
    graph = {
        m: _imports(pkg.parent / (m.replace(".", "/") + ".py"), modules)
        for m in ("kvlab.plan.a", "kvlab.plan.b")
    }
    graph["kvlab.eval"] = set()
    assert _cycles(graph) == ["kvlab.plan.a -> kvlab.plan.b -> kvlab.plan.a"]


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_leaves_import_no_torch(package):
    code = (
        f"import sys, {package}, pkgutil, importlib\n"
        f"for m in pkgutil.walk_packages({package}.__path__, '{package}.'):\n"
        "    importlib.import_module(m.name)\n"
        "heavy = sorted(n for n in ('torch', 'transformers', 'numpy.linalg.torch') if n in sys.modules)\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, heavy\n"
        "assert not any(n.startswith('kvlab.commands') or n == 'kvlab.cli' for n in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_building_the_command_line_imports_neither_torch_nor_numpy():
    """Every kvlab command builds the whole parser first: a help text that imports torch (kvlab models' list of
    named models did, through kvlab.models) adds seconds to `kvlab plan` and every other torch-free command."""
    code = (
        "import sys; from kvlab.cli import build_parser; build_parser()\n"
        "heavy = sorted(n for n in ('torch', 'numpy', 'transformers') if n in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
