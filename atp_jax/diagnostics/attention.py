"""Where the model looks inside a table, and how a permutation moves it (paper appendix A.4).

Every token of a prompt belongs to exactly one *run*: the prefix before the table, a template run
(separators, question, chat markup), a table cell, or the reference answer. ``token_map`` derives that
assignment from the layout under a permutation, in the table's **semantic** coordinates (row ``i``,
column ``j`` of the original table), so a clean and a permuted prompt are compared cell by cell even
though the cells sit in different places.

Measures (all per layer, averaged over heads):

- ``cell_attention``: attention from the answer positions (the last prompt token and the answer tokens
  but the last, i.e. the positions that *produce* the answer) summed over each cell's tokens, averaged
  over those queries -> ``[L, n+1, m]``. With the prefix, template and answer masses it sums to 1.
- ``boundary_attention``: the *row-boundary* measure, attention from the first token of each rendered
  data row's first cell to the last token of the previous data row's last cell, and the *within-row*
  measure, attention from the first token of each cell to the last token of the cell before it in the
  same rendered row. Row boundaries are where a permutation puts unrelated rows next to each other.
- ``evidence_cells``: cells known to hold the evidence, FeTaQA's ``highlighted_cell_ids`` or else the
  cells whose text equals a reference answer under the WTQ normalization.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.data.registry import answer_normalizer
from atp_jax.models.loading import LoadedModel
from atp_jax.models.modeling import Transformer
from atp_jax.tables.layout import SLOT_RUN, Layout, build_layout
from atp_jax.tables.prompt import PromptStyle, encode_text, render_prompt
from atp_jax.tables.table import Example

PREFIX, TEMPLATE, CELL, ANSWER = 0, 1, 2, 3
KIND_NAMES = ("prefix", "template", "cell", "answer")


@dataclasses.dataclass(frozen=True)
class TokenMap:
    """What each token ``[S]`` of a laid-out prompt (+ answer) is.

    kind: ``[S]`` PREFIX | TEMPLATE | CELL | ANSWER.
    row, col: ``[S]`` the cell's semantic coordinates (0 = header row), -1 elsewhere.
    slot_row, slot_col: ``[S]`` where the cell is rendered, -1 elsewhere.
    shape: ``(n + 1, m)``.
    """

    kind: np.ndarray
    row: np.ndarray
    col: np.ndarray
    slot_row: np.ndarray
    slot_col: np.ndarray
    shape: tuple[int, int]

    @property
    def answer_queries(self) -> np.ndarray:
        """Positions ``[A]`` whose outputs predict the answer tokens (each one before its token)."""
        answer = np.flatnonzero(self.kind == ANSWER)
        return answer - 1

    def slot_tokens(self, a: int, b: int) -> np.ndarray:
        """Positions of the cell rendered at slot ``(a, b)``, in order (empty for an empty cell)."""
        return np.flatnonzero((self.slot_row == a) & (self.slot_col == b))


def token_map(layout: Layout, row_perm=None, col_perm=None) -> TokenMap:
    """The run of every token of ``layout.ids(row_perm, col_perm)`` (see ``TokenMap``)."""
    lengths, sem_row, sem_col = layout.runs(row_perm, col_perm)
    is_slot = layout.item_kind == SLOT_RUN
    P = layout.prefix_length

    def per_token(values, fill):
        return np.concatenate([np.full(P, fill), np.repeat(values, lengths)]).astype(np.int32)

    kind = per_token(np.where(is_slot, CELL, TEMPLATE), PREFIX)
    if layout.answer_length:
        kind[-layout.answer_length :] = ANSWER
    return TokenMap(
        kind=kind,
        row=per_token(sem_row, -1),
        col=per_token(sem_col, -1),
        slot_row=per_token(np.where(is_slot, layout.item_row, -1), -1),
        slot_col=per_token(np.where(is_slot, layout.item_col, -1), -1),
        shape=(layout.n_rows + 1, layout.n_cols),
    )


@dataclasses.dataclass(frozen=True)
class CellAttention:
    """Attention mass from the answer positions, per layer ``L``.

    cells: ``[L, n+1, m]`` in semantic coordinates; prefix, template, answer: ``[L]``.
    Per layer, ``cells.sum() + prefix + template + answer == 1``.
    """

    cells: np.ndarray
    prefix: np.ndarray
    template: np.ndarray
    answer: np.ndarray


def cell_attention(probs: np.ndarray, tokens: TokenMap, queries: Sequence[int] | None = None) -> CellAttention:
    """Aggregates attention probabilities ``[L, S, S]`` (or ``[L, H, S, S]``, heads averaged) to cells.

    Rows are queries, columns keys; ``queries`` default to ``tokens.answer_queries``.
    """
    probs = np.asarray(probs, np.float64)
    if probs.ndim == 4:
        probs = probs.mean(axis=1)
    queries = tokens.answer_queries if queries is None else np.asarray(queries)
    if len(queries) == 0:
        raise ValueError("cell_attention needs query positions: the layout has no answer tokens")
    keys = probs[:, queries, :].mean(axis=1)  # [L, S]
    L = keys.shape[0]
    cells = np.zeros((L, *tokens.shape))
    where = np.flatnonzero(tokens.kind == CELL)
    np.add.at(cells, (slice(None), tokens.row[where], tokens.col[where]), keys[:, where])
    mass = {k: keys[:, tokens.kind == k].sum(axis=1) for k in (PREFIX, TEMPLATE, ANSWER)}
    return CellAttention(cells=cells, prefix=mass[PREFIX], template=mass[TEMPLATE], answer=mass[ANSWER])


def boundary_pairs(tokens: TokenMap) -> tuple[np.ndarray, np.ndarray]:
    """(query, key) position pairs ``[K, 2]`` of the row-boundary and of the within-row measure.

    Row boundary: first token of data row ``a``'s first non-empty cell -> last token of data row
    ``a - 1``'s last non-empty cell (``a = 2..n``: the boundaries between two data rows, which are the ones
    a permutation creates; the header's is left out, as is its ``|---|`` rule).
    Within row: first token of each cell -> last token of the previous non-empty cell of its row.
    """
    n_slots, m = tokens.shape
    runs = [[tokens.slot_tokens(a, b) for b in range(m)] for a in range(n_slots)]
    rows = [[r for r in row if len(r)] for row in runs]
    boundary = [(rows[a][0][0], rows[a - 1][-1][-1]) for a in range(2, n_slots) if rows[a] and rows[a - 1]]
    within = [(row[b][0], row[b - 1][-1]) for row in rows for b in range(1, len(row))]
    return np.asarray(boundary, np.int64).reshape(-1, 2), np.asarray(within, np.int64).reshape(-1, 2)


def boundary_attention(probs: np.ndarray, tokens: TokenMap) -> tuple[np.ndarray, np.ndarray]:
    """Mean attention ``[L]`` across row boundaries and within rows (see ``boundary_pairs``)."""
    probs = np.asarray(probs, np.float64)
    if probs.ndim == 4:
        probs = probs.mean(axis=1)
    boundary, within = boundary_pairs(tokens)

    def mean(pairs):
        if not len(pairs):
            return np.full(probs.shape[0], np.nan)
        return probs[:, pairs[:, 0], pairs[:, 1]].mean(axis=1)

    return mean(boundary), mean(within)


def evidence_cells(example: Example) -> list[tuple[int, int]]:
    """Cells ``(i, j)`` (0 = header row) that hold the answer's evidence; may be empty.

    FeTaQA's ``meta.highlighted_cell_ids`` are in ``table_array`` coordinates (header rows first);
    otherwise a cell counts when its normalized text (the dataset's normaliser) equals a normalized reference
    answer.
    """
    table = example.table
    highlighted = example.meta.get("highlighted_cell_ids") if example.meta else None
    if highlighted:
        header_rows = int(example.meta.get("n_header_rows", 1))
        cells = {(max(0, int(r) - header_rows + 1), int(c)) for r, c in highlighted}
        return sorted((i, j) for i, j in cells if i <= table.n_rows and j < table.n_cols)
    normalize = answer_normalizer(example.dataset)
    targets = {normalize(a) for a in example.answers if normalize(a)}
    return [(i, j) for i, row in enumerate(table.cells) for j, text in enumerate(row) if normalize(text) in targets]


@jax.jit
def _head_mean_attentions(model: Transformer, ids):
    """Head-averaged attention probabilities ``[L, S, S]`` of one sequence ``ids`` ``[S]``."""
    S = ids.shape[0]
    out = model(
        model.embed(ids[None]),
        jnp.arange(S)[None],
        jnp.ones((1, S), bool),
        logits_positions=jnp.zeros((1, 1), jnp.int32),
        return_attentions=True,
    )
    return out.attentions[:, 0].mean(axis=1)


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """Attention diagnostics of one example under one order (arrays per layer ``L``)."""

    example_id: str
    row_perm: tuple[int, ...]
    col_perm: tuple[int, ...]
    attention: CellAttention
    row_boundary: np.ndarray
    within_row: np.ndarray
    evidence: tuple[tuple[int, int], ...]

    @property
    def evidence_attention(self) -> np.ndarray:
        """``[L]`` mean attention mass per evidence cell (NaN without evidence cells)."""
        if not self.evidence:
            return np.full(self.attention.cells.shape[0], np.nan)
        rows, cols = zip(*self.evidence)
        return self.attention.cells[:, list(rows), list(cols)].mean(axis=1)


def diagnose(
    loaded: LoadedModel,
    example: Example,
    row_perm=None,
    col_perm=None,
    style: PromptStyle = PromptStyle(),
    layout: Layout | None = None,
) -> Diagnosis:
    """Runs the model on ``example`` with its table in the given order and measures its attention.

    The sequence is the prompt plus the reference answer (teacher forcing), so a clean and a permuted
    prompt are read at the same answer tokens. Needs a layout whose per-cell tokens are exactly the
    re-tokenized text (markdown; see ``Layout.exact``), else the cell assignment would be guesswork.
    ``layout``: ``build_layout(loaded.tokenizer, example, style=style)``, passed in to share it between the
    orders of one example.
    """
    if not example.answers:
        raise ValueError(f"example {example.id!r} has no reference answer: attention is read at its tokens")
    if layout is None:
        layout = build_layout(loaded.tokenizer, example, style=style)
    n, m = layout.n_rows, layout.n_cols
    rp = tuple(range(n)) if row_perm is None else tuple(int(x) for x in row_perm)
    cp = tuple(range(m)) if col_perm is None else tuple(int(x) for x in col_perm)
    ids = layout.ids(rp, cp)
    permuted = example.table.permute(rp, cp)
    text_ids = encode_text(loaded.tokenizer, render_prompt(loaded.tokenizer, example, permuted, style).text)
    if ids[: len(ids) - layout.answer_length].tolist() != text_ids:
        raise ValueError(
            f"example {example.id!r}: per-cell tokens differ from the re-tokenized {style.linearization} text "
            "in this order, so tokens cannot be assigned to cells exactly; use the markdown linearization"
        )
    tokens = token_map(layout, rp, cp)
    probs = np.asarray(_head_mean_attentions(loaded.model, jnp.asarray(ids)))
    boundary, within = boundary_attention(probs, tokens)
    return Diagnosis(
        example_id=example.id,
        row_perm=rp,
        col_perm=cp,
        attention=cell_attention(probs, tokens),
        row_boundary=boundary,
        within_row=within,
        evidence=tuple(evidence_cells(example)),
    )
