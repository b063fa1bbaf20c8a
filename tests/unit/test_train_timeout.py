"""A training case stopped by its timeout is a timeout, however the interrupted code re-raised it.

CI on a fresh, loaded machine: the GPU check's compile variant reached its 115 s timeout inside torch.compile;
inductor re-raised the timeout as its own InductorError ("_Timeout: stopped by SIGALRM"), and the run was
reported as a crash instead of a timeout."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from qualify.workloads.train import runner


class InductorError(RuntimeError):
    """What torch._inductor.exc.InductorError does with an exception raised inside a compile."""


def _wrapped_timeout(how: str) -> BaseException:
    try:
        raise runner._Timeout("stopped by SIGALRM")
    except runner._Timeout as timeout:
        if how == "cause":
            try:
                raise InductorError("_Timeout: stopped by SIGALRM") from timeout
            except InductorError as exc:
                return exc
        try:  # raised while handling it: the timeout is the context
            raise InductorError("_Timeout: stopped by SIGALRM")
        except InductorError as exc:
            return exc


@pytest.mark.parametrize("how", ["cause", "context"])
def test_the_timeout_behind_a_wrapping_error_is_found(how: str) -> None:
    exc = _wrapped_timeout(how)
    found = runner._timeout_behind(exc)
    assert isinstance(found, runner._Timeout) and str(found) == "stopped by SIGALRM"


def test_an_error_with_no_timeout_behind_it_is_not_a_timeout() -> None:
    try:
        try:
            raise ValueError("bad shape")
        except ValueError as inner:
            raise InductorError("lowering failed") from inner
    except InductorError as exc:
        assert runner._timeout_behind(exc) is None
    looped = RuntimeError("a")
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped  # a cycle ends the walk
    assert runner._timeout_behind(looped) is None


def test_a_wrapped_timeout_outside_the_step_loop_ends_as_a_timeout_document(monkeypatch) -> None:
    def train(*_args, **_kwargs):
        raise _wrapped_timeout("cause")

    monkeypatch.setattr(runner, "_train", train)
    monkeypatch.setattr(runner, "_arm_timeout", lambda _timeout: None)
    doc = runner.handle({"params": {"model": "tiny-llama"}, "timeout_s": 5}, logging.getLogger("t"))
    assert doc == {"status": "error", "error_class": "timeout", "error": "stopped by SIGALRM"}


def test_any_other_error_outside_the_step_loop_still_propagates(monkeypatch) -> None:
    def train(*_args, **_kwargs):
        raise InductorError("lowering failed")

    monkeypatch.setattr(runner, "_train", train)
    monkeypatch.setattr(runner, "_arm_timeout", lambda _timeout: None)
    with pytest.raises(InductorError):
        runner.handle({"params": {"model": "tiny-llama"}, "timeout_s": 5}, logging.getLogger("t"))


class _StepStoppedInCompile:
    """The first warm-up step of a compiled model, stopped by the case's timeout inside the compile."""

    def __init__(self, *_args) -> None:
        self.losses: list[float] = []

    def __call__(self, timed: bool = False) -> float:
        raise _wrapped_timeout("cause")


def _setup():
    import torch

    p = SimpleNamespace(seq_len=8, warmup_steps=1, steps=2, repeats=1, slowdown=0.0)
    config = SimpleNamespace(num_hidden_layers=2, num_attention_heads=2, hidden_size=8, head_dim=4)
    return SimpleNamespace(p=p, env={"activation_saved_bytes": 0}, config=config,
                           counts={"flops_params": 100, "total": 120, "non_embedding": 100},
                           micro=1, accum=1, world=1, device=torch.device("cpu"))


def test_a_timeout_inside_a_compile_in_the_step_loop_is_a_timeout_not_a_crash(monkeypatch) -> None:
    monkeypatch.setattr(runner, "_Stepper", _StepStoppedInCompile)
    doc = runner._measure(_setup(), engine=None, fixed=None, ckpt_counter=None, log=logging.getLogger("t"))
    assert (doc["status"], doc["error_class"], doc["error"]) == ("error", "timeout", "stopped by SIGALRM")
    assert doc["samples"]["step_time_s"] == []


def test_another_error_in_the_step_loop_is_not_turned_into_a_timeout(monkeypatch) -> None:
    class Broken(_StepStoppedInCompile):
        def __call__(self, timed: bool = False) -> float:
            raise InductorError("lowering failed")

    monkeypatch.setattr(runner, "_Stepper", Broken)
    with pytest.raises(InductorError):
        runner._measure(_setup(), engine=None, fixed=None, ckpt_counter=None, log=logging.getLogger("t"))
