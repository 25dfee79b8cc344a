"""The real default model (SmolLM2-135M-Instruct): lossless speculation for every K, seeded sampling
that speculation cannot change, both shipped heads, and the CLI."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
from speculation import OracleDrafter, fixed_costs, planted, references

from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.loader import load_drafter_for, load_target, load_tokenizer, resolve_target

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def default():
    target, path = load_target(None, "float32")
    tok = load_tokenizer(path)
    return target, tok, load_drafter_for(target, path, None, tok)


@pytest.fixture(scope="module")
def eagle3_head(default):
    target, tok, _ = default
    return load_drafter_for(target, resolve_target(None), None, tok, "eagle3")


def test_lossless_every_k_on_the_default_model(default):
    """Every K in 1..10 with a head that is right most of the time (deep acceptance, every kind of
    rejection), and a few K up to its trained K with the shipped default head (weak: mostly rejections)."""
    target, tok, head = default
    base = LLMEngine(target, None, EngineConfig(method="none"), tok)
    ids = base.encode_prompt("Write a haiku about the sea.")
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ref = base.generate([ids], params)[0].token_ids
    oracle = OracleDrafter(dataclasses.replace(head.cfg, trained_k=None), ids + ref, wrong_every=5)
    oracle.load_state_dict(head.state_dict(), assign=True)  # the head's tensors (GGUF blocks beside an int8 target)
    runs = [(k, oracle.eval()) for k in range(1, 11)] + [(k, head) for k in (1, 7, head.cfg.trained_k or 10)]
    for k, drafter in runs:
        for method in ("parallel", "eagle3"):
            engine = LLMEngine(target, drafter, EngineConfig(method=method, num_speculative_tokens=k), tok)
            assert engine.generate([ids], params)[0].token_ids == ref, (method, k, type(drafter).__name__)
            assert drafter is head or engine.stats.num_accepted_tokens > 0, (method, k)


def test_shipped_eagle3_head_is_lossless(default, eagle3_head):
    target, tok, _ = default
    base = LLMEngine(target, None, EngineConfig(method="none"), tok)
    ids = base.encode_prompt("Write a haiku about the sea.")
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    ref = base.generate([ids], params)[0].token_ids
    accepted = 0
    for k in (3, "auto"):
        out = LLMEngine(target, eagle3_head, EngineConfig(method="eagle3", num_speculative_tokens=k), tok).generate([ids], params)[0]
        assert out.token_ids == ref, k
        assert out.stats.num_drafts > 0, k
        accepted += out.stats.num_accepted_tokens
    assert accepted > 0


def test_seeded_sampling_is_plain_decodings_on_the_default_model(default, eagle3_head):
    """float32, temperature 0.8, seed 7: both shipped heads' configs and tensors (drafting plain decoding's
    seeded samples, every 4th position wrong), K 3/5/7/auto, alone and in a batch of eight with other seeded,
    unseeded and greedy requests, give plain decoding's tokens with drafts accepted; seed 8 does not. A
    verifier that rejects every draft (planted) gives the same tokens, and is caught by the acceptance check."""
    target, tok, head = default
    base = LLMEngine(target, None, EngineConfig(method="none", max_num_seqs=8), tok)
    texts = ["Tell me a story about a cat.", "Name three rivers.", "What is 17 times 3?", "Write a limerick.",
             "Describe a sunset.", "Give me a packing list.", "Explain rain.", "Say something kind."]
    ids = [base.encode_prompt(t) for t in texts]
    sp = SamplingParams(temperature=0.8, max_tokens=40, seed=7)
    params = [dataclasses.replace(sp, seed=None if i == 3 else 7 + i, temperature=0.0 if i == 5 else 0.8) for i in range(8)]
    seeded = [i for i in range(8) if params[i].seed is not None and not params[i].greedy]
    ref = {i: base.generate([ids[i]], params[i])[0].token_ids for i in seeded}
    assert base.generate([ids[0]], dataclasses.replace(sp, seed=8))[0].token_ids != ref[0]
    refs = references([ids[i] for i in seeded], [ref[i] for i in seeded])

    def engine(method, drafter, k, patch=lambda e: e):
        oracle = OracleDrafter(dataclasses.replace(drafter.cfg, trained_k=None), refs, wrong_every=4)
        oracle.load_state_dict(drafter.state_dict(), assign=True)
        e = LLMEngine(target, oracle.eval(), EngineConfig(method=method, num_speculative_tokens=k, max_num_seqs=8,
                                                          prompt_lookup_max=0), tok)
        return patch(fixed_costs(oracle.bind(e)))

    for method, drafter, k in (("parallel", head, 3), ("parallel", head, 7), ("parallel", head, "auto"),
                               ("eagle3", eagle3_head, 5), ("eagle3", eagle3_head, "auto")):
        e = engine(method, drafter, k)
        assert e.generate([ids[0]], sp)[0].token_ids == ref[0], (method, k)
        batch = e.generate(ids, params)
        assert {i: batch[i].token_ids for i in seeded} == ref, (method, k)
        assert e.stats.num_accepted_tokens > 0, (method, k)
    rejecting = engine("parallel", head, 3, lambda e: planted("reject_all", e))
    batch = rejecting.generate(ids, params)
    assert {i: batch[i].token_ids for i in seeded} == ref and rejecting.stats.num_accepted_tokens == 0


def test_cli_seed_reproduces_whatever_the_speculation():
    """`peagle generate --temperature 0.8 --seed 7` (float32): the defaults twice, `--method none`,
    `-k 3` and `--method eagle3 -k 5` give the same tokens."""
    outs = []
    for extra in ([], [], ["--method", "none"], ["-k", "3"], ["--method", "eagle3", "-k", "5"]):
        r = run_cli("generate", "--json", "--dtype", "float32", "--temperature", "0.8", "--seed", "7",
                    "--max-new-tokens", "48", *extra, "Tell me a story about a cat.")
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout.strip().splitlines()[-1])["token_ids"])
    assert all(o == outs[0] for o in outs) and len(outs[0]) > 10


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "peagle.cli", *args], capture_output=True, text=True, timeout=600)


def test_cli_generate_json_and_errors():
    outs = {}
    for method, eager in (("parallel", []), ("none", ["--enforce-eager"])):
        r = run_cli("generate", "--json", "--dtype", "float32", "--method", method, "-k", "3", "--max-new-tokens", "24",
                    *eager, "Name a fruit.")
        assert r.returncode == 0, r.stderr
        outs[method] = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("text", "token_ids", "num_prompt_tokens", "num_output_tokens", "acceptance_length",
                "per_position_acceptance", "elapsed_s", "output_tokens_per_s", "kv_cache_dtype"):
        assert key in outs["parallel"], key
    assert (outs["parallel"]["device"], outs["parallel"]["dtype"], outs["parallel"]["cuda_graphs"]) == ("cpu", "float32", False)
    assert outs["parallel"]["token_ids"] == outs["none"]["token_ids"]
    assert outs["parallel"]["text"] == outs["none"]["text"] and outs["parallel"]["text"]
    assert len(outs["parallel"]["per_position_acceptance"]) == 3
    for bad in (["generate", "--drafter", "/nonexistent/head", "hi"], ["generate", "-k", "0", "hi"],
                ["generate", ""], ["generate", "--target", "/nonexistent/model", "hi"]):
        r = run_cli(*bad)
        assert r.returncode == 1 and "Traceback" not in r.stderr, (bad, r.stderr)
        lines = r.stderr.strip().splitlines()  # one error line, after any one-line notices (no kernels, say)
        assert lines[-1].startswith("peagle: error:") and all(x.startswith("peagle: ") for x in lines), r.stderr
        assert sum(x.startswith("peagle: error:") for x in lines) == 1, r.stderr


def test_init_drafter_then_generate_with_it(tmp_path):
    head = tmp_path / "head"
    r = run_cli("init-drafter", "--layers", "2", "--draft-vocab", "4096", "--trained-k", "5", "--out", str(head))
    assert r.returncode == 0, r.stderr
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["draft_vocab_size"] == 4096 and cfg["ptd_token_id"] == 16
    outs = [json.loads(run_cli("generate", "--json", "--dtype", "float32", "--drafter", str(head), "--method", m, "-k", "5",
                               "--max-new-tokens", "16", "Say hello.").stdout.splitlines()[-1])
            for m in ("parallel", "eagle3", "none")]
    assert outs[0]["token_ids"] == outs[1]["token_ids"] == outs[2]["token_ids"]
    r = run_cli("generate", "--drafter", str(head), "-k", "6", "hi")  # more than the head was trained for
    assert r.returncode == 1 and "K=5" in r.stderr


def test_baseline_runs_the_sections_asked_for(tmp_path):
    """``peagle.bench.baseline --sections``: only those are timed and reported (here prefill and the
    pass table drafting needs, each tiny), in the JSON and in the markdown."""
    from peagle.bench.peers import llamacpp
    from peagle.bench.baseline.runner import parse_args, run

    questions = tmp_path / "question.jsonl"  # MT-Bench's format, one question (fast)
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a haiku."]}) + "\n")
    res = run(parse_args(["--questions", str(questions), "--sections", "prefill,drafting", "--prefill-tokens", "96",
                          "--prefill-reps", "1", "--micro-reps", "1", "--micro-warmup", "0", "--max-k", "2",
                          "--verify-sizes", "1,2", "--context", "64", "--prompts", "1", "--wait-idle", "0",
                          "--settle", "0", "--no-hf-passes", "--dtype", "float32", "--quantization", "none",
                          "--json", str(tmp_path / "b.json")]))
    assert {"prefill", "target_passes", "drafting"} <= res.keys() and "end_to_end" not in res
    assert res["prefill"]["tokens"] == 96 and res["prefill"]["peers"]["hf"]["s"] > 0
    if llamacpp.available():   # --llamacpp auto: the file at the engine's precision times its prompt eval too
        assert res["prefill"]["peers"]["llamacpp-F32"]["s"] > 0
    else:
        assert "llama.cpp not installed" in res["prefill"]["left_out"]
    assert [r["k"] for r in res["drafting"]["rows"]] == [1, 2]
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved.keys() == res.keys()


@pytest.mark.parametrize("fmt", ["gguf", "bfloat16", "float16"])
def test_speculation_is_exact_in_every_weight_format_on_the_default_model(fmt):
    """The GGUF as shipped (Q4_1 blocks) and 16-bit weights on the CPU kernels (`--compute fast`: bf16 through
    bf16 dot products on AVX512_BF16 and AVX2, float16 in float32 arithmetic): both
    shipped heads, greedy and seeded, alone and eight together, give plain decoding's tokens, some of
    them the heads' accepted drafts. K is `auto` in 16-bit; on the GGUF, where `auto` drafts less, K=3 makes
    every step a verify pass."""
    from peagle import kernels

    import torch
    if not kernels.native(torch.device("cpu")):
        pytest.skip("batch invariance in 16-bit and quantized weights comes with the CPU kernels")
    target, path = load_target(None, "auto", quantization="gguf") if fmt == "gguf" else \
        load_target(None, fmt, quantization="none")
    k = 3 if fmt == "gguf" else "auto"
    tok = load_tokenizer(path)
    texts = ["Tell me a story about a cat.", "Name three rivers.", "What is 17 times 3?", "Write a limerick.",
             "Describe a sunset.", "Give me a packing list.", "Explain rain.", "Say something kind."]
    base = LLMEngine(target, None, EngineConfig(method="none", max_num_seqs=8), tok)
    ids = [base.encode_prompt(t) for t in texts]
    params = [SamplingParams(max_tokens=32, ignore_eos=True, **({"temperature": 0.8, "seed": 7 + i} if i % 2 else {}))
              for i in range(8)]
    plain = [base.generate([i], sp)[0].token_ids for i, sp in zip(ids, params)]
    for method in ("parallel", "eagle3"):
        engine = LLMEngine(target, load_drafter_for(target, path, None, tok, method),
                           EngineConfig(method=method, num_speculative_tokens=k, max_num_seqs=8), tok)
        assert [engine.generate([i], sp)[0].token_ids for i, sp in zip(ids[:3], params[:3])] == plain[:3], method
        assert [o.token_ids for o in engine.generate(ids, params)] == plain, method
        assert engine.stats.num_accepted_tokens > 0, method   # the shipped heads' drafts (one native call each, P-EAGLE)
