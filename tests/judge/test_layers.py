"""The house rules on imports, checked on the source tree (see docs/architecture.md):

* ``probes/read/`` reads: it imports no judging, bundling, view or scheduling module;
* ``probes/judge/`` is pure: it imports nothing that reads, and does no I/O itself;
* ``tui/`` sees the probes only through their public API, the package ``trainwatch.probes``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"probes": "trainwatch.probes", "tui": "trainwatch.tui"}

# What each layer must not import (dotted prefixes of trainwatch modules).
READ_MUST_NOT = ("trainwatch.probes.judge", "trainwatch.probes.evidence", "trainwatch.tui",
                 "trainwatch.probes.remote", "trainwatch.probes.live", "trainwatch.probes.source",
                 "trainwatch.probes.sampling", "trainwatch.probes.local_evidence")
JUDGE_MUST_NOT = ("trainwatch.probes.read", "trainwatch.probes.evidence", "trainwatch.tui",
                  "trainwatch.probes.remote", "trainwatch.probes.live", "trainwatch.probes.source",
                  "trainwatch.probes.rundir", "trainwatch.probes.hook")
# Modules whose use is I/O, and calls that are I/O wherever they come from.
IO_MODULES = {"os", "subprocess", "socket", "psutil", "shutil", "tempfile", "linecache", "signal", "select",
              "urllib", "http", "requests", "glob", "io", "pathlib", "fcntl", "threading", "pynvml"}
IO_CALLS = {"open", "input", "print"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "unlink", "mkdir", "rglob",
              "glob", "stat", "exists", "is_file", "is_dir"}
CLOCK = {("time", "sleep"), ("time", "time"), ("time", "monotonic")}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[parts[0]].rsplit(".", 1)[0], *parts]) if parts else ""


def imports(path: Path) -> list[tuple[str, int]]:
    """(absolute module imported, line) for every import in ``path``, relative ones resolved;
    ``from . import x`` names ``package.x``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((module, node.lineno))
            found += [(f"{module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


@pytest.mark.parametrize("path", sources("probes/read"), ids=_ids(sources("probes/read")))
def test_read_imports_no_judge_evidence_or_views(path):
    bad = [f"{path.name}:{line} {module}" for module, line in imports(path) if _under(module, READ_MUST_NOT)]
    assert not bad


@pytest.mark.parametrize("path", sources("probes/judge"), ids=_ids(sources("probes/judge")))
def test_judge_imports_nothing_that_reads(path):
    bad = [f"{path.name}:{line} {module}" for module, line in imports(path) if _under(module, JUDGE_MUST_NOT)]
    bad += [f"{path.name}:{line} {module}" for module, line in imports(path)
            if module.split(".")[0] in IO_MODULES]
    assert not bad


def io_calls(tree: ast.AST) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in IO_CALLS:
            found.append((func.id, node.lineno))
        elif isinstance(func, ast.Attribute):
            owner = ast.unparse(func.value)
            if func.attr in IO_METHODS or (owner, func.attr) in CLOCK or owner in IO_MODULES:
                found.append((ast.unparse(func), node.lineno))
    return found


@pytest.mark.parametrize("path", sources("probes/judge"), ids=_ids(sources("probes/judge")))
def test_judge_does_no_io(path):
    bad = [f"{path.name}:{line} {call}" for call, line in io_calls(ast.parse(path.read_text()))]
    assert not bad


def probe_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of each import in ``path`` that reaches into ``trainwatch.probes``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [alias.name for alias in node.names]
            module = dict(imports_of_node(path, node)).get("module", "")
        elif isinstance(node, ast.Import):
            names, module = [], next((a.name for a in node.names if a.name.startswith("trainwatch.probes")), "")
        else:
            continue
        if _under(module, ("trainwatch.probes",)):
            found.append((module, names, node.lineno))
    return found


def imports_of_node(path: Path, node: ast.ImportFrom) -> list[tuple[str, str]]:
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    base = package.split(".")
    module = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else [])) if node.level \
        else node.module or ""
    return [("module", module)]


@pytest.mark.parametrize("path", sources("tui"), ids=_ids(sources("tui")))
def test_views_use_only_the_public_api(path):
    import trainwatch.probes as api
    bad = [f"{path.name}:{line} {module} {names}" for module, names, line in probe_imports(path)
           if module != "trainwatch.probes" or not set(names) <= set(api.__all__)]
    assert not bad


def test_the_checks_see_real_imports():
    """The scans resolve relative imports and see I/O calls: known cases of each are found."""
    assert "trainwatch.probes.snapshot" in {m for m, _ in imports(ROOT / "probes/judge/judgement.py")}
    assert "trainwatch.probes.read.processes.procfs" in {m for m, _ in imports(ROOT / "probes/live.py")}
    assert io_calls(ast.parse("open('x')\ntime.sleep(1)\nPath('a').read_text()\nos.listdir('.')")) == [
        ("open", 1), ("time.sleep", 2), ("Path('a').read_text", 3), ("os.listdir", 4)]
    assert [m for m, _, _ in probe_imports(ROOT / "tui/app.py")] and module_name(ROOT / "tui/app.py") == "trainwatch.tui.app"


def test_every_package_folder_is_installed():
    """pyproject.toml lists the packages by hand (the card's folders map onto trainwatch.*): a folder
    left out installs without its modules, which only a fresh install shows."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {module_name(init) for top in PACKAGES for init in (ROOT / top).rglob("__init__.py")
               if "armed" not in init.parts and "__pycache__" not in init.parts}
    assert folders == listed, (sorted(folders - listed), sorted(listed - folders))
    for package in listed:
        assert (ROOT / config["package-dir"][package]).is_dir(), package
