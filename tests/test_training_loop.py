"""The training guide's loop (docs/training.md) on the default model, through the CLI as a user types it:
prompts -> ``synth`` (in-process and ``--server`` against ``peagle serve``) -> ``hidden`` -> ``train`` under
``torchrun`` (two gloo processes) -> ``export`` in vLLM's layout and the speculators format -> ``generate`` with
each exported head, lossless and with the head's drafts accepted. Tiny sizes: a few prompts, short responses, a
small draft vocabulary, enough steps for the head to learn the responses it then drafts."""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open

from peagle.cli import main
from peagle.models.drafter import load_drafter
from peagle.models.loader import load_tokenizer, resolve_target
from peagle.serve.api import speculative_config
from peagle.train.synth import read_responses
from test_public_heads import vllm_problems
from test_serve import free_port, wait_healthy
from test_speculators import vllm_reads_speculators

# arithmetic questions written for this test (never a benchmark set): greedy answers the head can learn
QUESTIONS = ["A baker sells 14 loaves a day. How many loaves does he sell in a week?",
             "Tom has 23 marbles and gives 9 to his sister. How many marbles does he have left?",
             "A train travels 60 miles an hour for 3 hours. How far does it go?",
             "Sara buys 4 pens at 3 dollars each. How much does she pay?",
             "A class has 28 pupils in 4 equal rows. How many pupils are in each row?",
             "Jim reads 12 pages a day. How many pages does he read in 5 days?"]
NEW_TOKENS = 32
K = 2
GUIDE = Path(__file__).resolve().parent.parent / "docs" / "training.md"
# the keys of vLLM's SpeculativeConfig (vllm/config/speculative.py) the guide's lines use
VLLM_KEYS = {"method", "model", "num_speculative_tokens", "parallel_drafting"}
P_EAGLE = {"method": "eagle3", "parallel_drafting": True}  # what vLLM makes of a speculators P-EAGLE head


def peagle(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


def by_id(folder) -> dict[str, dict]:
    return {r["id"]: r for r in read_responses(folder)}


@contextlib.contextmanager
def serving(log: Path):
    """``peagle serve`` on the default model, the target alone, started as the guide starts it (its stderr in
    ``log``); the caller waits for it (:func:`wait_healthy`) when it needs it, so it loads while the in-process
    steps run."""
    port = free_port()
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "peagle.cli", "serve", "--port", str(port),
                                 "--speculative-config", '{"method": "none"}'], stderr=err)
        try:
            yield port
        finally:
            proc.kill()
            proc.wait(timeout=30)


def test_the_guides_loop_from_prompts_to_a_served_head(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "question": q}) + "\n" for i, q in enumerate(QUESTIONS)))
    synth, hidden, run = tmp_path / "synth", tmp_path / "hidden", tmp_path / "run"

    # 1. the target answers the prompts, in-process and through a server, with the same records; 2. the hidden
    # states, once (while the server loads)
    log = tmp_path / "serve.log"
    with serving(log) as port:
        peagle("synth", "--prompts", str(prompts), "--out", str(synth), "--max-new-tokens", str(NEW_TOKENS))
        peagle("hidden", "--data", str(synth), "--out", str(hidden))
        assert wait_healthy(port), log.read_text()  # (a client: no --dtype, the server's is its own)
        peagle("synth", "--server", f"http://127.0.0.1:{port}", "--prompts", str(prompts),
               "--out", str(tmp_path / "synth-server"), "--max-new-tokens", str(NEW_TOKENS), "--concurrency", "3")
    local, served = by_id(synth), by_id(tmp_path / "synth-server")
    assert len(local) == len(QUESTIONS) and local.keys() == served.keys()
    tok = load_tokenizer(resolve_target(None, weights=False))
    for rid, r in local.items():  # the target's own tokenizer and chat template
        text = tok.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True,
                                       tokenize=False)
        assert r["prompt_token_ids"] == tok(text, add_special_tokens=False)["input_ids"], rid
        assert tok.decode(r["response_token_ids"], skip_special_tokens=True) == r["response"], rid
        assert [served[rid][k] for k in ("prompt_token_ids", "response_token_ids")] == \
            [r["prompt_token_ids"], r["response_token_ids"]], rid

    with safe_open(str(hidden / "hidden-00000.safetensors"), "pt") as f:
        assert {"taps", "final"} <= set(f.keys())

    # 3. train under torchrun: two processes (gloo), every document in the training set
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "peagle.cli", "train", "--data", str(synth), "--hidden", str(hidden),
                           "--out", str(run), "-k", str(K), "--draft-vocab", "256", "--batch-size", "1",
                           "--max-steps", "20", "--lr", "3e-3", "--min-lr", "3e-3", "--warmup-steps", "1",
                           "--eval-fraction", "0", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"head written to {run}" in done.stderr
    assert (run / "checkpoint" / "state.pt").is_file() and (run / "model.safetensors").is_file()
    start = json.loads((run / "train_log.jsonl").read_text().splitlines()[0])
    assert start["world_size"] == 2 and start["train_docs"] == len(QUESTIONS)

    # 4. export in both formats
    peagle("export", "--drafter", str(run), "--out", str(tmp_path / "head-vllm"))
    peagle("export", "--drafter", str(run), "--out", str(tmp_path / "head-speculators"), "--format", "speculators")
    vllm_cfg = json.loads((tmp_path / "head-vllm" / "config.json").read_text())
    spec_cfg = json.loads((tmp_path / "head-speculators" / "config.json").read_text())
    assert vllm_cfg["architectures"] == ["LlamaForCausalLMEagle3"] and vllm_cfg["peagle"]["trained_k"] == K
    assert spec_cfg["speculators_model_type"] == "peagle"
    assert spec_cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    # what `vllm serve HEAD` loads as the target: the hub id, not peagle's cache folder
    assert spec_cfg["speculators_config"]["verifier"] == {"name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                          "architectures": ["LlamaForCausalLM"]}
    assert vllm_problems(tmp_path / "head-vllm") == []  # what vLLM's EAGLE-3 loader would refuse
    assert vllm_reads_speculators(spec_cfg)[1] == {**P_EAGLE, "num_speculative_tokens": K}
    trained = load_drafter(run).state_dict()
    for head in ("head-vllm", "head-speculators"):  # each loads back as the trained head, in bfloat16
        got = load_drafter(tmp_path / head).state_dict()
        assert got.keys() == trained.keys(), head
        for name, t in trained.items():
            torch.testing.assert_close(got[name], t, rtol=4e-3, atol=1e-6, msg=f"{head}: {name}")

    # 5. each exported head drafts for a training prompt: the target's own greedy tokens, drafts accepted
    record = local["prompts:0"]
    capsys.readouterr()
    for head in ("head-vllm", "head-speculators"):
        peagle("generate", "--drafter", str(tmp_path / head), "-k", str(K), "--max-new-tokens", str(NEW_TOKENS),
               "--prompt-lookup-max", "0", "--response-lookup", "none", "--json", record["prompt"])
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == record["response_token_ids"], head  # lossless: synth's greedy answer
        assert out["num_accepted_tokens"] > 0, (head, out)             # the trained head's own drafts


def test_the_guides_speculative_configs_are_what_vllm_and_peagle_read():
    """The guide's ``--speculative-config`` lines: JSON that ``peagle serve`` takes, with vLLM's keys only, P-EAGLE
    as vLLM derives it for a speculators P-EAGLE head, K within the K the guide trains, for both exported folders."""
    loop = GUIDE.read_text()
    loop = loop[loop.index("## The whole loop"):loop.index("## Each step")]
    trained_k = int(re.search(r"-m peagle\.cli train .*? -k (\d+)", loop, re.S).group(1))
    lines = re.findall(r"(peagle|vllm) serve [^\n]*?--speculative-config(?:\s*\\\n\s*|\s+)'([^']*)'", loop)
    served = {"peagle": set(), "vllm": set()}
    for engine, text in lines:
        cfg = json.loads(text)
        speculative_config(cfg)  # peagle serve takes every line
        if cfg["method"] == "none":  # the server that writes synth's responses
            continue
        assert set(cfg) <= VLLM_KEYS and {k: cfg[k] for k in P_EAGLE} == P_EAGLE, text
        assert 1 <= cfg["num_speculative_tokens"] <= trained_k, text
        served[engine].add(cfg["model"])
    assert served["vllm"] == {"heads/my-head", "heads/my-head-speculators"}, lines
    assert served["peagle"] and served["peagle"] <= served["vllm"], lines
    for out in served["vllm"]:  # each folder is one the loop exports
        assert re.search(rf"peagle export .*--out {out}( |\n)", loop), out
