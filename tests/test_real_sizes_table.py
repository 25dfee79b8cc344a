"""The real-size benchmark's table in docs/real-sizes.md is the one its script prints from the run's raw results,
so the docs cannot drift from the raw files they cite (benchmarks/real_sizes/bench.py's ``table``)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_table_is_the_one_bench_prints_from_its_results():
    sys.path.insert(0, str(ROOT / "benchmarks" / "real_sizes"))
    try:
        import bench
    finally:
        sys.path.pop(0)
    results = json.loads((ROOT / "docs/results/real-sizes/spr-2026-12-02/bench/results.json").read_text())
    table = bench.table(results)
    assert table.count("\n") == len(results) + 1 and "| llama-3.2-3b-Q4_0 t2 | **2.53x** (2.48-2.53) |" in table
    assert table in (ROOT / "docs" / "real-sizes.md").read_text()
