"""The response table's drafts replayed without timing noise (as benchmarks/lookup/replay.py does for prompt
lookup): the greedy outputs of plain decoding of the shipped GGUF on the 12 held-out prompts and MT-Bench's 80
first turns (128 tokens), stepped through as a lone request under `auto` steps where the head's drafting is
skipped (prompt lookup by the match; where it finds nothing, the table's proposal: that script's replay with
the table), each step priced by the rows
it verifies on a Zen 4's in-pass cost curve (1 row 1.00, 2 1.085, 3 1.17, 4 1.25, then +0.085 a row) plus 0.03 of
a step's host work where it verifies drafts. Prints: the table's size and the replayed speed against plain decoding
(mean over prompts, worst prompt) by the table's settings, and how often the table's first draft was the target's
token by the share the table gives it (its calibration).

    python benchmarks/responses/replay.py [OUTPUTS_DIR]   # outputs generated there once (default /tmp/peagle-replay)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lookup"))
from replay import HELDOUT, outputs, replay  # noqa: E402

from peagle.engine.lookup import ResponseLookup  # noqa: E402
from peagle.train.synth import response_token_ids  # noqa: E402

COST = {1: 1.0, 2: 1.085, 3: 1.17, 4: 1.25, 5: 1.34, 6: 1.42, 7: 1.5, 8: 1.6}
HOST = 0.03
ROOT = Path(__file__).resolve().parents[2]
MTBENCH = ROOT / "peagle" / "bench" / "data" / "mt_bench" / "question.jsonl"


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/peagle-replay")
    root.mkdir(parents=True, exist_ok=True)
    sets = {"held-out (12)": outputs(root / "heldout.jsonl", [json.loads(x)["prompt"] for x in
                                                              HELDOUT.read_text().splitlines()], 128),
            "MT-Bench (80)": outputs(root / "mtbench.jsonl", [json.loads(x)["turns"][0] for x in open(MTBENCH)], 128)}
    responses = response_token_ids(ROOT / "data" / "synth" / "smollm2-135m-instruct")

    def row(name, table, most=2, chance=0.3):
        cells = []
        for recs in sets.values():
            r = [replay(rec, True, 7, True, None if table is None else (table, most, chance), COST, HOST) for rec in recs]
            cells.append(f"{sum(r) / len(r):.3f} (worst {min(r):.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |")

    print("| table, drafts, least chance | " + " | ".join(sets) + " |\n|---|---|---|")
    row("prompt lookup alone", None)
    for min_count in (2, 3, 5):
        table = ResponseLookup.build(responses, 49152, min_count)
        print(f"| min_count {min_count}: {sum(map(len, table.keys))} contexts | | |")
        for most in (1, 2, 3, 4):
            for chance in (0.15, 0.3, 0.5):
                row(f"min_count {min_count}, {most}, {chance}", table, most, chance)
    table = ResponseLookup.build(responses, 49152)
    bins = {}
    for recs in sets.values():
        for rec in recs:
            out = rec["out"]
            for i in range(1, len(out)):
                hit = table.follower(list(rec["prompt"]) + out[:i])
                if hit is not None:
                    b = bins.setdefault(min(int(hit[1] * 10), 9), [0, 0])
                    b[0] += 1
                    b[1] += hit[0] == out[i]
    print("\n| the table's share | first drafts | the target's token |\n|---|---|---|")
    for b, (n, hits) in sorted(bins.items()):
        print(f"| {b / 10:.1f}-{(b + 1) / 10:.1f} | {n} | {hits / n:.3f} |")


if __name__ == "__main__":
    main()
