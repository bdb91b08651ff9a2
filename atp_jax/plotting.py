"""Figures without pyplot: the helpers every module that draws shares (a new figure; saving it as PDF and PNG)."""

from __future__ import annotations

import os
from pathlib import Path


def new_figure(width: float, height: float):
    """A matplotlib Figure of ``width`` x ``height`` inches with an Agg canvas (PNG output, no pyplot)."""
    # The object API with an explicit Agg canvas: no pyplot, no global backend to switch.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


FORMATS = ("pdf", "png")


def save_figure(figure, path: str | os.PathLike) -> list[Path]:
    """Writes ``figure`` as PDF (vector, for papers) and PNG (150 dpi, for pages) beside each other: ``path``
    with each suffix (a ``.png``/``.pdf`` suffix given is replaced). Returns the paths written."""
    stem = Path(path)
    if stem.suffix.lower() in {f".{f}" for f in FORMATS}:
        stem = stem.with_suffix("")
    written = []
    for fmt in FORMATS:
        target = stem.parent / f"{stem.name}.{fmt}"
        # A fixed creation date keeps a regenerated PDF byte-identical when the figure is.
        figure.savefig(target, dpi=150, metadata={"CreationDate": None} if fmt == "pdf" else None)
        written.append(target)
    return written
