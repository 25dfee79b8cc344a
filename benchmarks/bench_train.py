"""Training tokens/s by head depth, float32 against bf16 autocast, measured in one process.

Steps of the two dtypes alternate (A B A B ...) on the same documents, so a shared machine's
changing load hits both alike; prints the median tokens/s of each and their ratio. Usage:

    PEAGLE_TORCH_THREADS=2 python benchmarks/bench_train.py DATA HIDDEN [--layers 1 2 4] [--steps 8]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from peagle.train.trainer import Trainer, TrainConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("hidden")
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=8, help="timed steps per dtype (after one warm-up step)")
    ap.add_argument("--batch-size", type=int, default=4)
    args = ap.parse_args()
    print("| layers | float32 tokens/s | bf16 autocast tokens/s | bf16 / float32 |\n|---|---|---|---|")
    for layers in args.layers:
        trainers = {d: Trainer(TrainConfig(data=args.data, hidden=args.hidden, out=tempfile.mkdtemp(), layers=layers,
                                           dtype=d, device="cpu", batch_size=args.batch_size, eval_fraction=0.0,
                                           progress=False))
                    for d in ("float32", "bfloat16")}
        rates = {d: [] for d in trainers}
        for i in range(args.steps + 1):
            for d, tr in trainers.items():
                t0, before = time.perf_counter(), tr.tokens
                tr.train_step()
                if i:
                    rates[d].append((tr.tokens - before) / (time.perf_counter() - t0))
        f32, bf16 = (statistics.median(rates[d]) for d in trainers)
        print(f"| {layers} | {f32:.0f} | {bf16:.0f} | {bf16 / f32:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
