"""Per-layer quantization evidence (issue 24.5): which linear layers hold quantized weights and which do not.

The byte ratio of the linear weights cannot tell a model whose every targeted layer is quantized from one that
left a third of them in float; the names can. The workload reports, for every linear layer of the model, whether
its weight is a quantized tensor, and which layers the scheme was meant to quantize (every linear layer but the
embeddings, and the output layer only with `quantize_lm_head`). The gate passes only when the two sets are equal
(qualify.gate.checks.check_quantization_evidence). Standard library only: this runs inside the image.
"""

from __future__ import annotations

from typing import Any, Iterable

KEY = "layer_quantization"  # the result environment's key


def evidence(quantized_by_layer: Iterable[tuple[str, bool]], expected: Iterable[str], *,
             lm_head: str | None, quantize_lm_head: bool) -> dict[str, Any]:
    """The evidence document: every linear layer once, split by what its weight is, and what was expected."""
    layers = dict(quantized_by_layer)
    return {
        "expected": sorted(set(expected)),
        "quantized": sorted(name for name, q in layers.items() if q),
        "not_quantized": sorted(name for name, q in layers.items() if not q),
        "lm_head": None if lm_head is None else {"name": lm_head, "quantize_lm_head": quantize_lm_head,
                                                  "quantized": bool(layers.get(lm_head))},
    }
