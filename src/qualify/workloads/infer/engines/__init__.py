"""The inference engines by name: the one place that lists them.

An engine is a module with ``run(p: InferParams, log) -> {"metrics", "samples", "probes",
"environment"}``. Each is imported only when a case asks for it, so the transformers engine
never imports vllm (and the registry itself imports only the standard library).

To add an engine: write ``engines/<name>.py`` with ``run()`` and add one entry to ENGINES.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Protocol

from qualify.workloads.protocol import BadCase

if TYPE_CHECKING:
    from qualify.workloads.infer.params import InferParams


class Engine(Protocol):
    def run(self, p: InferParams, log: logging.Logger) -> dict[str, Any]: ...


def _transformers() -> Engine:
    from qualify.workloads.infer.engines import hf

    return hf


def _vllm() -> Engine:
    from qualify.workloads.infer.engines import vllm_adapter

    return vllm_adapter


# name (the case's params.engine) -> factory that imports the engine module.
ENGINES: dict[str, Callable[[], Engine]] = {
    "transformers": _transformers,
    "vllm": _vllm,
}


# Engines whose timed requests can start together on both sides of a duet (run(p, log, barrier=...)): the
# transformers engine serves one request at a time in the workload's own process. vLLM batches requests in its
# own engine-core process, where no step of ours runs: its cases are measured paired.
DUET_ENGINES = ("transformers",)


def check_name(name: Any) -> None:
    """BadCase naming the known engines when `name` is not one of them."""
    if not isinstance(name, str) or name not in ENGINES:
        raise BadCase(f"engine: {name!r} is not one of {tuple(ENGINES)}")


def get_engine(name: str) -> Engine:
    check_name(name)
    return ENGINES[name]()
