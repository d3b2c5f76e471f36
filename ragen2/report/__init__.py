"""Figures and a one-page HTML report of a run directory, or of several runs overlaid (`ragen2 report`).

`runs` reads the run directories, `figures` draws the PNGs, `page` writes `report.html` around them
(`write_report` does all three). The names below are the package's API, as they were when it was one module.
"""

from ragen2.report.figures import (
    CONSTANT_MARGIN,
    CONSTANT_RTOL,
    FIGURES,
    THROUGHPUT_KEYS,
    TIMING_OUTLIER,
    TIMING_PHASES,
    Draw,
    FigureSpec,
    generation_throughput,
    moving_average,
    run_tags,
    timing_stack,
    timing_top,
)
from ragen2.report.page import (
    FIGURE_DIR,
    REPORT_FILE,
    SAMPLE_TEXT_CHARS,
    SUMMARY_COLUMNS,
    SUMMARY_KEYS,
    config_differences,
    default_out_dir,
    write_report,
)
from ragen2.report.runs import (
    ROLLOUT_DIR,
    Metrics,
    RunData,
    config_value,
    eval_success_stderr,
    load_runs,
    rollout_files,
    success_verdicts,
)

__all__ = [
    "CONSTANT_MARGIN",
    "CONSTANT_RTOL",
    "FIGURES",
    "FIGURE_DIR",
    "REPORT_FILE",
    "ROLLOUT_DIR",
    "SAMPLE_TEXT_CHARS",
    "SUMMARY_COLUMNS",
    "SUMMARY_KEYS",
    "THROUGHPUT_KEYS",
    "TIMING_OUTLIER",
    "TIMING_PHASES",
    "Draw",
    "FigureSpec",
    "Metrics",
    "RunData",
    "config_differences",
    "config_value",
    "default_out_dir",
    "eval_success_stderr",
    "generation_throughput",
    "load_runs",
    "moving_average",
    "rollout_files",
    "run_tags",
    "success_verdicts",
    "timing_stack",
    "timing_top",
    "write_report",
]
