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


# Public-domain style prose for models with a real tokenizer. Only used to make
# prompts/eval positions that look like language; nothing is scored against it
# except perplexity (reference vs quantized on the same ids).
ENGLISH_TEXT = """\
The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the
morning light. A release qualification pipeline builds a container image, checks the
software inside it, measures how fast models train and how well quantized models agree
with their unquantized references, and only then promotes the image to its users.
Large language models predict the next token of a text from the tokens before it. When
their weights are stored with fewer bits, the predictions change a little; a good
quantization method keeps the most likely token the same almost everywhere. Rivers run
to the sea, and the sea is never full; the wind goes toward the south and turns about
to the north. In the beginning of the year the snow melts on the mountains and the
valleys fill with water, flowers and the sound of bees. Engineers measure twice and cut
once, and they write down every figure so that the next release can be compared with
this one. A cache that returns the wrong entry is worse than no cache at all, because
the answer looks right and is not. Numbers without units, and units without numbers,
tell nothing; a median with its spread tells more than a single lucky run.
"""


def text_token_stream(tokenizer, min_tokens: int) -> list[int]:
    """Token ids of the fixed text, repeated until at least min_tokens long."""
    ids = list(tokenizer(ENGLISH_TEXT, add_special_tokens=False)["input_ids"])
    if not ids:
        raise ValueError("tokenizer returned no tokens for the fixed text")
    out: list[int] = []
    while len(out) < min_tokens:
        out.extend(ids)
    return out
