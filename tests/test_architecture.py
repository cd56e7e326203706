"""The package's shape: no import cycle (imports inside functions included), the boundaries between
stages, and code a reader can hold in their head (short functions, lines that fit a screen)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mha_export"
MAX_FUNCTION_LINES = 60
MAX_COLUMNS = 100


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, top_level: bool = False) -> set[str]:
    """Every mha_export module this file imports, at any depth (function bodies too), or only
    at import time (``top_level``: module body, no function or class bodies)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    for node in (tree.body if top_level else ast.walk(tree)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("mha_export"):
                found.add(target)
                for alias in node.names:  # "from . import forms" names a module
                    if (PACKAGE.parent / f"{target}.{alias.name}".replace(".", "/")).with_suffix(
                            ".py").exists() or (PACKAGE.parent / f"{target}.{alias.name}".replace(
                            ".", "/")).is_dir():
                        found.add(f"{target}.{alias.name}")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("mha_export")}
    return found - {name}


def _graph(top_level: bool = False) -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = set()
        if top_level and "." in name:  # importing a module first imports its package
            deps.add(name.rsplit(".", 1)[0])
        for target in _imports(path, top_level):
            while target not in files and "." in target:  # mha_export.forms.base.X -> module
                target = target.rsplit(".", 1)[0]
            if target in files and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        stack.pop()
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_no_import_cycles():
    graph = _graph()
    graph = {n: {d for d in deps if not (n == "mha_export" or d == "mha_export")}
             for n, deps in graph.items()}  # the package's lazy __init__ only re-exports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every package module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_the_check_never_imports_export_code():
    graph = _graph()
    for name in graph:
        if name.startswith("mha_export.check"):
            assert not {d for d in _reaches(graph, name) if d.startswith("mha_export.export")}, name


def test_onnx_runtime_runners_never_import_torch():
    """Statically (no package module they load at import time imports torch) and in a fresh
    process, as the bench worker imports them (the registry opens runners lazily)."""
    graph = _graph(top_level=True)
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for start in ("mha_export.check.runners", "mha_export.check.runners.ort",
                  "mha_export.bench.worker"):
        for name in {start} | _reaches(graph, start):
            tree = ast.parse(files[name].read_text())
            top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
            names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | {
                n.module for n in top if isinstance(n, ast.ImportFrom) and n.module}
            assert not any(m == "torch" or m.startswith("torch.") for m in names), (start, name)
    code = ("import sys, mha_export.check.runners.ort, mha_export.bench.worker as w; "
            "from mha_export.check.runners import RUNNERS; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_cycle_test_sees_a_planted_cycle(tmp_path, monkeypatch):
    """The boundary tests read the real import graph: a planted import shows up in it."""
    graph = _graph()
    assert "mha_export.layer.layouts" in graph["mha_export.comparison.torch_runners"]
    assert "mha_export.export.pipeline" in _reaches(graph, "mha_export.cli.commands")


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_functions_are_short_and_lines_fit():
    long_functions, wide_lines = {}, []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for fn in _functions(ast.parse(text)):
            n = fn.end_lineno - fn.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long_functions[f"{path.name}:{fn.name}"] = n
        wide_lines += [f"{path.name}:{i}" for i, line in enumerate(text.splitlines(), 1)
                       if len(line) > MAX_COLUMNS]
    assert not long_functions, long_functions
    assert not wide_lines, wide_lines


def test_each_kind_and_lossy_step_lives_in_its_own_folder():
    """Outside its home, Multi-head Latent Attention is named in a handful of modules (the config
    section, the registry, its checkpoint families), and each lossy step in at most ten (issue
    33): a stage that starts to branch on one shows up here, and in docs/architecture.md."""
    from structure import CONCEPTS, LIMITS, naming
    for concept in CONCEPTS:
        assert len(naming(concept)) <= LIMITS[concept], (concept, naming(concept))


def test_an_export_target_lives_in_its_own_package():
    """ExecuTorch and AOTInductor, outside the files whose path names them (their packages,
    their runners), are named in at most three package files each (issue 65: ExecuTorch was
    named in 12, AOTInductor in 9)."""
    from structure import TARGET_LIMIT, target_naming
    for target in ("executorch", "aoti"):
        assert len(target_naming(target)) <= TARGET_LIMIT, (target, target_naming(target))


def test_the_naming_count_sees_a_planted_mention(tmp_path, monkeypatch):
    import structure
    planted = tmp_path / "mha_export"
    (planted / "check").mkdir(parents=True)
    (planted / "check" / "x.py").write_text('"""latent in a docstring is no mention."""\n')
    (planted / "check" / "y.py").write_text("def f(c):\n    return c.latent is None\n")
    monkeypatch.setattr(structure, "PACKAGE", planted)
    assert structure.naming("Multi-head Latent Attention") == ["check/y.py"]
