"""Collapse diagnostics: cross-score reasonings under every input, then MI proxies from the matrix."""

from ragen2.collapse.alarm import AlarmDecision, CollapseAlarm
from ragen2.collapse.metrics import EmaState, mi_metrics
from ragen2.collapse.online import OnlineDiagnostics, StepResult
from ragen2.collapse.scoring import score_matrices, score_matrix, score_matrix_naive

__all__ = [
    "AlarmDecision",
    "CollapseAlarm",
    "EmaState",
    "OnlineDiagnostics",
    "StepResult",
    "mi_metrics",
    "score_matrices",
    "score_matrix",
    "score_matrix_naive",
]
