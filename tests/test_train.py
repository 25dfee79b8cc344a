"""``peagle hidden`` / ``train`` / ``export`` on a tiny target: the trained folder is a head the engine
runs losslessly, training resumes exactly (also after kill -9), two torchrun processes equal one
process with the doubled batch, offline hidden states equal online ones, and heads learn."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch
from conftest import kernels_on
from safetensors import safe_open
from safetensors.torch import load_file
from test_public_heads import vllm_problems

from peagle.files import temp_beside
from peagle.engine.llm_engine import EngineConfig, LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.models.drafter import load_drafter
from peagle.models.layers import Linear
from peagle.models.loader import load_target
from peagle.train.data import HiddenSource, draft_vocab, load_records, write_hidden
from peagle.train.synth import synthesize
from peagle.train.trainer import STATE, Trainer, TrainConfig, train

K = 4


@pytest.fixture(scope="module")
def synth_dir(tiny_chat_dir, tmp_path_factory):
    """Responses the tiny target wrote for a few dozen prompts."""
    d = tmp_path_factory.mktemp("train-data")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Question number {i}: tell me about {w}."}) + "\n"
                               for i, w in enumerate(["cats", "rivers", "maths", "rain", "music", "bread"] * 5)))
    # float32, as the heads train against the target (config's dtype); `auto` would take bfloat16 weights where the
    # kernels run, other text (on torch's fallback in bfloat16, the tests' few steps learned less of it: AL 2.0)
    engine = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32", max_num_seqs=16,
                                       max_model_len=256)
    synthesize(engine, [str(prompts)], d / "synth", max_new_tokens=40, batch_size=16, progress=False)
    return d / "synth"


def config(tiny_chat_dir, synth_dir, out, **kw) -> TrainConfig:
    base = dict(data=str(synth_dir), out=str(out), target=str(tiny_chat_dir), k=K, draft_vocab=512, batch_size=4,
                micro_tokens=128, eval_fraction=0.25, eval_every=3, save_every=2, warmup_steps=2, lr=3e-3,
                progress=False, dtype="float32")
    return TrainConfig(**{**base, **kw})


def head_tensors(out) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("method", ["peagle", "eagle3"])
def test_trained_folder_is_a_head_the_engine_runs_losslessly(tiny_chat_dir, synth_dir, tmp_path, method):
    cfg = config(tiny_chat_dir, synth_dir, tmp_path / "head", method=method, max_steps=4)
    res = train(cfg)
    # the tiny target's greedy text repeats itself in part: four steps learn much of it (an untrained head
    # scores 1.0; 2.65 and 2.90 here since the target sees positions, conftest.randomize)
    assert res is not None and len(res["acc"]) == K and res["al"] > 2.2 and res["anchors"] > 0, res
    log = [json.loads(line) for line in open(tmp_path / "head" / "train_log.jsonl")]
    assert [r["step"] for r in log if r.get("event") == "eval"] == [3, 4]
    assert vllm_problems(tmp_path / "head", parallel_drafting=method == "peagle") == []
    target, _ = load_target(str(tiny_chat_dir), "float32")   # on CUDA where there is one
    head = load_drafter(tmp_path / "head", device=target.lm_weight.device)
    assert head.cfg.draft_vocab_size == 512 and head.cfg.trained_k == K
    engine_method = "parallel" if method == "peagle" else "eagle3"
    ps = [rec.ids[:rec.prompt_len] for rec in load_records(synth_dir, 256)[:4]]
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    ref = [o.token_ids for o in LLMEngine(target, None, EngineConfig(method="none")).generate(ps, params)]
    outs = LLMEngine(target, head, EngineConfig(method=engine_method, num_speculative_tokens=K)).generate(ps, params)
    assert [o.token_ids for o in outs] == ref
    # the held-out estimate holds in the engine where the target's text repeats (two of these four prompts)
    assert max(o.stats.acceptance_length for o in outs) > 3.0, [o.stats for o in outs]


@pytest.fixture
def restore_determinism():
    """``deterministic=True`` switches torch's deterministic kernels on for the process; off again after."""
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_resume_continues_exactly(tiny_chat_dir, synth_dir, tmp_path, restore_determinism):
    """With deterministic kernels: on a GPU the chain gather's backward (``index_add_``) otherwise adds rows
    atomically, in no fixed order."""
    train(config(tiny_chat_dir, synth_dir, tmp_path / "straight", max_steps=6, deterministic=True))
    cut = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "cut", max_steps=6, deterministic=True))
    for _ in range(3):
        cut.train_step()
    cut.save()  # as if killed right after the checkpoint of step 3
    resumed = train(config(tiny_chat_dir, synth_dir, tmp_path / "cut", max_steps=6, resume=True, deterministic=True))
    a, b = head_tensors(tmp_path / "straight"), head_tensors(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["step"] == 6


def test_resume_refuses_changed_settings(tiny_chat_dir, synth_dir, tmp_path):
    """Every setting that changes what a step trains is named when it differs, and so are data, a target and
    hidden states that changed under the same names."""
    import shutil

    from safetensors.torch import save_file

    data, target = tmp_path / "data", tmp_path / "target"
    shutil.copytree(synth_dir, data)
    shutil.copytree(tiny_chat_dir, target)
    records = load_records(data, 256)
    write_hidden(load_target(str(target), "float32")[0], records, tmp_path / "hidden", progress=False)
    kw = dict(max_steps=2, hidden=str(tmp_path / "hidden"))
    train(config(target, data, tmp_path / "h", **kw))
    for change, named in ((dict(k=3), "k: 4 -> 3"), (dict(labels="hard"), "labels: 'soft' -> 'hard'"),
                          (dict(epochs=2.0), "epochs: 1.0 -> 2.0"), (dict(segments=2), "segments: 1 -> 2"),
                          (dict(hidden=None), "hidden: '.*' -> None"),
                          (dict(data=str(synth_dir)), f"data: '{data}' -> '{synth_dir}'")):
        with pytest.raises(ValueError, match=named):
            Trainer(config(target, data, tmp_path / "h", **{**kw, **change, "resume": True}))
    with pytest.raises(ValueError, match=f"target: '{target}' -> '{tiny_chat_dir}'"):
        Trainer(config(tiny_chat_dir, data, tmp_path / "h", **kw, resume=True))
    Trainer(config(target, data, tmp_path / "h", **kw, resume=True))  # unchanged: resumes

    # the same names, other contents: a hidden-state shard rewritten, the target's weights, the data
    shard = sorted((tmp_path / "hidden").glob("hidden-*.safetensors"))[0]
    with safe_open(str(shard), "pt") as fh:
        tensors, meta = {k: fh.get_tensor(k) for k in fh.keys()}, fh.metadata()
    tensors["final"] = tensors["final"] * 2
    save_file(tensors, str(shard), metadata=meta)
    with pytest.raises(ValueError, match="hidden: the hidden-state shards in .* are not those"):
        Trainer(config(target, data, tmp_path / "h", **kw, resume=True))
    weights = load_file(str(target / "model.safetensors"))
    save_file({k: v * 1.01 if v.is_floating_point() else v for k, v in weights.items()},
              str(target / "model.safetensors"))
    with pytest.raises(ValueError, match="target: the target's files .* are not those"):
        Trainer(config(target, data, tmp_path / "h", max_steps=2, resume=True))
    save_file(weights, str(target / "model.safetensors"))
    last = max(data.glob("responses-*.jsonl*"))
    (last.with_name("responses-09999.jsonl")).write_text(json.dumps(
        {"id": "extra", "response": "x", "prompt_token_ids": records[0].ids[:records[0].prompt_len],
         "response_token_ids": [5, 6, 7, 8]}) + "\n")
    with pytest.raises(ValueError, match="data: the documents in .* are not those"):
        Trainer(config(target, data, tmp_path / "h", max_steps=2, resume=True))


def test_checkpoints_are_fsynced_before_the_rename_and_load_strictly(tiny_chat_dir, synth_dir, tmp_path, monkeypatch):
    trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", max_steps=2))
    trainer.train_step()
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a), str(b))), real_replace(a, b))[1])
    trainer.save()
    monkeypatch.undo()
    for final in (tmp_path / "h" / STATE, tmp_path / "h" / "model.safetensors", tmp_path / "h" / "config.json"):
        tmp = str(temp_beside(final))
        i = events.index(("replace", tmp, str(final)))
        assert ("fsync", tmp) in events[:i], (final, events)  # the data is on disk before the name is
        assert ("fsync", str(final.parent)) in events[i:], (final, events)  # and the rename after it

    path = tmp_path / "h" / STATE
    state = torch.load(path, weights_only=True)
    torch.save({**state, "head": {**state["head"], "stray.weight": torch.zeros(1)}}, path)
    with pytest.raises(RuntimeError, match="stray.weight"):
        Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", max_steps=2, resume=True))
    torch.save({**state, "head": {k: v for k, v in state["head"].items() if k != "mask_embedding"}}, path)
    with pytest.raises(RuntimeError, match="mask_embedding"):
        Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", max_steps=2, resume=True))


def test_init_from_starts_at_the_given_head_and_refuses_another_shape(tiny_chat_dir, synth_dir, tmp_path):
    first = train(config(tiny_chat_dir, synth_dir, tmp_path / "first", max_steps=4))
    # --init-from with no steps to take: the head evaluates as the one it started from, weights equal
    again = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "again", max_steps=4, init_from=str(tmp_path / "first")))
    again.evaluate()
    assert again.last_eval["al"] == first["al"] and again.last_eval["acc"] == first["acc"]
    again.save()
    a, b = head_tensors(tmp_path / "first"), head_tensors(tmp_path / "again")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="--layers 2 != the head's 1"):
        Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "x", layers=2, init_from=str(tmp_path / "first")))
    with pytest.raises(ValueError, match="--draft-vocab 256 != the head's 512"):
        Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "x", draft_vocab=256, init_from=str(tmp_path / "first")))


def cli(*args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "peagle.cli", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def train_args(tiny_chat_dir, synth_dir, out, *extra):
    return ["train", "--target", str(tiny_chat_dir), "--data", str(synth_dir), "--out", str(out), "-k", str(K),
            "--draft-vocab", "512", "--batch-size", "4", "--micro-tokens", "128", "--eval-fraction", "0.25",
            "--warmup-steps", "2", "--lr", "3e-3", "--max-steps", "8", "--eval-every", "100", "--no-progress",
            "--dtype", "float32", "--deterministic", *extra]


# `peagle train` that SIGKILLs itself once step KILL_AFTER_STEP has trained, before the run saves it: a kill
# mid-interval at a step count, not at a moment a poll happens to see (the same on every machine's speed)
DYING_TRAIN = """
import os, signal, sys
from peagle.train import trainer
from peagle.cli import main
train_step = trainer.Trainer.train_step
def dying(self):
    rec = train_step(self)
    if self.step == int(os.environ["KILL_AFTER_STEP"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return rec
trainer.Trainer.train_step = dying
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_loses_at_most_one_interval(tiny_chat_dir, synth_dir, tmp_path):
    """Killed (SIGKILL) after step 3 trained (checkpoints every 2 steps), the run's
    checkpoint on disk is step 2's, whole, and ``--resume`` finishes with the uninterrupted run's head, bit
    for bit."""
    straight = cli(*train_args(tiny_chat_dir, synth_dir, tmp_path / "a", "--save-every", "2"))
    assert straight.wait(timeout=300) == 0, straight.stdout.read()
    victim = subprocess.run([sys.executable, "-c", DYING_TRAIN, *train_args(tiny_chat_dir, synth_dir, tmp_path / "b",
                                                                            "--save-every", "2")],
                            env={**os.environ, "KILL_AFTER_STEP": "3"}, capture_output=True, text=True, timeout=300)
    assert victim.returncode == -signal.SIGKILL, victim.stdout + victim.stderr
    assert torch.load(tmp_path / "b" / STATE, weights_only=False)["step"] == 2  # step 3 lost, step 2 whole
    again = cli(*train_args(tiny_chat_dir, synth_dir, tmp_path / "b", "--save-every", "2", "--resume"))
    assert again.wait(timeout=300) == 0, again.stdout.read()
    a, b = head_tensors(tmp_path / "a"), head_tensors(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_torchrun_processes_equal_one_with_the_doubled_batch(tiny_chat_dir, synth_dir, tmp_path):
    """Two gloo processes, as DDP (each the whole head) and as FSDP2 (each a shard of it and of Adam's state),
    give the head one process trains on the doubled batch; micro-batches in segments of at most ~64 elements.
    Two processes sum a batch's gradients in another order than one, and Adam divides each by its own running
    size, so an element whose gradient is near Adam's eps moves a visible part of a step when its last bits do:
    on a Zen 3 (AVX2) one element of 8,192 differed by 4.7e-6 under FSDP. 2e-5 is 1% of a step (lr 3e-3 warmed
    up over 2 steps); a missed gradient reduction moves many elements by a whole step."""
    one = cli(*train_args(tiny_chat_dir, synth_dir, tmp_path / "one", "--batch-size", "4", "--max-steps", "3",
                          "--max-elements", "64"))
    assert one.wait(timeout=300) == 0, one.stdout.read()
    a = head_tensors(tmp_path / "one")
    for port, parallel in ((29517, "ddp"), (29518, "fsdp")):
        args = train_args(tiny_chat_dir, synth_dir, tmp_path / parallel, "--batch-size", "2", "--max-steps", "3",
                          "--max-elements", "64", "--parallel", parallel)
        two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                              str(port), "-m", "peagle.cli", *args],
                             capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert two.returncode == 0, two.stdout + two.stderr
        b = head_tensors(tmp_path / parallel)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=lambda m, k=k: f"{parallel}: {k}: {m}")


def test_offline_hidden_states_equal_online(tiny_chat_dir, synth_dir, tmp_path):
    target, _ = load_target(str(tiny_chat_dir), "float32")
    records = load_records(synth_dir, 256)
    assert write_hidden(target, records, tmp_path / "hidden", shard_docs=7, progress=False) == -(-len(records) // 7)
    assert write_hidden(target, records, tmp_path / "hidden", shard_docs=7, progress=False) == 0  # resumed: all done
    # more data arrived: only the last shard, which now holds more documents, is redone
    assert write_hidden(target, records[:-1], tmp_path / "hidden2", shard_docs=7, progress=False) == -(-(len(records) - 1) // 7)
    assert write_hidden(target, records, tmp_path / "hidden2", shard_docs=7, progress=False) == 1
    shard = load_file(str(tmp_path / "hidden" / "hidden-00000.safetensors"))
    assert shard["taps"].dtype == shard["final"].dtype == torch.bfloat16  # half of float32 on disk
    online, offline = HiddenSource(target), HiddenSource(target, tmp_path / "hidden")
    for rec in records[:5]:
        a, b = online.doc(rec), offline.doc(rec)
        assert torch.equal(a.argmax, b.argmax) and torch.equal(a.ids, b.ids)
        assert b.taps.dtype == b.final.dtype == torch.float32
        torch.testing.assert_close(b.taps, a.taps, rtol=4e-3, atol=1e-5)  # bf16 keeps 8 significant bits
        torch.testing.assert_close(b.final, a.final, rtol=4e-3, atol=1e-5)
    res = train(config(tiny_chat_dir, synth_dir, tmp_path / "off", hidden=str(tmp_path / "hidden"), max_steps=3))
    assert res["anchors"] > 0
    # with the states on disk, training reads no decoder layer of the target: they stay on the meta device, and
    # the head starts as it does beside the whole target
    trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "ends", hidden=str(tmp_path / "hidden")))
    assert trainer.target.model.layers and all(p.is_meta for p in trainer.target.model.layers.parameters())
    whole = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "whole"))
    assert not any(p.is_meta for p in whole.target.parameters())
    mine, theirs = trainer.head.state_dict(), whole.head.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    # documents synthesized after `peagle hidden` ran are left out, with a note, until it runs again
    write_hidden(target, records[:-1], tmp_path / "hidden3", shard_docs=7, progress=False)
    partial = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "part", hidden=str(tmp_path / "hidden3")))
    assert len(partial.train_records) + len(partial.eval_records) == len(records) - 1


def test_hidden_cli_runs_the_target_in_the_dtype_asked_for(tiny_chat_dir, synth_dir, tmp_path):
    for dtype in ("bfloat16", "float32"):
        p = cli("hidden", "--target", str(tiny_chat_dir), "--data", str(synth_dir), "--out", str(tmp_path / dtype),
                "--shard-docs", "64", "--device", "cpu", "--dtype", dtype)
        assert p.wait(timeout=120) == 0, p.stdout.read()
    with safe_open(str(tmp_path / "bfloat16" / "hidden-00000.safetensors"), "pt") as fh:
        assert fh.metadata()["target_dtype"] == "bfloat16" and fh.get_tensor("taps").dtype == torch.bfloat16
    a, b = (load_file(str(tmp_path / d / "hidden-00000.safetensors")) for d in ("bfloat16", "float32"))
    assert not torch.equal(a["taps"], b["taps"])  # the target really ran in bf16
    torch.testing.assert_close(a["taps"].float(), b["taps"].float(), rtol=0.1, atol=0.1)
    p = cli("hidden", "--target", str(tiny_chat_dir), "--data", str(synth_dir), "--out", str(tmp_path / "x"),
            "--dtype", "int8")
    assert p.wait(timeout=60) != 0 and "invalid choice" in p.stdout.read()


def test_hidden_shards_for_another_target_are_refused(tiny_chat_dir, synth_dir, tmp_path):
    target, _ = load_target(str(tiny_chat_dir), "float32")
    records = load_records(synth_dir, 256)
    write_hidden(target, records[:4], tmp_path / "hidden", progress=False)
    other = dataclasses.replace(target.cfg, hidden_size=target.cfg.hidden_size + 1)
    target.cfg = other
    with pytest.raises(Exception, match="written for another target"):
        HiddenSource(target, tmp_path / "hidden")


def test_draft_vocabulary_is_the_most_frequent_response_tokens(synth_dir):
    records = load_records(synth_dir, 256)
    vocab = draft_vocab(records, 16, 49152)
    counts = torch.bincount(torch.tensor([t for r in records for t in r.ids[r.prompt_len:]]), minlength=49152)
    assert vocab.tolist() == sorted(vocab.tolist()) and len(set(vocab.tolist())) == 16
    assert counts[vocab].min() >= counts.sort(descending=True).values[15]
    with pytest.raises(ValueError, match="draft vocabulary size"):
        draft_vocab(records, 0, 49152)


def test_heads_learn(tiny_chat_dir, synth_dir, tmp_path):
    """More training gives a better held-out acceptance estimate than none (the tiny target's
    greedy text repeats itself in part, which a head picks up within a few dozen steps: AL 3.0 here)."""
    cfg = config(tiny_chat_dir, synth_dir, tmp_path / "learn", max_steps=40, eval_every=40, save_every=40, lr=1e-2)
    trainer = Trainer(cfg)
    trainer.evaluate()
    before = trainer.last_eval
    after = trainer.run()
    assert after["acc"][0] > before["acc"][0] + 0.1 and after["al"] > 2.5 > before["al"], (before, after)


def test_export_writes_the_complete_vllm_layout_and_the_compact_one(tiny_chat_dir, synth_dir, tmp_path):
    train(config(tiny_chat_dir, synth_dir, tmp_path / "h", max_steps=2))
    full = tmp_path / "full"
    compact = tmp_path / "compact"
    for out, extra in ((full, []), (compact, ["--compact"])):
        p = cli("export", "--target", str(tiny_chat_dir), "--drafter", str(tmp_path / "h"), "--out", str(out),
                "--dtype", "float32", *extra)
        assert p.wait(timeout=120) == 0, p.stdout.read()
    f, c = head_tensors(full), head_tensors(compact)
    assert "embed_tokens.weight" in f and "embed_tokens.weight" not in c
    mask_id = json.loads((full / "config.json").read_text())["ptd_token_id"]
    assert c["embed_tokens.rows"].tolist() == [mask_id]  # only the learned mask row differs from the target
    target, _ = load_target(str(tiny_chat_dir), "float32")
    base = target.model.embed_tokens.weight
    a, b = load_drafter(full).state_dict(), load_drafter(compact, base_embedding=base).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_autocast_keeps_float32_weights_and_optimizer_state(tiny_chat_dir, synth_dir, tmp_path):
    """The weights and Adam's state stay float32 under bf16 autocast; autocast ran (the updated weights are
    not float32's bits; the logged loss, rounded to 5 digits near ln(draft vocab), cannot tell) and closely."""
    runs, heads = {}, {}
    for dtype in ("float32", "bfloat16"):
        trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / dtype, max_steps=2, dtype=dtype))
        runs[dtype] = [trainer.train_step() for _ in range(2)]
        heads[dtype] = [p.detach().clone() for p in trainer.head.trainable()]
        assert all(p.dtype == torch.float32 for p in trainer.head.parameters())
        assert all(v.dtype == torch.float32 for st in trainer.opt.state.values() for v in st.values() if v.is_floating_point())
    a, b = runs["float32"][-1], runs["bfloat16"][-1]
    assert b["loss"] == pytest.approx(a["loss"], rel=0.05), (a, b)
    assert any(not torch.equal(p, q) for p, q in zip(heads["float32"], heads["bfloat16"]))


def test_the_target_keeps_its_dtype(tiny_chat_dir, synth_dir, tmp_path):
    """The target as loaded for serving (bf16 weights here): its layers stay bf16, no float32 copy of them,
    the rows the labels come from keep the LM head's own dtype, and a step trains on them."""
    trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", target_dtype="bfloat16", max_steps=1))
    weights = [m.weight for m in trainer.target.modules() if isinstance(m, Linear)]
    assert weights and all(w.dtype == torch.bfloat16 for w in weights)
    assert trainer.objective.target_head.dtype == trainer.target.lm_weight.dtype
    assert math.isfinite(trainer.train_step()["loss"])


@pytest.mark.parametrize("method,states", [("peagle", "offline"), ("eagle3", "offline"), ("peagle", "online")])
def test_objective_chain_mask_and_data_path_name_their_device(tiny_chat_dir, synth_dir, tmp_path, method, states):
    """Built on the trainer's device, then run with the default device set to "meta": a tensor created
    without naming its device (which on a GPU would land on the CPU) meets real tensors and fails. Online,
    the target's shared prefills run under it too."""
    hidden = None
    if states == "offline":
        target, _ = load_target(str(tiny_chat_dir))
        write_hidden(target, load_records(synth_dir, 256), tmp_path / "hidden", progress=False)
        hidden = str(tmp_path / "hidden")
    trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", method=method, hidden=hidden,
                             segments=2, max_steps=1))
    torch.set_default_device("meta")
    try:
        work, n_sup, _ = trainer.step_work()            # hidden-state shards, packing, position sampling
        stats = trainer.objective.run(work, 1.0 / n_sup, backward=True)  # chain mask, segments, loss
        trainer.evaluate()
    finally:
        torch.set_default_device(None)
    assert len(work) > 1 and math.isfinite(float(stats.loss)) and trainer.last_eval["anchors"] > 0
    grads = [p.grad for p in trainer.head.trainable()]
    assert all(g is not None and g.device == trainer.device and bool(g.isfinite().all()) for g in grads)


def test_processes_beyond_the_gpus_share_them_over_gloo(monkeypatch):
    """torchrun with more processes than GPUs: ranks go round-robin, and NCCL (one rank a device) gives way."""
    from peagle.train.trainer import placement
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for rank, world, want in [(1, 2, ("cuda:1", "nccl")), (3, 4, ("cuda:1", "gloo")), (2, 4, ("cuda:0", "gloo"))]:
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(world))
        device, backend = placement(torch.device("cuda"))
        assert (str(device), backend) == want
    assert placement(torch.device("cuda", 1)) == (torch.device("cuda", 1), "nccl")
    assert placement(torch.device("cpu")) == (torch.device("cpu"), "gloo")


def test_a_gguf_targets_fingerprint_is_its_file(tmp_path):
    """A GGUF target is read from its file (its folder holds a config and tokenizer alone): a rewritten file
    changes the fingerprint a resumed run is checked by."""
    from peagle.train.trainer import files_fingerprint, target_files

    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(5000))
    (tmp_path / "meta").mkdir()
    assert target_files(str(f), tmp_path / "meta") == [f]
    before = files_fingerprint(target_files(str(f), tmp_path / "meta"))
    f.write_bytes(b"GGUF" + bytes(4000) + b"\1" * 1000)
    assert files_fingerprint(target_files(str(f), tmp_path / "meta")) != before


def test_a_gguf_target_becomes_bfloat16_on_cuda_not_float32(tmp_path):
    """CUDA has no block kernels: a GGUF target's blocks are de-quantized there into bf16 (serving's dtype on a
    GPU), never a float32 copy; the stored dtype is decided before the file is read."""
    from peagle.train.target import stored_dtype

    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    assert stored_dtype(str(f), None, torch.device("cuda")) == "bfloat16"
    assert stored_dtype(str(f), "gguf", torch.device("cuda", 1)) == "bfloat16"


@pytest.mark.parametrize("native_bf16", [False, True])
def test_autocast_is_bfloat16_only_where_the_device_multiplies_it(monkeypatch, native_bf16):
    """Training's matmuls are torch's: ``auto`` autocasts to bf16 on CUDA and on CPUs with native bf16, float32
    elsewhere, whether or not the native serving kernels (whose weights ``auto`` makes bf16) are built here."""
    from peagle import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(precision.table, "on_device", lambda *a: True)
    assert precision.resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    want = torch.bfloat16 if native_bf16 else torch.float32
    assert precision.autocast_dtype("auto", torch.device("cpu")) == want
    assert precision.autocast_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert precision.autocast_dtype("float16", torch.device("cpu")) == torch.float16


@pytest.mark.parametrize("native_bf16", [False, True])
def test_the_fallbacks_auto_is_float32_whatever_the_cpu_multiplies(monkeypatch, native_bf16):
    """Without the native kernels torch's matmul runs the passes, and its bfloat16 ones are not batch-invariant:
    serving's ``auto`` is float32 there even on CPUs with native bf16 (training's autocast keeps bf16)."""
    from peagle import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: native_bf16)
    monkeypatch.setattr(precision.table, "on_device", lambda *a: False)
    assert precision.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert precision.resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert precision.resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    assert precision.resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    want = torch.bfloat16 if native_bf16 else torch.float32
    assert precision.autocast_dtype("auto", torch.device("cpu")) == want


@pytest.mark.skipif(not kernels_on(), reason="the native kernels are off")
def test_the_trainer_autocasts_in_float32_on_a_cpu_without_bf16_even_with_the_kernels(tiny_chat_dir, synth_dir,
                                                                                       tmp_path, monkeypatch):
    from peagle import precision

    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    trainer = Trainer(config(tiny_chat_dir, synth_dir, tmp_path / "h", max_steps=1, dtype="auto"))
    assert trainer.dtype == torch.float32
