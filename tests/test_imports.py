"""The import contract (pyproject.toml's ``[tool.importlinter]``, docs/architecture.md "Layers and imports"): each
layer of peagle imports only the layers below it, function-level imports included, and no module takes part in an
import cycle. Run here so that ``make test`` (CI) enforces both."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
LINT = ("import sys; from importlinter.cli import lint_imports; "
        "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True, no_logo=True))")


def lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter on the package under ``root`` (run there, so that it is that copy of peagle it reads)."""
    return subprocess.run([sys.executable, "-c", LINT], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


def a_cycle(package: str) -> list[str] | None:
    """One import cycle among ``package``'s modules (the modules in order, the first repeated at the end), or None.
    An import of ``a.b.c`` runs ``a.b``'s ``__init__`` first: counted as an import of that package too, where the
    importer is not already inside it."""
    graph = grimp.build_graph(package, cache_dir=None)
    edges: dict[str, set[str]] = {m: set() for m in graph.modules}
    for m in graph.modules:
        for t in graph.find_modules_directly_imported_by(m):
            parts = t.split(".")
            edges[m] |= {t} | {p for p in (".".join(parts[:i]) for i in range(1, len(parts)))
                                if p in edges and not (m + ".").startswith(p + ".")}
    state: dict[str, int] = {}   # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := walk(t)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(edges):
        if m not in state and (found := walk(m)):
            return found
    return None


def test_the_layers_contract_is_kept():
    r = lint(ROOT)
    assert r.returncode == 0 and "1 kept, 0 broken" in r.stdout, r.stdout + r.stderr


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The contract can fail: a copy of peagle whose models import the engine (one function-level import) is refused,
    the import named."""
    shutil.copytree(ROOT / "peagle", tmp_path / "peagle",
                    ignore=shutil.ignore_patterns("build", "__pycache__", "heads"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    layers = tmp_path / "peagle" / "models" / "layers.py"
    layers.write_text(layers.read_text() + "\n\ndef upward():\n    from peagle.engine import config\n")
    r = lint(tmp_path)
    assert r.returncode == 1 and "peagle.models is not allowed to import peagle.engine" in r.stdout, r.stdout + r.stderr
    assert "peagle.models.layers -> peagle.engine.config" in r.stdout


def test_no_module_takes_part_in_an_import_cycle():
    assert a_cycle("peagle") is None, " -> ".join(a_cycle("peagle"))


def test_a_command_imports_no_server_or_benchmark_it_does_not_run():
    """``peagle generate`` (and every command but serve and bench) builds a parser without the server's and the
    benchmarks' arguments, whose modules import FastAPI and uvicorn (~0.4 s of each start); serve's and bench's
    parsers still have them. Building every command's arguments again fails it."""
    import subprocess
    import sys

    code = ("import sys; from peagle.cli import build_parser; p = build_parser(sys.argv[1]); "
            "print(sorted(m for m in ('fastapi', 'uvicorn', 'peagle.bench.serve') if m in sys.modules))")
    run = lambda cmd: subprocess.run([sys.executable, "-c", code, cmd], capture_output=True, text=True,  # noqa: E731
                                     check=True).stdout.strip()
    assert run("generate") == "[]"
    assert run("bench") == "['fastapi', 'peagle.bench.serve', 'uvicorn']"
