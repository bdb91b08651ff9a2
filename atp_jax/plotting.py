"""Figures without pyplot: one helper every module that draws shares."""

from __future__ import annotations


def new_figure(width: float, height: float):
    """A matplotlib Figure of ``width`` x ``height`` inches with an Agg canvas (PNG output, no pyplot)."""
    # The object API with an explicit Agg canvas: no pyplot, no global backend to switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure
