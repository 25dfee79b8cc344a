"""The machine a benchmark shares with other jobs: its CPU's name, torch's default thread pool, and how
busy other processes keep it (benchmarks wait for quiet, and report the load they ran under)."""
from __future__ import annotations

import os
import platform
import time

import torch

from peagle.cpu import cpuinfo

# torch's default pool size, read before anything (the engine) changes it: HF runs with this.
DEFAULT_TORCH_THREADS = torch.get_num_threads()


def cpu_name() -> str:
    return cpuinfo("model name") or platform.processor() or "unknown"


def _busy_cpu_s() -> float | None:
    """CPU seconds all processes have spent busy since boot (``/proc/stat``), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class OtherLoad:
    """Average number of cores other processes kept busy during a ``with`` block (None if unknown)."""

    def __enter__(self):
        self.w, self.p, self.b = time.perf_counter(), time.process_time(), _busy_cpu_s()
        self.cores = None
        return self

    def __exit__(self, *exc):
        b = _busy_cpu_s()
        wall = time.perf_counter() - self.w
        if b is not None and self.b is not None and wall > 0:
            self.cores = max(0.0, (b - self.b) - (time.process_time() - self.p)) / wall
        return False


def wait_for_idle(max_wait_s: float, bar=None, threshold: float = 0.25) -> float | None:
    """Wait (at most ``max_wait_s``) until other processes use less than ``threshold`` cores over
    one second; returns the last reading. The machine is shared: this only lowers the odds of
    measuring during someone else's burst."""
    if max_wait_s <= 0:
        return None
    deadline = time.perf_counter() + max_wait_s
    last = None
    while True:
        with OtherLoad() as ol:
            time.sleep(1.0)
        last = ol.cores
        if last is None or last < threshold or time.perf_counter() >= deadline:
            return last
        if bar is not None:
            bar.set_postfix_str(f"waiting for other jobs ({last:.1f} cores busy)")
