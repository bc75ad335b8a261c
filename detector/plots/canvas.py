"""Shared plotting plumbing: headless matplotlib figures.

Figures are built with the object-oriented API on an explicit Agg canvas rather than through pyplot:
nothing touches pyplot's global figure registry, so a long training run leaks no figures and plotting
from a background thread is safe.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path

import matplotlib

if "matplotlib.pyplot" not in sys.modules:
    # Headless default for the whole process (servers have no display); skipped when pyplot is already
    # live, because ``use`` would then switch an interactive session's backend under its feet.
    matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from detector.files import write_atomically  # noqa: E402

DPI = 100  # figure sizes below are in inches, so 100 dpi gives e.g. 1200 x 600 px for (12, 6)


def new_figure(width_in: float, height_in: float, *, constrained: bool = True) -> Figure:
    """A figure attached to an Agg canvas, sized in inches at :data:`DPI`.

    ``constrained`` lays panels out automatically; it costs an extra draw pass, which matters only for
    figures with hundreds of text labels (those set their margins by hand instead).
    """
    figure = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained" if constrained else None)
    FigureCanvasAgg(figure)
    return figure


def panel_grid(
    rows: int,
    cols: int,
    *,
    panel_in: tuple[float, float],
    margins_in: tuple[float, float, float, float] = (0.7, 0.25, 0.55, 0.4),
    gaps_in: tuple[float, float] = (0.7, 0.8),
) -> tuple[Figure, np.ndarray]:
    """A figure holding a ``rows x cols`` grid of equal panels, laid out by fixed inch measures.

    Args:
        panel_in: (width, height) of one panel.
        margins_in: (left, right, bottom, top) around the grid: room for tick labels and titles.
        gaps_in: (horizontal, vertical) space between panels.

    Returns the figure and axes ``[rows, cols]``. Fixed margins rather than constrained layout: that
    layout costs an extra draw pass (~40% of the time of a small multi-panel figure).
    """
    (panel_w, panel_h), (left, right, bottom, top), (gap_w, gap_h) = panel_in, margins_in, gaps_in
    width = left + cols * panel_w + (cols - 1) * gap_w + right
    height = bottom + rows * panel_h + (rows - 1) * gap_h + top
    figure = new_figure(width, height, constrained=False)
    axes = figure.subplots(rows, cols, squeeze=False)
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           wspace=gap_w / panel_w, hspace=gap_h / panel_h)
    return figure, axes


def save_figure(figure: Figure, out_png: str | Path) -> Path:
    """Write ``figure`` as PNG (creating the folder) and return the path."""
    buffer = io.BytesIO()
    figure.savefig(buffer, dpi=DPI, format="png")
    return write_atomically(out_png, buffer.getvalue())  # the figure appears whole or not at all
