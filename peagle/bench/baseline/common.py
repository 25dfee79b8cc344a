"""What the baseline's sections share: logging, medians, the tables' number format, the contexts the
micro-benchmarks run at, and their interleaved timing rounds."""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

from peagle.bench.machine import OtherLoad, wait_for_idle
from peagle.bench.peers import Peer
from peagle.cpu import configure_cpu


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=1):
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return f"{x:.{nd}f}"


def settle(args) -> None:
    """Pause before switching peers, which size their thread pools differently: a pool spins for a
    while after its last job, and spinning threads on 2 cores slow the next run down badly."""
    if args.settle > 0:
        time.sleep(args.settle)


def build_context(prompts_ids: list[list[int]], outputs: list[list[int]], length: int) -> list[int]:
    """``length`` real tokens: the prompts and their greedy continuations, repeated as needed."""
    pool = [t for ids, out in zip(prompts_ids, outputs) for t in ids + out]
    return (pool * (length // len(pool) + 1))[:length]


Timer = tuple[Peer, Callable[[int], float]]   # the peer timed (its pool set up first), and its timing at a size


def timed_rounds(args, bar, sizes: list[int], timers: dict[str, Timer]) -> tuple[dict, float]:
    """Warm-up then ``micro_reps`` rounds; each round times every timer at every size, in order;
    before each switch of peer (and at a round's start) a pause, then that peer sets up its pool.
    Returns (times by timer and size, the cores other jobs kept busy during the first timer, median)."""
    times, loads = {name: {n: [] for n in sizes} for name in timers}, []
    wait_for_idle(args.wait_idle, bar)
    for rep in range(args.micro_warmup + args.micro_reps):
        last = None
        for i, (name, (peer, timer)) in enumerate(timers.items()):
            if peer is not last:
                settle(args)
                peer.prepare()
                last = peer
            with OtherLoad() as ol:
                for n in sizes:
                    t = timer(n)
                    if rep >= args.micro_warmup:
                        times[name][n].append(t)
            if i == 0:
                loads.append(ol.cores)
        bar.update(1)
    configure_cpu()
    return times, median(loads)
