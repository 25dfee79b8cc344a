"""The CPU thread pool's size: what the process may run on, not the machine's core count."""
from __future__ import annotations

import os

import pytest

from peagle import cpu


@pytest.fixture
def no_thread_env(monkeypatch):
    for name in ("PEAGLE_TORCH_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_threads_follow_the_affinity_not_the_core_count(no_thread_env):
    no_thread_env.setattr(os, "cpu_count", lambda: 64)
    no_thread_env.setattr(os, "sched_getaffinity", lambda pid: {3})   # taskset -c 3
    assert cpu.cpu_threads() == 1
    no_thread_env.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert cpu.cpu_threads() == 3


def test_thread_variables_win_in_order(no_thread_env):
    no_thread_env.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    no_thread_env.setenv("OMP_NUM_THREADS", "2")
    assert cpu.cpu_threads() == 2
    no_thread_env.setenv("PEAGLE_TORCH_THREADS", "1")
    assert cpu.cpu_threads() == 1
    no_thread_env.setenv("PEAGLE_TORCH_THREADS", "")   # unset or not a count: the next source
    no_thread_env.setenv("OMP_NUM_THREADS", "2,1")     # OpenMP's nested form: not ours to read
    assert cpu.cpu_threads() == 4
