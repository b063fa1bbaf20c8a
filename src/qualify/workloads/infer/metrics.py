"""Agreement, divergence, perplexity and serving-latency figures.

Definitions (all on the same token ids for reference and quantized model, teacher forced:
position t predicts token t+1 of the evaluation sequence):

* token_agreement  - fraction of positions where argmax(quantized) == argmax(reference)
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
    """Figures from full logits [N, T, V] of the reference and the quantized model.

    targets [N, T] are the next tokens (for perplexity), or None. Works one sequence at a
    time so that a large vocabulary does not multiply the memory.
    """
    import torch

    if tuple(ref_logits.shape) != tuple(q_logits.shape):
        raise ValueError(f"logit shapes differ: {tuple(ref_logits.shape)} vs {tuple(q_logits.shape)}")
    n_seq, n_pos, vocab = ref_logits.shape
    k = min(k, vocab)
    agree = overlap = kl = nll_q = nll_ref = 0.0
    for i in range(n_seq):
        ref = ref_logits[i].detach().float().cpu()
        q = q_logits[i].detach().float().cpu()
        ref_lp = torch.log_softmax(ref, dim=-1)
        q_lp = torch.log_softmax(q, dim=-1)
        agree += (ref.argmax(-1) == q.argmax(-1)).double().sum().item()
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
        "token_agreement": agree / total,
        "topk_overlap": overlap / total,
        "kl_div_mean": max(kl_mean, 0.0) if math.isfinite(kl_mean) else None,
        # Positions evaluated (each predicts its next token); distinct positions of the text, as
        # the evaluation windows never overlap (corpus.eval_window_starts).
        "eval_positions": int(n_seq * n_pos),
    }
    if targets is not None:
        out.update(perplexity_figures(nll_q / total, nll_ref / total))
    return out


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
    """Figures from per-position top-k logprobs {token_id: logprob} (e.g. vLLM prompt_logprobs).

    A position's argmax is the id with the highest logprob among those returned (vLLM
    always returns the top-1). KL needs full distributions: it is computed only when full_vocab
    is given and every position of both sides holds all full_vocab ids (vLLM asked for
    prompt_logprobs=vocabulary size), else it is None.
    """
    if len(ref_positions) != len(q_positions):
        raise ValueError(f"position counts differ: {len(ref_positions)} vs {len(q_positions)}")
    agree = 0
    overlaps: list[float] = []
    kl = 0.0
    full = bool(full_vocab)
    for ref, q in zip(ref_positions, q_positions):
        if not ref or not q:
            continue
        ref_top = sorted(ref, key=lambda t: -ref[t])[:k]
        q_top = sorted(q, key=lambda t: -q[t])[:k]
        agree += int(ref_top[0] == q_top[0])
        overlaps.append(len(set(ref_top) & set(q_top)) / max(1, min(k, len(ref_top), len(q_top))))
        if full:
            if len(ref) < full_vocab or len(q) < full_vocab or set(ref) != set(q):
                full = False
                continue
            kl += sum(math.exp(lr) * (lr - q[t]) for t, lr in ref.items() if math.isfinite(lr) and lr > -1e30)
    n = len(overlaps)
    kl_mean = kl / n if (full and n) else None
    return {
        "token_agreement": agree / n if n else None,
        "topk_overlap": sum(overlaps) / n if n else None,
        "kl_div_mean": max(kl_mean, 0.0) if kl_mean is not None and math.isfinite(kl_mean) else None,
        "eval_positions": n,
    }


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
