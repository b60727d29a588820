"""The house's shape: the import graph of cbrules has no cycles, each layer imports only the layers
below it, and the light commands load nothing heavy. Read from the source (ast), so a lazy import
inside a function counts like one at the top; only ``if TYPE_CHECKING:`` imports are left out."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# layer -> the layers it may import (besides itself); a module's layer is its longest matching prefix
ALLOWED = {
    "base": set(),                                   # errors, shipped-file locations, user files (userio), the s-expression reader
    "ir": {"base"},                                  # graph, ops, terms, builder, verifier, order
    "kernels": {"base", "ir"},                       # the built-in kernels, written with the builder
    "rewrite": {"base", "ir"},                       # the rule engine
    "schedule": {"base", "ir"},                      # the scheduler
    "codegen": {"base", "ir", "schedule"},           # consumes the schedule only
    "reference": {"base", "ir", "schedule"},         # interpreter and protocol checker
    "tools": {"base", "ir", "kernels", "rewrite", "schedule", "codegen", "reference"},  # api, cli, trace, ...
}
LAYER_OF = {"cbrules.errors": "base", "cbrules.shipped": "base", "cbrules.userio": "base", "cbrules.sexpr": "base", "cbrules.ir": "ir",
            "cbrules.kernels": "kernels",
            "cbrules.rewrite": "rewrite", "cbrules.schedule": "schedule", "cbrules.codegen": "codegen",
            "cbrules.reference": "reference", "cbrules": "tools"}


def _modules() -> dict[str, Path]:
    """Module name -> file, named as installed (codegen/ is cbrules.codegen)."""
    out = {}
    for base, prefix in ((ROOT / "cbrules", ("cbrules",)), (ROOT / "codegen", ("cbrules", "codegen"))):
        for p in base.rglob("*.py"):
            parts = prefix + p.relative_to(base).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, modules: dict) -> set[str]:
    """The cbrules modules ``name`` imports (anywhere in the file but under ``if TYPE_CHECKING:``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:  # `from PKG import module` imports the module
                found.add(f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name and not name.startswith(m + ".")}


def _layer(name: str) -> str:
    best = max((p for p in LAYER_OF if name == p or name.startswith(p + ".")), key=len)
    return LAYER_OF[best]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def test_the_graph_is_read_from_every_package(graph):
    # a parser that found nothing would pass every check below
    assert {"cbrules.ir.graph", "cbrules.rewrite.engine", "cbrules.codegen.cuda", "cbrules.reference.interp"} <= set(graph)
    assert "cbrules.ir.order" in graph["cbrules.ir.graph"]
    assert "cbrules.schedule" in graph["cbrules.codegen.cuda"]


def test_no_import_cycles(graph):
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m):] + [m] if m in path else [n, m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m, path + [m])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])


def test_layers_import_only_below(graph):
    wrong = [f"{n} ({_layer(n)}) imports {m} ({_layer(m)})" for n, ms in sorted(graph.items()) for m in sorted(ms)
             if _layer(m) != _layer(n) and _layer(m) not in ALLOWED[_layer(n)]]
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_catches_an_upward_import(graph):
    bad = dict(graph, **{"cbrules.codegen.cuda": graph["cbrules.codegen.cuda"] | {"cbrules.rewrite.engine"}})
    assert [n for n, ms in bad.items() for m in ms if _layer(m) != _layer(n) and _layer(m) not in ALLOWED[_layer(n)]]


def _private_imports(source: str, where: str) -> list[str]:
    """``from M import _name``: a module reaching for another's private name (a name another module needs is
    public, with a docstring)."""
    return [f"{where}:{n.lineno}: from {n.module} import {a.name}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.ImportFrom) and n.module != "__future__"
            for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_module_imports_another_modules_private_name():
    found = [f for name, path in sorted(_modules().items()) for f in _private_imports(path.read_text(), name)]
    assert not found, "\n".join(found)
    assert _private_imports("from .builder_values import (Buffer,\n    _call_site)\n", "x") == \
        ["x:1: from builder_values import _call_site"]  # the scan sees a private name in a wrapped import


def test_every_subpackage_says_what_it_owns():
    for pkg in ("cbrules", "cbrules/ir", "cbrules/rewrite", "cbrules/reference", "cbrules/kernels", "codegen"):
        doc = ast.get_docstring(ast.parse((ROOT / pkg / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"{pkg}/__init__.py needs a docstring saying what it owns"


def _loaded_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.splitlines()[-1]))


HEAVY = ("egglog", "networkx", "numpy", "ml_dtypes", "cuda")


def test_reading_rule_files_loads_no_egglog():
    loaded = _loaded_after("from cbrules.rewrite import rulefile\nrs = rulefile.load(rulefile.rule_dirs([]))\n"
                           "assert rs.rules and rs.egg_forms")
    assert not {m.split(".")[0] for m in loaded} & set(HEAVY)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["kernels"], ["rules", "list"], ["ops"]])
def test_light_commands_load_nothing_heavy(argv):
    code = ("import contextlib, io\nfrom cbrules import cli\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert cli.main({argv!r}) == 0\n")
    heavy = {m.split(".")[0] for m in _loaded_after(code)} & set(HEAVY)
    assert not heavy, f"cbrules {' '.join(argv)} loads {sorted(heavy)}"


def _id_keyed_module_tables(source: str) -> set[str]:
    """Names of module-level dicts that some code indexes (``d[...]``, ``d.get(...)``, ``d.setdefault``)
    with a key built from ``id(...)``: a cache of objects by identity that outlives them."""
    tree = ast.parse(source)
    tables = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        value = getattr(node, "value", None)
        if isinstance(value, ast.Dict) or (isinstance(value, ast.Call) and getattr(value.func, "id", "") == "dict"):
            tables |= {t.id for t in targets if isinstance(t, ast.Name)}

    def uses_id(expr) -> bool:
        return any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "id" for n in ast.walk(expr))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in tables \
                and uses_id(node.slice):
            found.add(node.value.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in tables \
                and node.func.attr in ("get", "setdefault", "pop") and node.args and uses_id(node.args[0]):
            found.add(node.func.value.id)
    return found


def test_no_module_level_cache_is_keyed_by_id():
    """What the engine derives from rule text is kept on the text (cbrules.sexpr.derived), not in
    module tables keyed by id(), which outlive their rules and have to be flushed."""
    offenders = {str(p.relative_to(ROOT)): names for p in sorted([*ROOT.glob("cbrules/**/*.py"), *ROOT.glob("codegen/*.py")])
                 if (names := _id_keyed_module_tables(p.read_text()))}
    assert offenders == {}


def test_the_id_cache_scan_would_see_one():
    assert _id_keyed_module_tables("_C = {}\ndef f(e):\n    return _C.get(id(e))\n") == {"_C"}
    assert _id_keyed_module_tables("_C: dict = {}\ndef f(e):\n    _C[(id(e), 1)] = 2\n") == {"_C"}
    assert _id_keyed_module_tables("def f(e):\n    seen = {}\n    seen[id(e)] = 1\n") == set()  # a local table
