"""The release gate: statistics (stats), checks (checks), the pure verdict (evaluate) and the
database glue (service)."""

from qualify.gate.checks import ComponentData, Reason, ResultData
from qualify.gate.evaluate import Judgement, evaluate

__all__ = ["ComponentData", "Reason", "ResultData", "Judgement", "evaluate"]
