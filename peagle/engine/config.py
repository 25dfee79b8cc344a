"""The engine's settings (:class:`EngineConfig`, vLLM's names) and the bounds they fix for one target and
head (:class:`Bounds`): what the scheduler and the model runner size their work by."""
from __future__ import annotations

from dataclasses import dataclass

from peagle import kernels
from peagle.engine.lookup import LOOKUP_MOST
from peagle.engine.tree import Tree

METHODS = ("parallel", "eagle3", "ngram", "none")   # ngram: vLLM's prompt lookup alone, no head
KV_CACHE_DTYPES = ("auto", "float16", "float32")
AUTO_RANKS = 8   # candidates a position the engine weighs for a tree of its own choosing


@dataclass
class EngineConfig:
    """The engine's settings, checked for consistency alone when built (no library loaded, no file read): what the
    machine bounds (the kernels' tree limit) is checked where the engine starts, :meth:`Bounds.of`."""

    method: str = "parallel"
    num_speculative_tokens: int | str = 7   # or "auto": chosen each step up to max_speculative_tokens
    max_speculative_tokens: int | None = None  # K_max for "auto" (default: the head's trained K, else 10)
    # what the drafts form (vLLM's key): "chain" (one candidate a position), "auto" (the engine chooses a
    # tree of at most speculative_tree_budget nodes each step, P-EAGLE only), or an explicit tree drafted
    # every step, vLLM's list of rank paths such as "[(0,), (1,), (0, 0)]" (its depth at most K)
    speculative_token_tree: str = "chain"
    speculative_tree_budget: int = 16
    # drafts from the text itself beside the head's (vLLM's n-gram keys, peagle/engine/lookup.py): where the
    # last n tokens, n from prompt_lookup_max down to prompt_lookup_min, occurred before, the tokens that
    # followed them take the head's place at the positions they cover; prompt_lookup_max 0 turns it off
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2
    # ... and where the text proposes nothing in a step the head's drafting is skipped, what most often followed the
    # last tokens in the target's earlier responses (peagle/engine/lookup.py's ResponseLookup): "auto" (the table
    # beside the head in use, or the target's shipped head, where there is one), a table's path, or "none".
    # LLMEngine takes the table loaded; from_pretrained, the CLI and the server load it by this key
    response_lookup: str = "auto"
    max_num_seqs: int = 8
    max_model_len: int | None = None        # default: the target's max_position_embeddings, capped at 8192
    max_num_batched_tokens: int = 2048      # tokens per step: decode and verify rows first, then prefill chunks
    enable_chunked_prefill: bool = True     # off: a prompt is prefilled whole (a longer one runs alone)
    # fair prefill (vLLM's names; with chunked prefill): a prompt with more tokens left to prefill than
    # the threshold is long and gets at most that many a step while anything else runs (None or 0, as
    # vLLM: an eighth of max_num_batched_tokens); prompts prefill side by side, this many
    # at most, of them this many long ones
    long_prefill_token_threshold: int | None = None
    # ... and no more than fit a step of this many ms by the measured cost of its rows (attention over
    # its growing context included; alone, scheduler.ALONE_STEPS such steps), so that decodes wait about
    # this long a step on any CPU (None: vLLM's rule, the threshold beside others, the budget alone)
    long_prefill_step_ms: float | None = 200.0
    max_num_partial_prefills: int = 8
    max_long_partial_prefills: int = 1
    block_size: int = 16
    # KV blocks kept after a request for the next prompt that starts with the same tokens (vLLM's automatic
    # prefix caching, on by default as there; llama-server's prompt cache): a chat's next turn prefills what is new
    enable_prefix_caching: bool = True
    kv_cache_tokens: int | None = None      # default: max_num_seqs full sequences, capped at 16384
    # what the KV cache stores (vLLM's --kv-cache-dtype; llama.cpp's -ctk/-ctv): "auto" is float16 where the
    # target runs peagle's CPU kernels on their fast paths (half the bytes a step reads, as llama.cpp's F16
    # cache), else the model's dtype (float32 on the CPU: --compute exact keeps every bit of float32 arithmetic)
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False             # CUDA: no CUDA graphs for decode steps (vLLM's flag; CPUs never capture)

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if k != "auto" and (not isinstance(k, int) or isinstance(k, bool) or (k <= 0 and self.method != "none")):
            raise ValueError(f"the number of speculative tokens K must be an integer >= 1 or 'auto', got {k!r}")
        tree = self.token_tree   # parsed: a bad tree is refused here
        if tree != "chain" and self.method != "parallel":
            raise ValueError(f"speculative_token_tree {self.speculative_token_tree!r} needs parallel drafting "
                             f"(P-EAGLE): a {self.method} draft is one token a position")
        if isinstance(tree, Tree) and isinstance(k, int) and tree.depth > k:
            raise ValueError(f"the token tree is {tree.depth} deep, more than num_speculative_tokens={k}")
        if self.speculative_tree_budget < 1:
            raise ValueError(f"speculative_tree_budget must be >= 1, got {self.speculative_tree_budget}")
        if self.method == "ngram" and not self.prompt_lookup_max:
            raise ValueError("method ngram drafts from the text alone: prompt_lookup_max must be >= 1")
        if self.prompt_lookup_max < 0:
            raise ValueError(f"prompt_lookup_max must be >= 0 (0: off), got {self.prompt_lookup_max}")
        if self.prompt_lookup_max and not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min must be in 1..prompt_lookup_max ({self.prompt_lookup_max}), "
                             f"got {self.prompt_lookup_min}")
        if not isinstance(self.response_lookup, str) or not self.response_lookup:
            raise ValueError(f"response_lookup is 'auto', 'none' or a table's path, got {self.response_lookup!r}")
        m = self.max_speculative_tokens
        if m is not None and (not isinstance(m, int) or m < 1):
            raise ValueError(f"max_speculative_tokens must be an integer >= 1, got {m!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_num_partial_prefills",
                     "max_long_partial_prefills"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_long_partial_prefills > self.max_num_partial_prefills:
            raise ValueError(f"max_long_partial_prefills ({self.max_long_partial_prefills}) must not exceed "
                             f"max_num_partial_prefills ({self.max_num_partial_prefills})")
        if self.long_prefill_step_ms is not None and not self.long_prefill_step_ms > 0:
            raise ValueError(f"long_prefill_step_ms must be > 0 (or None), got {self.long_prefill_step_ms}")
        t = self.long_prefill_token_threshold
        if t is not None and not 0 <= t <= self.max_num_batched_tokens:
            raise ValueError(f"long_prefill_token_threshold must be in 0..max_num_batched_tokens "
                             f"({self.max_num_batched_tokens}; 0: the default), got {t}")

    @property
    def token_tree(self) -> str | Tree:
        """``chain``, ``auto`` or the explicit :class:`Tree`."""
        t = self.speculative_token_tree
        return t if t in ("chain", "auto") else Tree.parse(t)

    @property
    def uses_head(self) -> bool:
        """A drafter drafts (P-EAGLE, EAGLE-3), not the text alone (ngram) or nothing (none)."""
        return self.method in ("parallel", "eagle3")

    @property
    def auto(self) -> bool:
        """The engine chooses the head's drafts' shape each step (K, or the whole tree)."""
        return self.uses_head and (self.speculative_token_tree == "auto" or (
            self.num_speculative_tokens == "auto" and self.speculative_token_tree == "chain"))

    @property
    def priced(self) -> bool:
        """A cost model weighs the drafts: ``auto``'s, or ngram at K auto's (the text's drafts alone, verified
        beside other sequences only while they pay their rows: at 16 they lost 13% unpriced)."""
        return self.auto or (self.method == "ngram" and self.num_speculative_tokens == "auto")

    @property
    def long_prefill(self) -> int:
        """The long-prompt threshold in force."""
        return self.long_prefill_token_threshold or max(1, self.max_num_batched_tokens // 8)


@dataclass(frozen=True)
class Bounds:
    """What a step may hold per sequence, fixed when the engine starts."""

    token_tree: str | Tree   # "chain", "auto" or the explicit tree drafted every step (a chain without drafts)
    k_max: int               # the most positions a step drafts (K, K_max when chosen, an explicit tree's depth)
    ranks: int               # the candidates of each position kept
    max_nodes: int           # the most nodes a step verifies
    max_model_len: int

    @classmethod
    def of(cls, config: EngineConfig, trained_k: int | None, target_positions: int) -> "Bounds":
        """The bounds of ``config`` for a head trained for ``trained_k`` drafts (None: any) and a target of
        ``target_positions`` positions; refuses a K or a length they cannot take."""
        tree = config.token_tree if config.method != "none" else "chain"
        k = config.num_speculative_tokens
        k_max = (0 if config.method == "none" else tree.depth if isinstance(tree, Tree)
                 else k if k != "auto" else LOOKUP_MOST if config.method == "ngram"
                 else config.max_speculative_tokens or trained_k or 10)
        if config.method == "parallel" and trained_k is not None and k_max > trained_k:
            raise ValueError(f"K={k_max} exceeds the K={trained_k} this head was trained for")
        ranks = tree.ranks if isinstance(tree, Tree) else AUTO_RANKS if tree == "auto" else 1
        max_nodes = (len(tree) if isinstance(tree, Tree) else config.speculative_tree_budget + 2 if tree == "auto"
                     else k_max)   # (+2: auto's probes)
        most = kernels.limits().tree_nodes   # the kernels' limit: read here, where the engine starts, not in the config
        if max_nodes > most:
            what = (f"speculative_tree_budget {config.speculative_tree_budget} (+2 probes)" if tree == "auto"
                    else f"a token tree of {max_nodes} nodes")
            raise ValueError(f"{what}: a step verifies at most {most} nodes a sequence")
        max_model_len = config.max_model_len or min(target_positions, 8192)
        if max_model_len > target_positions:
            raise ValueError(f"max_model_len {max_model_len} exceeds the target's {target_positions} positions")
        return cls(tree, k_max, ranks, max_nodes, max_model_len)

    @property
    def max_positions(self) -> int:
        """KV positions a sequence may need: one at max_model_len still verifies its nodes and drafts past it."""
        return self.max_model_len + max(self.k_max, self.max_nodes) + 1
