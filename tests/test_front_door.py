"""The front door: what README.md tells a newcomer to run works from a clean clone with nothing beside it.

The repository is cloned (``git clone`` of HEAD) into an empty temporary folder. There the quick start's
``peagle generate`` commands run as written (fewer tokens), under an audit hook that records every file Python
opens, so reading anything outside the clone, the interpreter's own files and the caches fails the test. Every
other ``peagle`` command the README shows is parsed by the CLI (a flag renamed or removed fails it), the two
``make`` commands are checked in dry run, and the docs pages the README links exist."""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from peagle.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
# a newcomer's limits on the page itself: short, no section pointers into a notebook
MAX_LINES, MAX_BYTES = 400, 40_000

# Runs a README command under an audit hook: every path opened must be inside the clone, the interpreter's
# installation (stdlib, site-packages: the default model's wheel among them), the cache, or the kernel's files.
AUDITED = r"""
import os, sys, runpy
allowed = [os.path.realpath(p) for p in sys.argv[1].split(os.pathsep)]
outside = []
def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        p = os.path.realpath(os.fsdecode(args[0]))
        if not any(p == a or p.startswith(a + os.sep) for a in allowed):
            outside.append(p)
sys.addaudithook(hook)
sys.argv = ["peagle", *sys.argv[2:]]
try:
    runpy.run_module("peagle.cli", run_name="__main__")
finally:
    if outside:
        print("OUTSIDE " + "\n".join(sorted(set(outside))), file=sys.stderr)
"""


def readme_commands(text: str = README) -> list[list[str]]:
    """Every ``peagle`` command line in ``text``'s bash blocks (``torchrun ... -m peagle.cli`` ones too),
    continuation lines joined and the shell variables it sets (``P=``, ``T=``) substituted."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        env: dict[str, str] = {}
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ")[0].strip()
            for name, value in re.findall(r"(?:^|;\s*)([A-Z]+)=([^\s;]+)", line):
                env[name] = value
            line = re.sub(r"\$([A-Z]+)", lambda m: env.get(m.group(1), m.group(0)), line)
            words = shlex.split(line) if line else []
            if words and words[0] == "torchrun" and "peagle.cli" in words:  # torchrun [its flags] -m peagle.cli ...
                words = ["peagle", *words[words.index("peagle.cli") + 1:]]
            if words and words[0].endswith("peagle") and len(words) > 1:
                commands.append(words[1:])
    return commands


def test_readme_is_a_front_page():
    assert README.count("\n") <= MAX_LINES and len(README.encode()) <= MAX_BYTES
    assert "§" not in README and "BENCHMARKS.md" not in README
    for word in ("lent", "lease", "session", "earlier weeks"):
        assert not re.search(rf"\b{word}\b", README, re.I), word
    for link in re.findall(r"\]\(((?:docs/)?[\w./-]+\.md)\)", README):
        assert (ROOT / link).is_file() or link in OTHERS, link


# pages other docs link that their own authors write (not this test's business if missing in a checkout)
OTHERS = {"docs/real-sizes.md", "docs/speculators.md", "docs/training-memory.md"}


def test_every_readme_command_parses():
    """A flag the README shows that the CLI no longer takes fails here, naming the command."""
    commands = readme_commands()
    assert {c[0] for c in commands} >= {"generate", "serve", "synth", "hidden", "train", "export", "index-responses",
                                         "bench"}
    for argv in commands:
        try:
            build_parser().parse_args(argv)
        except SystemExit:
            pytest.fail(f"the README's `peagle {shlex.join(argv)}` does not parse")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    home = tmp_path_factory.mktemp("clean")
    dest = home / "peagle"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "--quiet", head.stdout.strip()], check=True)
    assert [p.name for p in home.iterdir()] == ["peagle"]  # nothing beside the clone
    build = ROOT / "peagle" / "kernels" / "build"
    if build.is_dir():  # the kernels a user builds with `make setup` (ignored by git): this checkout's, if current
        shutil.copytree(build, dest / "peagle" / "kernels" / "build")
    return dest


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_targets_install_what_they_say(clone):
    demo = subprocess.run(["make", "-n", "-C", str(clone), "demo", "PYTHON=python3"], capture_output=True, text=True)
    test = subprocess.run(["make", "-n", "-C", str(clone), "test", "PYTHON=python3"], capture_output=True, text=True)
    assert demo.returncode == 0 and test.returncode == 0, demo.stderr + test.stderr
    assert "peagle generate" in demo.stdout and ".[gguf]" in demo.stdout and "dev]" not in demo.stdout
    assert re.search(r"\.\[gguf,dev[,\]]", test.stdout) and "pytest" in test.stdout
    assert "make test" in (clone / ".ci" / "run").read_text()


@pytest.mark.slow
def test_quick_start_runs_in_a_clean_clone(clone, tmp_path):
    """The quick start's three `peagle generate` commands, as written but for fewer tokens, in the clone: they
    run, speculation gives plain decoding's text, and nothing outside the clone is read."""
    runs = readme_commands(README[README.index("## Quick start"):README.index("## Your own model")])
    assert [c[0] for c in runs] == ["generate"] * 3, runs
    cache, scratch = tmp_path / "cache", tmp_path / "scratch"   # the caches, and the temporary files libraries make
    scratch.mkdir()
    allowed = [str(clone), sys.prefix, sys.base_prefix, sysconfig.get_paths()["stdlib"], str(cache), str(scratch),
               "/proc", "/sys", "/dev", "/etc", "/usr/share/zoneinfo", str(Path.home() / ".cache" / "huggingface")]
    env = {**os.environ, "PEAGLE_CACHE": str(cache), "TMPDIR": str(scratch), "HF_HUB_OFFLINE": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PEAGLE_PACKED_CACHE", None)  # the suite's own folder for them (conftest): a user's go in PEAGLE_CACHE
    env.pop("PYTHONPATH", None)
    texts = []
    for argv in runs:
        argv = [*argv[:-1], "--max-new-tokens", "8", *([] if "--json" in argv else ["--json"]), argv[-1]]
        r = subprocess.run([sys.executable, "-c", AUDITED, os.pathsep.join(allowed), *argv], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "OUTSIDE" not in r.stderr, r.stderr[r.stderr.index("OUTSIDE"):][:2000]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["num_output_tokens"] == 8 or out["finish_reason"] == "stop"
        texts.append(out["token_ids"])
    assert texts[0] == texts[1]  # P-EAGLE's output is the target's own, as the README says
