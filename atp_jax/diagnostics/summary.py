"""Clean-vs-permuted attention diagnostics over many examples: a Table-3-like summary and pictures.

A *pair* is the diagnosis of one example under its original order and under an adversarial one.
Everything here is host-side numpy and matplotlib over ``Diagnosis`` objects (or their JSON form).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from atp_jax.diagnostics.attention import Diagnosis
from atp_jax.plotting import new_figure, save_figure
from atp_jax.stats import bootstrap_interval, has_interval

MEASURES = ("evidence", "row_boundary", "within_row")
_LABELS = {
    "evidence": "attention on an evidence cell",
    "row_boundary": "attention across a row boundary",
    "within_row": "attention within a row",
}


def diagnosis_json(d: Diagnosis) -> dict:
    """A diagnosis as plain JSON (per-layer lists; ``cells`` ``[L][n+1][m]``)."""
    return {
        "id": d.example_id,
        "row_perm": list(d.row_perm),
        "col_perm": list(d.col_perm),
        "evidence_cells": [list(c) for c in d.evidence],
        "cells": d.attention.cells.tolist(),
        "prefix": d.attention.prefix.tolist(),
        "template": d.attention.template.tolist(),
        "answer": d.attention.answer.tolist(),
        "evidence": d.evidence_attention.tolist(),
        "row_boundary": d.row_boundary.tolist(),
        "within_row": d.within_row.tolist(),
    }


def _per_layer(pairs: Sequence[dict], measure: str, which: str) -> np.ndarray:
    """``[E, L]`` of one measure over the pairs (NaN where an example has none, e.g. no evidence)."""
    return np.asarray([p[which][measure] for p in pairs], np.float64)


def summarize_pairs(pairs: Sequence[dict]) -> dict:
    """Table-3-like figures from pairs ``{"clean": diagnosis_json, "permuted": ..., ...}``.

    For each measure: the mean over examples at the middle layer and over all layers, clean and
    permuted, the number of examples it is defined for, and how many of them went down.
    """
    if not pairs:
        raise ValueError("summarize_pairs: no diagnosed examples")
    layers = len(pairs[0]["clean"]["row_boundary"])
    middle = layers // 2
    out = {"examples": len(pairs), "layers": layers, "middle_layer": middle, "measures": {}}
    for measure in MEASURES:
        clean, permuted = _per_layer(pairs, measure, "clean"), _per_layer(pairs, measure, "permuted")
        defined = ~np.isnan(clean).any(axis=1) & ~np.isnan(permuted).any(axis=1)
        c, p = clean[defined], permuted[defined]
        out["measures"][measure] = {
            "examples": int(defined.sum()),
            "clean_middle": float(c[:, middle].mean()) if len(c) else None,
            "permuted_middle": float(p[:, middle].mean()) if len(p) else None,
            "clean_all_layers": float(c.mean()) if len(c) else None,
            "permuted_all_layers": float(p.mean()) if len(p) else None,
            "lower_when_permuted_middle": int((p[:, middle] < c[:, middle]).sum()),
        }
    losses = [(p["clean_loss"], p["permuted_loss"]) for p in pairs if "clean_loss" in p]
    if losses:
        clean_loss, permuted_loss = np.asarray(losses).T
        out["answer_loss"] = {
            "clean": float(clean_loss.mean()),
            "permuted": float(permuted_loss.mean()),
            "higher_when_permuted": int((permuted_loss > clean_loss).sum()),
        }
    return out


def summary_markdown(summary: dict) -> str:
    """The summary as a markdown table: measure x (clean, permuted) at the middle layer and over all layers."""
    mid = summary["middle_layer"]

    def fmt(x):
        return "n/a" if x is None else f"{x:.4f}"

    lines = [
        f"| measure (mean over examples) | examples | clean, layer {mid} | permuted, layer {mid} | lower when permuted"
        " | clean, all layers | permuted, all layers |",
        "|---|---|---|---|---|---|---|",
    ]
    for measure, m in summary["measures"].items():
        lines.append(
            f"| {_LABELS[measure]} | {m['examples']} | {fmt(m['clean_middle'])} | {fmt(m['permuted_middle'])}"
            f" | {m['lower_when_permuted_middle']}/{m['examples']} | {fmt(m['clean_all_layers'])}"
            f" | {fmt(m['permuted_all_layers'])} |"
        )
    if "answer_loss" in summary:
        a = summary["answer_loss"]
        lines.append(
            f"\nReference-answer CE: clean {a['clean']:.3f}, permuted {a['permuted']:.3f} "
            f"(higher when permuted on {a['higher_when_permuted']}/{summary['examples']})."
        )
    return "\n".join(lines) + "\n"


def plot_layers(pairs: Sequence[dict], path: str | os.PathLike, title: str = "") -> list[os.PathLike]:
    """Like the paper's Figure 5, as PDF and PNG (``path`` with each suffix): each measure per layer, the mean
    over the examples it is defined for (n in each panel's title) with a 95% BCa bootstrap band, clean vs
    permuted."""
    figure = new_figure(4.4 * len(MEASURES), 3.6)
    axes = figure.subplots(1, len(MEASURES))
    for ax, measure in zip(axes, MEASURES):
        clean, permuted = _per_layer(pairs, measure, "clean"), _per_layer(pairs, measure, "permuted")
        defined = ~np.isnan(clean).any(axis=1) & ~np.isnan(permuted).any(axis=1)
        for which, values, style in (("clean", clean, "-"), ("permuted", permuted, "--")):
            values = values[defined]
            layers = np.arange(values.shape[1])
            (line,) = ax.plot(layers, values.mean(axis=0), style, marker=".", label=f"{which} order")
            bands = np.array([bootstrap_interval(values[:, layer], seed=layer) for layer in layers])
            if all(has_interval(low, high) for low, high in bands):
                ax.fill_between(layers, bands[:, 0], bands[:, 1], color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("layer")
        ax.set_ylabel("attention weight (mean, 95% BCa band)")
        ax.set_title(f"{_LABELS[measure]} (n={int(defined.sum())})", fontsize="medium")
        ax.legend(fontsize="small")
    if title:
        figure.suptitle(title)
    return save_figure(figure, path)


def plot_heatmaps(
    pair: dict, table_cells: Sequence[Sequence[str]], layer: int, path: str | os.PathLike
) -> list[os.PathLike]:
    """Like the paper's Figure 4, as PDF and PNG: one example's cell attention at ``layer``, clean vs permuted,
    in the table's own coordinates (so the same cell is in the same place in both panels); evidence cells
    boxed in red; one colour scale for both panels."""
    clean = np.asarray(pair["clean"]["cells"][layer])
    permuted = np.asarray(pair["permuted"]["cells"][layer])
    top = max(clean.max(), permuted.max())
    rows, cols = clean.shape
    figure = new_figure(2 * (1.4 + 0.9 * cols), 1.3 + 0.35 * rows)
    axes = figure.subplots(1, 2)
    for ax, values, name in ((axes[0], clean, "original order"), (axes[1], permuted, "adversarial order")):
        image = ax.imshow(values, vmin=0, vmax=top, cmap="viridis", aspect="auto")
        ax.set_xticks(range(cols), [str(h)[:12] for h in table_cells[0]], rotation=30, ha="right", fontsize="x-small")
        ax.set_yticks(range(rows), ["header", *(f"row {i}" for i in range(1, rows))], fontsize="x-small")
        ax.set_xlabel("column (original position, header text)", fontsize="small")
        ax.set_ylabel("row (original position)", fontsize="small")
        for i, j in pair["clean"]["evidence_cells"]:
            ax.add_patch(_box(i, j))
        ax.set_title(f"{name}, layer {layer}", fontsize="small")
    colorbar = figure.colorbar(image, ax=axes, shrink=0.8)
    colorbar.set_label(
        "attention from the answer to the cell\n(mean over heads and answer positions)", fontsize="small"
    )
    figure.suptitle(f"example {pair.get('id', '?')} (one example; evidence cells boxed in red)", fontsize="small")
    return save_figure(figure, path)


def _box(i: int, j: int):
    from matplotlib.patches import Rectangle

    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.5)
