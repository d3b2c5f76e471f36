"""Collapse diagnostics: cross-score reasonings under every input, then MI proxies from the matrix."""

from ragen2.collapse.metrics import EmaState, mi_metrics
from ragen2.collapse.scoring import score_matrix, score_matrix_naive

__all__ = ["EmaState", "mi_metrics", "score_matrix", "score_matrix_naive"]
