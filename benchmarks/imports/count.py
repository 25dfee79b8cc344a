"""The import figures of docs/architecture.md ("Layers and imports"): function-level import statements (an ``ast``
walk: an import inside a function body; ``from __future__`` left out), how many import a peagle module, and the
import cycles among peagle's modules (strongly connected groups and simple cycles, networkx), counting module-level
imports alone and then function-level ones too; an import of ``a.b.c`` counts as one of the package ``a.b``
too (its ``__init__`` runs first). ``TYPE_CHECKING`` imports are left out.

    python benchmarks/imports/count.py [ROOT]      # ROOT: a checkout (default: this one)
"""
from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

import networkx as nx


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for f in (root / "peagle").rglob("*.py"):
        if "build" in f.relative_to(root).parts:
            continue
        name = ".".join(f.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        out[name] = f
    return out


def graphs(root: Path) -> tuple[nx.DiGraph, nx.DiGraph, list[tuple[str, int, str]]]:
    """(module-level imports, all imports, the function-level import statements as (module, line, text))."""
    mods = modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    top, every, inner = nx.DiGraph(), nx.DiGraph(), []
    for m, f in mods.items():
        tree = ast.parse(f.read_text())
        top.add_node(m)
        every.add_node(m)
        parent = {c: p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "module", None) == "__future__":
                continue
            p, in_function, type_checking = parent.get(node), False, False
            while p is not None:
                in_function |= isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef))
                type_checking |= isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test)
                p = parent.get(p)
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = m.split(".")[:len(m.split(".")) - node.level + (f.name == "__init__.py")]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            if in_function:
                inner.append((m, node.lineno, ast.unparse(node)))
            for t in targets:
                r = resolve(t) if t.startswith("peagle") else None
                if not r or r == m or type_checking:
                    continue
                for c in [r] + [".".join(r.split(".")[:i]) for i in range(1, r.count(".") + 1)]:
                    if c in mods and c != m:
                        every.add_edge(m, c)
                        if not in_function:
                            top.add_edge(m, c)
    return top, every, inner


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    top, every, inner = graphs(root)
    own = [i for i in inner if i[2].split()[1].startswith("peagle")]
    print(f"function-level imports: {len(inner)}; of peagle modules: {len(own)}, outside cli.py and bench/: "
          f"{sum(not m.startswith(('peagle.cli', 'peagle.bench')) for m, _, _ in own)}")
    for label, g in (("module-level imports", top), ("function-level imports too", every)):
        groups = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
        simple = sum(1 for _ in itertools.islice(nx.simple_cycles(g), 100_000))
        print(f"cycles, {label}: {len(groups)} groups, {simple} simple cycles")
        for c in groups:
            print("   ", ", ".join(c))


if __name__ == "__main__":
    main()
