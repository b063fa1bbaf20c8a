"""Agreement, divergence, perplexity and serving-latency figures.

Definitions (all on the same token ids for reference and quantized model, teacher forced:
position t predicts token t+1 of the evaluation sequence):

* token_agreement  - fraction of positions where argmax(quantized) == argmax(reference); each
                     sequence's counts and every position's flag go into the result too
                     (agreement_record), so that the gate can bound it by sequence and compare it
                     position by position with the previous release
* topk_overlap     - mean of |topk(quantized) & topk(reference)| / k
* kl_div_mean      - mean over positions of KL(reference || quantized), nats
* perplexity       - exp(mean NLL of the evaluation tokens) under the quantized model;
                     perplexity_ref under the reference; perplexity_delta = ppl - ppl_ref
* serving figures as vLLM's benchmark defines them: TTFT (time to first token),
  TPOT = (latency - TTFT) / (output tokens - 1), ITL (gaps between consecutive
  tokens), end-to-end latency; reported as p50/p90/p99.

The logits variant needs torch; the top-k variant (vLLM logprobs) is plain Python.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

from qualify.workloads.protocol import percentile


def compare_logits(ref_logits, q_logits, targets=None, k: int = 5) -> dict[str, float | None]:
    """Figures from full logits [N, T, V] of the reference and the quantized model (see
    compare_logits_by_sequence, which also returns each position's agreement)."""
    return compare_logits_by_sequence(ref_logits, q_logits, targets, k)[0]


def compare_logits_by_sequence(ref_logits, q_logits, targets=None, k: int = 5
                               ) -> tuple[dict[str, float | None], list[list[bool]]]:
    """(figures, agreement flags per sequence) from full logits [N, T, V].

    targets [N, T] are the next tokens (for perplexity), or None. Works one sequence at a
    time so that a large vocabulary does not multiply the memory. flags[i][t] says whether the
    two models' argmax agree at position t of sequence i: the gate bounds the agreement with the
    sequences as its sampling unit (positions of one sequence are not independent).
    """
    import torch

    if tuple(ref_logits.shape) != tuple(q_logits.shape):
        raise ValueError(f"logit shapes differ: {tuple(ref_logits.shape)} vs {tuple(q_logits.shape)}")
    n_seq, n_pos, vocab = ref_logits.shape
    k = min(k, vocab)
    overlap = kl = nll_q = nll_ref = 0.0
    flags: list[list[bool]] = []
    for i in range(n_seq):
        ref = ref_logits[i].detach().float().cpu()
        q = q_logits[i].detach().float().cpu()
        ref_lp = torch.log_softmax(ref, dim=-1)
        q_lp = torch.log_softmax(q, dim=-1)
        flags.append([bool(x) for x in (ref.argmax(-1) == q.argmax(-1)).tolist()])
        ref_top = ref.topk(k, dim=-1).indices
        q_top = q.topk(k, dim=-1).indices
        # |A & B| for two sets of k distinct ids: matches over the k x k pairs.
        overlap += (ref_top.unsqueeze(-1) == q_top.unsqueeze(-2)).sum().double().item() / k
        kl += (ref_lp.exp() * (ref_lp - q_lp)).sum(-1).double().sum().item()
        if targets is not None:
            t = targets[i].long().cpu().unsqueeze(-1)
            nll_q -= q_lp.gather(-1, t).double().sum().item()
            nll_ref -= ref_lp.gather(-1, t).double().sum().item()
    total = float(n_seq * n_pos)
    kl_mean = kl / total
    out: dict[str, float | None] = {
        "token_agreement": sum(map(sum, flags)) / total,
        "topk_overlap": overlap / total,
        "kl_div_mean": max(kl_mean, 0.0) if math.isfinite(kl_mean) else None,
        # Positions evaluated (each predicts its next token); distinct positions of the text, as
        # the evaluation windows never overlap (corpus.eval_window_starts).
        "eval_positions": int(n_seq * n_pos),
        "eval_sequences": int(n_seq),
    }
    if targets is not None:
        out.update(perplexity_figures(nll_q / total, nll_ref / total))
    return out, flags


def _safe_exp(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    try:
        return math.exp(x)
    except OverflowError:
        return None


def perplexity_figures(nll_q: float | None, nll_ref: float | None) -> dict[str, float | None]:
    ppl = _safe_exp(nll_q)
    ppl_ref = _safe_exp(nll_ref)
    return {
        "perplexity": ppl,
        "perplexity_ref": ppl_ref,
        "perplexity_delta": (ppl - ppl_ref) if ppl is not None and ppl_ref is not None else None,
    }


def compare_topk(ref_positions: Sequence[Mapping[int, float]], q_positions: Sequence[Mapping[int, float]],
                 k: int, full_vocab: int | None = None) -> dict[str, float | None]:
    """Figures from per-position top-k logprobs {token_id: logprob} (e.g. vLLM prompt_logprobs): the
    positions of compare_topk_by_sequence as one sequence."""
    return compare_topk_by_sequence([ref_positions], [q_positions], k, full_vocab)[0]


def compare_topk_by_sequence(ref_seqs: Sequence[Sequence[Mapping[int, float]]],
                             q_seqs: Sequence[Sequence[Mapping[int, float]]], k: int,
                             full_vocab: int | None = None) -> tuple[dict[str, float | None], list[list[bool]]]:
    """(figures, agreement flags per sequence) from per-position top-k logprobs, sequence by sequence.

    A position's argmax is the id with the highest logprob among those returned (vLLM
    always returns the top-1); a position either side returned nothing for is not evaluated. KL
    needs full distributions: it is computed only when full_vocab is given and every position of
    both sides holds all full_vocab ids (vLLM asked for prompt_logprobs=vocabulary size), else None.
    """
    if len(ref_seqs) != len(q_seqs):
        raise ValueError(f"sequence counts differ: {len(ref_seqs)} vs {len(q_seqs)}")
    flags: list[list[bool]] = []
    overlaps: list[float] = []
    kl = 0.0
    full = bool(full_vocab)
    for ref_positions, q_positions in zip(ref_seqs, q_seqs):
        if len(ref_positions) != len(q_positions):
            raise ValueError(f"position counts differ: {len(ref_positions)} vs {len(q_positions)}")
        seq_flags: list[bool] = []
        for ref, q in zip(ref_positions, q_positions):
            if not ref or not q:
                continue
            ref_top = sorted(ref, key=lambda t: -ref[t])[:k]
            q_top = sorted(q, key=lambda t: -q[t])[:k]
            seq_flags.append(ref_top[0] == q_top[0])
            overlaps.append(len(set(ref_top) & set(q_top)) / max(1, min(k, len(ref_top), len(q_top))))
            if full:
                if len(ref) < full_vocab or len(q) < full_vocab or set(ref) != set(q):
                    full = False
                    continue
                kl += sum(math.exp(lr) * (lr - q[t]) for t, lr in ref.items() if math.isfinite(lr) and lr > -1e30)
        flags.append(seq_flags)
    n = len(overlaps)
    kl_mean = kl / n if (full and n) else None
    return {
        "token_agreement": sum(map(sum, flags)) / n if n else None,
        "topk_overlap": sum(overlaps) / n if n else None,
        "kl_div_mean": max(kl_mean, 0.0) if kl_mean is not None and math.isfinite(kl_mean) else None,
        "eval_positions": n,
        "eval_sequences": sum(1 for f in flags if f),
    }, flags


# ---------------------------------------------------------------- the agreement record (what the gate reads)

# Per evaluated sequence (result samples): positions whose argmax agree, positions evaluated. The
# gate's interval treats the sequence as its sampling unit (gate/agreement.py).
AGREE_SERIES = "agreement_agree"
POSITIONS_SERIES = "agreement_positions"
# Result environment: every position's agreement flag, bit-packed (see pack_flags), for a paired
# comparison with the previous release on the same positions; and what identifies those positions.
FLAGS_KEY = "agreement_flags"
DATA_KEY = "eval_data_sha256"
FLAGS_ENCODING = "base64 of the flags sequence after sequence, 8 a byte, first position in the lowest bit"


def sequence_counts(flags: Sequence[Sequence[bool]]) -> tuple[list[int], list[int]]:
    """(agreeing positions, evaluated positions) of each sequence that has positions."""
    kept = [f for f in flags if len(f)]
    return [sum(1 for x in f if x) for f in kept], [len(f) for f in kept]


def pack_flags(flags: Sequence[Sequence[bool]]) -> str:
    """The flags of every sequence (empty ones dropped) as one base64 text: 10,240 positions in 1,708 characters."""
    import base64

    stream = [bool(x) for f in flags for x in f]
    packed = bytearray((len(stream) + 7) // 8)
    for j, bit in enumerate(stream):
        if bit:
            packed[j >> 3] |= 1 << (j & 7)
    return base64.b64encode(bytes(packed)).decode("ascii")


def unpack_flags(text: str, positions: Sequence[int]) -> list[list[bool]]:
    """pack_flags undone, split by the sequences' position counts; ValueError when they do not fit."""
    import base64
    import binascii

    try:
        packed = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise ValueError(f"{FLAGS_KEY}: not base64 ({exc})") from None
    total = sum(int(n) for n in positions)
    if any(int(n) < 0 for n in positions) or len(packed) != (total + 7) // 8:
        raise ValueError(f"{FLAGS_KEY}: {len(packed)} bytes do not hold {total} positions")
    out: list[list[bool]] = []
    j = 0
    for n in positions:
        out.append([bool(packed[(j + t) >> 3] >> ((j + t) & 7) & 1) for t in range(int(n))])
        j += int(n)
    return out


def data_digest(sequences: Iterable[Sequence[int]]) -> str:
    """sha256 of the evaluation token ids (what makes two results' positions the same positions)."""
    import hashlib

    h = hashlib.sha256()
    for seq in sequences:
        h.update((",".join(str(int(t)) for t in seq) + ";").encode("ascii"))
    return h.hexdigest()


def agreement_record(flags: Sequence[Sequence[bool]], data_sha256: str
                     ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """(samples, environment) entries of the result that carry the per-sequence agreement."""
    agree, positions = sequence_counts(flags)
    samples = {AGREE_SERIES: [float(a) for a in agree], POSITIONS_SERIES: [float(n) for n in positions]}
    env = {FLAGS_KEY: pack_flags(flags), "agreement_flags_encoding": FLAGS_ENCODING, DATA_KEY: data_sha256}
    return samples, env


def mean_nll(logprobs: Iterable[float]) -> float | None:
    values = [float(x) for x in logprobs]
    if not values:
        return None
    return -sum(values) / len(values)


def tpot(latency_s: float, ttft_s: float, output_tokens: int) -> float | None:
    """Time per output token after the first (vLLM benchmark definition)."""
    if output_tokens < 2:
        return None
    return (latency_s - ttft_s) / (output_tokens - 1)


def request_record(start: float, token_times: Sequence[float]) -> dict[str, Any]:
    """One request's timings from its start and the wall time at which each token was ready."""
    n = len(token_times)
    if n == 0:
        return {"output_tokens": 0, "latency_s": None, "ttft_s": None, "tpot_s": None, "itl_s": []}
    ttft = token_times[0] - start
    latency = token_times[-1] - start
    return {
        "output_tokens": n,
        "latency_s": latency,
        "ttft_s": ttft,
        "tpot_s": tpot(latency, ttft, n),
        "itl_s": [b - a for a, b in zip(token_times, token_times[1:])],
    }


def serving_summary(records: Sequence[Mapping[str, Any]], repeat_tokens_per_s: Sequence[float]
                    ) -> tuple[dict[str, float | None], dict[str, list[float]]]:
    """(metrics, samples) from per-request records and per-repeat output token rates."""
    metrics: dict[str, float | None] = {}
    samples: dict[str, list[float]] = {"output_tokens_per_s": [float(x) for x in repeat_tokens_per_s]}
    metrics["output_tokens_per_s"] = percentile(repeat_tokens_per_s, 50)
    for name in ("latency_s", "ttft_s", "tpot_s"):
        values = [float(r[name]) for r in records if r.get(name) is not None]
        samples[name] = values
        for q in (50, 90, 99):
            metrics[f"{name}_p{q}"] = percentile(values, q)
    itl = [float(x) for r in records for x in (r.get("itl_s") or [])]
    metrics["itl_s_p50"] = percentile(itl, 50)
    if len(repeat_tokens_per_s) > 1 and metrics["output_tokens_per_s"]:
        spread = (max(repeat_tokens_per_s) - min(repeat_tokens_per_s)) / metrics["output_tokens_per_s"]
        metrics["output_tokens_per_s_spread"] = spread
    return metrics, samples
