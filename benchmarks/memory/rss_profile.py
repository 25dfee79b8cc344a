"""Where a peagle command's resident memory goes: runs ``peagle <args>`` in this process while a thread
samples VmRSS every few milliseconds with the main thread's innermost peagle frame, then prints the
largest RSS seen under each frame, in order (the peak's frame marked), and VmHWM.

    python benchmarks/memory/rss_profile.py generate --target gemma3 --method none ...
"""
from __future__ import annotations

import functools
import importlib
import sys
import threading
import time

# stages printed as they end: (module, class or None, function)
STAGES = [("peagle.models.loader", None, "load_tokenizer"), ("peagle.models.loader", None, "load_target"),
          ("peagle.models.loader", None, "load_drafter_for"), ("peagle.engine.model_runner", "ModelRunner", "__init__"),
          ("peagle.engine.llm_engine", "LLMEngine", "__init__"), ("peagle.engine.llm_engine", "LLMEngine", "generate")]


def status(key: str) -> int:
    """A /proc/self/status field in MB (kB / 1000, as /usr/bin/time's figures are quoted here)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) // 1000
    return 0


def where(frame) -> str:
    """The innermost frame in peagle (or the outermost one if none), as module:function:line."""
    best = None
    while frame is not None:
        if "/peagle/" in frame.f_code.co_filename and "rss_profile" not in frame.f_code.co_filename:
            best = frame
            break
        frame = frame.f_back
    if best is None:
        return "(outside peagle)"
    mod = best.f_code.co_filename.split("/peagle/", 1)[1]
    return f"{mod}:{best.f_code.co_name}:{best.f_lineno}"


def wrap_stages() -> None:
    """Print VmRSS and VmHWM when each stage returns."""
    for mod, cls, fn in STAGES:
        owner = importlib.import_module(mod)
        owner = getattr(owner, cls) if cls else owner
        orig = getattr(owner, fn)

        @functools.wraps(orig)
        def staged(*a, __orig=orig, __name=f"{cls + '.' if cls else ''}{fn}", **k):
            out = __orig(*a, **k)
            print(f"# stage {__name:28s} done: VmRSS {status('VmRSS'):5d} MB, VmHWM {status('VmHWM'):5d} MB",
                  file=sys.stderr)
            return out
        setattr(owner, fn, staged)


def main() -> None:
    samples: list[tuple[float, int, str]] = []
    main_id = threading.get_ident()
    done = threading.Event()
    t0 = time.perf_counter()

    def sample() -> None:
        while not done.is_set():
            frame = sys._current_frames().get(main_id)
            samples.append((time.perf_counter() - t0, status("VmRSS"), where(frame)))
            time.sleep(0.002)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    from peagle.cli import main as cli

    wrap_stages()

    sys.argv = ["peagle", *sys.argv[1:]]
    try:
        cli()
    except SystemExit:
        pass
    finally:
        done.set()
        th.join()
        peak: dict[str, tuple[float, int]] = {}
        for t, rss, w in samples:
            if w not in peak or rss > peak[w][1]:
                peak[w] = (peak.get(w, (t, 0))[0], rss)
        top = max(samples, key=lambda s: s[1])
        print(f"\n# largest VmRSS under each frame (first seen at, s): peak {top[1]} MB at {top[0]:.2f} s in "
              f"{top[2]}; VmHWM {status('VmHWM')} MB; at the end RssAnon {status('RssAnon')} MB, RssFile "
              f"{status('RssFile')} MB", file=sys.stderr)
        for w, (t, rss) in sorted(peak.items(), key=lambda kv: kv[1][0]):
            print(f"{t:7.2f} {rss:6d} MB  {w}{'   <- peak' if w == top[2] else ''}", file=sys.stderr)


if __name__ == "__main__":
    main()
