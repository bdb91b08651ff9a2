"""Attention diagnostics: token -> cell assignment and aggregation, on hand-built attention matrices."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from atp_jax.diagnostics.attention import (
    ANSWER,
    CELL,
    PREFIX,
    TEMPLATE,
    boundary_attention,
    boundary_pairs,
    cell_attention,
    diagnose,
    evidence_cells,
    token_map,
)
from atp_jax.diagnostics.summary import plot_heatmaps, plot_layers, summarize_pairs, summary_markdown
from atp_jax.tables.layout import build_layout
from atp_jax.tables.table import Example, Table

EXAMPLE = Example(
    "Which team won the most games?",
    Table(
        ["Team", "City", "Wins"],
        [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"], ["Foxes", "Lima", "1"]],
    ),
    ["Bears"],
    "toy",
)
ROW_PERM, COL_PERM = (2, 0, 3, 1), (1, 2, 0)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def layout(smollm2_tokenizer):
    return build_layout(smollm2_tokenizer, EXAMPLE)


@pytest.mark.parametrize("perm", [(None, None), (ROW_PERM, COL_PERM)])
def test_every_token_belongs_to_one_run_and_cells_decode_to_their_text(smollm2_tokenizer, layout, perm):
    ids = layout.ids(*perm)
    tokens = token_map(layout, *perm)
    assert tokens.kind.shape == ids.shape
    assert set(np.unique(tokens.kind)) == {PREFIX, TEMPLATE, CELL, ANSWER}
    assert ((tokens.row >= 0) == (tokens.kind == CELL)).all() and ((tokens.col >= 0) == (tokens.kind == CELL)).all()
    for i, row in enumerate(EXAMPLE.table.cells):
        for j, text in enumerate(row):
            where = np.flatnonzero((tokens.row == i) & (tokens.col == j))
            assert (np.diff(where) == 1).all()  # a cell's tokens are one contiguous run
            assert smollm2_tokenizer.decode(ids[where].tolist()).strip() == text
    assert smollm2_tokenizer.decode(ids[tokens.kind == ANSWER].tolist()).strip() == "Bears"
    prefix = np.flatnonzero(tokens.kind == PREFIX)
    assert (prefix == np.arange(layout.prefix_length)).all()


def test_slots_follow_the_permutation(layout):
    tokens = token_map(layout, ROW_PERM, COL_PERM)
    full_rows = (0, *(r + 1 for r in ROW_PERM))
    for a in range(EXAMPLE.table.n_rows + 1):
        for b in range(EXAMPLE.table.n_cols):
            where = tokens.slot_tokens(a, b)
            assert (tokens.row[where] == full_rows[a]).all() and (tokens.col[where] == COL_PERM[b]).all()


def _uniform_causal(S, layers=2):
    """Each query spreads its attention uniformly over itself and every earlier token."""
    probs = np.tril(np.ones((S, S)))
    probs /= probs.sum(axis=1, keepdims=True)
    return np.stack([probs] * layers)


def test_cell_attention_matches_brute_force_and_preserves_mass(layout):
    tokens = token_map(layout, ROW_PERM, COL_PERM)
    S = len(tokens.kind)
    probs = _uniform_causal(S)
    probs[1] = np.roll(probs[1], 0, axis=0) ** 2  # a second, different layer (rows renormalised below)
    probs[1] /= probs[1].sum(axis=1, keepdims=True)
    out = cell_attention(probs, tokens)
    queries = tokens.answer_queries
    for layer in range(2):
        expected = np.zeros(tokens.shape)
        for q in queries:
            for t in range(S):
                if tokens.kind[t] == CELL:
                    expected[tokens.row[t], tokens.col[t]] += probs[layer, q, t] / len(queries)
        np.testing.assert_allclose(out.cells[layer], expected, atol=1e-12)
        total = out.cells[layer].sum() + out.prefix[layer] + out.template[layer] + out.answer[layer]
        assert abs(total - 1.0) < 1e-12


def test_one_hot_attention_lands_on_the_semantic_cell_whatever_the_order(layout):
    for perm in [(None, None), (ROW_PERM, COL_PERM)]:
        tokens = token_map(layout, *perm)
        S = len(tokens.kind)
        key = np.flatnonzero((tokens.row == 2) & (tokens.col == 0))[-1]  # "Bears"
        probs = np.zeros((1, 3, S, S))  # [L, H, S, S]: heads are averaged
        probs[0, :, :, key] = 1.0
        cells = cell_attention(probs, tokens).cells[0]
        assert cells[2, 0] == pytest.approx(1.0) and cells.sum() == pytest.approx(1.0)


def test_boundary_pairs_straddle_the_markdown_separators(smollm2_tokenizer, layout):
    ids = layout.ids(ROW_PERM, COL_PERM)
    tokens = token_map(layout, ROW_PERM, COL_PERM)
    boundary, within = boundary_pairs(tokens)
    n, m = EXAMPLE.table.n_rows, EXAMPLE.table.n_cols
    assert len(boundary) == n - 1 and len(within) == (n + 1) * (m - 1)
    for query, key in boundary:
        assert key < query and (tokens.kind[key + 1 : query] == TEMPLATE).all()
        assert smollm2_tokenizer.decode(ids[key + 1 : query].tolist()) == " |\n|"
        assert tokens.slot_col[query] == 0 and tokens.slot_col[key] == m - 1
        assert tokens.slot_row[query] == tokens.slot_row[key] + 1
    for query, key in within:
        assert smollm2_tokenizer.decode(ids[key + 1 : query].tolist()) == " |"
        assert tokens.slot_row[query] == tokens.slot_row[key]
    probs = np.zeros((1, len(ids), len(ids)))
    probs[0, boundary[:, 0], boundary[:, 1]] = 0.5
    rb, wr = boundary_attention(probs, tokens)
    assert rb[0] == pytest.approx(0.5) and wr[0] == 0.0


def test_evidence_cells_from_answers_and_from_fetaqa_highlights():
    assert evidence_cells(EXAMPLE) == [(2, 0)]
    assert evidence_cells(Example("q", EXAMPLE.table, ["bears."], "x")) == [(2, 0)]
    # FeTaQA: table_array coordinates with one header row -> body row r is table row r (header = row 0).
    feta = Example("q", EXAMPLE.table, ["A sentence."], "f", meta={"highlighted_cell_ids": [[2, 1], [0, 2]]})
    assert evidence_cells(feta) == [(0, 2), (2, 1)]
    merged = Example(
        "q",
        EXAMPLE.table,
        ["A sentence."],
        "f",
        meta={"highlighted_cell_ids": [[3, 1], [0, 0], [1, 0]], "n_header_rows": 2},
    )
    assert evidence_cells(merged) == [(0, 0), (2, 1)]


def test_diagnose_on_a_tiny_model_gives_normalised_masses(tiny_llama):
    loaded = tiny_llama(num_layers=3)
    clean = diagnose(loaded, EXAMPLE)
    permuted = diagnose(loaded, EXAMPLE, ROW_PERM, COL_PERM)
    for d in (clean, permuted):
        a = d.attention
        np.testing.assert_allclose(a.cells.sum(axis=(1, 2)) + a.prefix + a.template + a.answer, 1.0, atol=1e-5)
        assert a.cells.shape == (3, 5, 3) and d.row_boundary.shape == (3,) and d.evidence == ((2, 0),)
        assert np.isfinite(d.evidence_attention).all()
    assert not np.allclose(clean.attention.cells, permuted.attention.cells)


def _pair(clean_evidence, permuted_evidence, layers=4):
    def side(evidence):
        return {
            "cells": np.full((layers, 2, 2), 0.1).tolist(),
            "evidence_cells": [[1, 0]],
            "evidence": [evidence] * layers,
            "row_boundary": [0.01] * layers,
            "within_row": [0.02] * layers,
        }

    return {"clean": side(clean_evidence), "permuted": side(permuted_evidence), "clean_loss": 1.0, "permuted_loss": 2.0}


def test_summary_averages_over_examples_and_skips_undefined_measures(tmp_path):
    pairs = [_pair(0.3, 0.1), _pair(0.1, 0.2), _pair(float("nan"), float("nan"))]
    summary = summarize_pairs(pairs)
    evidence = summary["measures"]["evidence"]
    assert evidence["examples"] == 2 and evidence["lower_when_permuted_middle"] == 1
    assert evidence["clean_middle"] == pytest.approx(0.2) and evidence["permuted_all_layers"] == pytest.approx(0.15)
    assert summary["measures"]["row_boundary"]["examples"] == 3 and summary["middle_layer"] == 2
    assert summary["answer_loss"] == {"clean": 1.0, "permuted": 2.0, "higher_when_permuted": 3}
    assert "| attention on an evidence cell | 2 | 0.2000 | 0.1500 | 1/2 |" in summary_markdown(summary)
    assert plot_layers(pairs, tmp_path / "layers.png") == [tmp_path / "layers.pdf", tmp_path / "layers.png"]
    plot_heatmaps(pairs[0], [["a", "b"], ["c", "d"]], 2, tmp_path / "heat")
    for name in ("layers", "heat"):
        assert (tmp_path / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (tmp_path / f"{name}.pdf").read_bytes().startswith(b"%PDF")


def test_diagnose_binary_writes_summary_and_pictures_and_resumes(tmp_path):
    out = tmp_path / "diag"
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.diagnose",
        "--model",
        "smollm2-135m-instruct",
        "--num_examples",
        "1",
        "--attack",
        "row_reverse",
        "--heatmaps",
        "1",
        "--output_dir",
        str(out),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "attention across a row boundary" in done.stdout
    pair = json.loads((out / "pairs.jsonl").read_text())
    assert pair["attack"] == "row_reverse" and pair["permuted"]["row_perm"] == pair["clean"]["row_perm"][::-1]
    assert json.loads((out / "summary.json").read_text())["examples"] == 1
    assert (out / "layers.png").exists() and (out / "layers.pdf").exists()
    assert len(list(out.glob("heatmap_*.png"))) == len(list(out.glob("heatmap_*.pdf"))) == 1
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert again.returncode == 0 and (out / "pairs.jsonl").read_text().count("\n") == 1
    assert json.loads((out / "run.json").read_text())["attack"] == "row_reverse"
    other = subprocess.run(
        [*command[:-5], "col_reverse", *command[-4:]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert other.returncode != 0 and "attack" in other.stderr and "--restart" in other.stderr, other.stderr[-2000:]


def test_diagnose_binary_rejects_an_unknown_attack(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "atp_jax.cli.diagnose", "--attack", "nope", "--output_dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0 and "unknown --attack 'nope'" in done.stderr
