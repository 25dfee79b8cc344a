"""Baseline benchmark on the default model (SmolLM2-135M-Instruct, ``--dtype``/``--device`` as the CLI), in one run:

1. plain decoding: our engine (method ``none``) against its peers (:mod:`peagle.bench.peers`): HF
   transformers ``generate`` (greedy) and llama.cpp in-process on the default model's GGUF
   (``--llamacpp``: by default the file at the engine's weight precision and the shipped Q4_1), same
   chat-templated MT-Bench prompts and token ids, same number of new tokens, EOS ignored, one request
   at a time; decode tok/s = (new tokens - 1) / (total time - time to first token), TTFT, whether the
   greedy tokens agree, and peagle over llama.cpp at the same weight precision; the speculative
   methods end to end, each with the head ``load_drafter_for`` gives for it (the shipped P-EAGLE and
   EAGLE-3 heads), at ``--k`` (default ``auto``, as ``peagle generate``: so the `parallel` row is
   generate's defaults);
2. the cost of one engine step verifying 1, 2, 4, 8, 16 tokens at a context of ~256 tokens (ours,
   and HF's forward with a DynamicCache for reference);
3. the prefill of a 4,000-token prompt, ours against HF's forward and llama.cpp's prompt eval, in the
   same precision;
4. the cost of drafting K tokens through the engine's own ``ModelRunner.propose``: one parallel (P-EAGLE)
   drafter pass, and K sequential EAGLE-3 passes, for K = 1..10, in ms and as a fraction of a
   one-token step. HF runs in the engine's dtype throughout;
5. llama.cpp's own ``llama-bench`` on the same files (tg128, and pp1 / pp8 / pp16: what a batch of
   verify rows costs it), with our ``none`` decode rate over its tg128 at the same precision: the figure
   quoted against llama.cpp (the binding's per-token Python loop charges its own cost to llama.cpp).

The machine is shared, so every figure is a median of several repetitions, systems are
interleaved (each repetition runs every system back to back, in a rotating order), and the
headline numbers are ratios between figures taken in this same run. llama.cpp's in-process peers need
``pip install '.[llamacpp]'``, ``llama-bench`` its binaries (:func:`peagle.bench.peers.llamacpp.native_bin`);
without them their rows are left out, with a note.

    python -m peagle.bench.baseline --max-new-tokens 128 --prompts 3 --reps 3 --json out.json
"""
# a module per section (end_to_end, passes, prefill, drafting, llamabench); runner: the flags and the run
from peagle.bench.baseline.runner import add_args, main, parse_args, run

__all__ = ["add_args", "main", "parse_args", "run"]
