"""A picture of the scoring matrix: which input explains each reasoning best.

Rows are the P inputs, columns the M reasonings sorted by the input they came from, so each
input's reasonings form one block and a healthy policy draws a bright block diagonal. Each
cell is the per-token log-likelihood log p(Z_m | X_j) / T_m, z-scored down its column: the
column says how much better each input explains that reasoning than the others, on the same
scale for short and long reasonings. Under template collapse every column is flat (every input
explains every reasoning alike) and the diagonal disappears.

Built on `matplotlib.figure.Figure`, which renders with Agg and needs no display.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

Z_LIMIT = 3.0  # colour scale clipped at +-3 standard deviations
MAX_TICK_LABELS = 40  # input labels drawn only up to this many rows


def column_zscores(logp: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """z-scores over inputs of each reasoning's per-token log-likelihood.

    logp [M, P], lengths [M] -> [M, P]; a reasoning every input scores alike gets zeros.
    """
    per_token = logp / lengths[:, None]  # [M, P]
    centred = per_token - per_token.mean(axis=1, keepdims=True)
    std = per_token.std(axis=1, keepdims=True)
    return np.divide(centred, std, out=np.zeros_like(centred), where=std > 0)


def heatmap_figure(
    logp: np.ndarray,
    source: np.ndarray,
    lengths: np.ndarray,
    input_labels: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """The inputs x reasonings heatmap of `logp` [M, P], as a Figure (`draw_heatmap` writes it).

    source [M]: the column each reasoning came from; lengths [M]: reasoning lengths in tokens.
    Each input's own reasonings are outlined in white on that input's row. Both axes index
    items, so their ticks are whole numbers (or the input labels).
    """
    m, p = logp.shape
    order = np.argsort(source, kind="stable")  # reasonings grouped by source input
    image = column_zscores(logp, lengths)[order].T  # [P, M]
    fig = Figure(figsize=(float(np.clip(3 + 0.1 * m, 6, 16)), float(np.clip(2 + 0.12 * p, 3.5, 9))), dpi=120,
                 layout="constrained")
    ax = fig.subplots()
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    im = ax.imshow(image, aspect="auto", cmap="viridis", vmin=-Z_LIMIT, vmax=Z_LIMIT, interpolation="nearest")
    sorted_source = source[order]
    for j in np.unique(sorted_source):  # outline each input's block of reasonings on that input's row
        columns = np.flatnonzero(sorted_source == j)
        ax.add_patch(Rectangle((columns[0] - 0.5, j - 0.5), len(columns), 1.0, fill=False, edgecolor="white",
                               linewidth=1.0))
    if input_labels is not None and p <= MAX_TICK_LABELS:
        ax.set_yticks(np.arange(p), [str(label)[:24] for label in input_labels], fontsize=7)
    ax.set_xlabel(f"reasonings (M = {m}), sorted by the input they came from")
    ax.set_ylabel(f"inputs (P = {p})")
    ax.set_title(title or "log p(reasoning | input) per token, z-scored per reasoning", fontsize=9)
    fig.colorbar(im, ax=ax, label="z-score of per-token log p(Z | X) across inputs")
    ax.legend(handles=[Patch(fill=False, edgecolor="black", label="reasonings of this input")], loc="upper right",
              fontsize=7, framealpha=0.7)
    return fig


def draw_heatmap(
    logp: np.ndarray,
    source: np.ndarray,
    lengths: np.ndarray,
    path: Path,
    input_labels: Sequence[str] | None = None,
    title: str = "",
) -> Path:
    """Write `heatmap_figure` of these arguments to `path` (PNG); returns `path`."""
    heatmap_figure(logp, source, lengths, input_labels, title).savefig(path)
    return Path(path)
