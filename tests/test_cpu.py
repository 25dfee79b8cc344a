"""The CPU thread pool's size: what the process may run on, not the machine's core count."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from peagle import cpu
from peagle.models import loader


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


def test_every_vml_operator_is_settled_on_one_element_before_threads_share_it(monkeypatch, tiny_chat_dir):
    """oneMKL chooses a VML function's kernel on its first call, and a first call several threads make at once can
    run one thread's chunk in a low-accuracy kernel (pytorch/pytorch#188792: a RoPE table's cos, and a process's
    tokens, here). ``settle_vml`` calls every operator the installed ATen hands to VML (its header's
    IMPLEMENT_VML_MKL lines) on one element, in float32 and float64; ``configure_cpu`` and ``load_target`` on the
    CPU call it. Leaving an operator out of VML_OPS, or the call out of either, fails this."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "cpu" / "vml.h"
    if not header.exists():
        pytest.skip(f"this torch ships no {header}")
    assert set(re.findall(r"^IMPLEMENT_VML_MKL\((\w+),", header.read_text(), re.M)) <= set(cpu.VML_OPS)
    calls = []
    for op in cpu.VML_OPS:
        monkeypatch.setattr(torch, op, lambda x, real=getattr(torch, op), op=op:
                            calls.append((op, x.dtype, x.numel())) or real(x))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)   # the suite's one thread stays
    cpu.settle_vml.cache_clear()
    cpu.configure_cpu()
    assert sorted(calls, key=str) == sorted(((op, dt, 1) for op in cpu.VML_OPS for dt in (torch.float32, torch.float64)),
                                            key=str)
    calls.clear()
    cpu.configure_cpu()
    assert calls == []   # once a process
    settled = []
    monkeypatch.setattr(loader, "settle_vml", lambda: settled.append(1))
    loader.load_target(tiny_chat_dir, device="cpu")
    assert settled == [1]
