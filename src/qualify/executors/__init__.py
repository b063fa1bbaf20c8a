"""Executors run one workload case inside the candidate and return its result document.

They are plain, picklable values: the driver builds one and Ray ships it to the worker
that runs the case (see docs/ARCHITECTURE.md).
"""

from qualify.executors.base import ExecutionOutcome, Executor
from qualify.executors.container import ContainerExecutor
from qualify.executors.local import LocalExecutor

__all__ = ["ContainerExecutor", "ExecutionOutcome", "Executor", "LocalExecutor"]
