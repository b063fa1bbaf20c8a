"""The release gate: statistics (stats), checks (checks), the pure verdict (evaluate) and the
database glue (service)."""

from qualify.gate.checks import ComponentData, Reason, ResultData
from qualify.gate.evaluate import Verdict, evaluate

__all__ = ["ComponentData", "Reason", "ResultData", "Verdict", "evaluate"]
