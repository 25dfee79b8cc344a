"""A synthesis folder's token ids in a few megabytes, for a lent GPU's 64 MiB calls: ``pack`` keeps each
document's id, prompt and response token ids (uint16, xz; the text is not needed to train), ``unpack`` writes
them back as one ``responses-00000.jsonl`` in the same order (``--first N``: the first N documents)."""
import argparse
import json
import lzma
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def pack(src: str, dst: str) -> None:
    from peagle.train.synth import read_responses
    recs = list(read_responses(src))
    ids = [r["id"] for r in recs]
    lens = np.array([[len(r["prompt_token_ids"]), len(r["response_token_ids"])] for r in recs], np.int32)
    toks = np.concatenate([np.array(r["prompt_token_ids"] + r["response_token_ids"], np.uint16) for r in recs])
    head = json.dumps({"ids": ids, "lens": lens.tolist()}).encode()
    with lzma.open(dst, "wb", preset=9 | lzma.PRESET_EXTREME) as f:
        f.write(len(head).to_bytes(8, "little") + head + toks.tobytes())
    print(f"{dst}: {len(recs)} documents, {toks.size} tokens, {Path(dst).stat().st_size} bytes")


def unpack(src: str, dst: str, first: int | None) -> None:
    raw = lzma.open(src).read()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    toks = np.frombuffer(raw[8 + n:], np.uint16).tolist()
    Path(dst).mkdir(parents=True, exist_ok=True)
    at = 0
    with open(Path(dst) / "responses-00000.jsonl", "w") as f:
        for i, (rid, (p, r)) in enumerate(zip(head["ids"], head["lens"])):
            if first is not None and i == first:
                break
            f.write(json.dumps({"id": rid, "source": rid.split(":")[0], "prompt": "", "response": "",
                                "prompt_token_ids": toks[at:at + p], "response_token_ids": toks[at + p:at + p + r]})
                    + "\n")
            at += p + r


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=["pack", "unpack"])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--first", type=int)
    a = ap.parse_args()
    pack(a.src, a.dst) if a.op == "pack" else unpack(a.src, a.dst, a.first)
