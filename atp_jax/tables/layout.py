"""The token layout of a table prompt under row/column permutations, with static shapes.

A prompt is cut into *template runs* (text that never moves: chat markup, instruction, separators)
and *slot runs* (the cell occupying slot ``(a, b)`` of the rendered table). Every cell is tokenized
on its own, once; a permutation ``(σ_r, σ_c)`` (header pinned: ``σ_r(0) = 0``) only decides which
cell fills which slot. The token count is therefore the same for every permutation, so one compiled
attack step serves all steps and restarts of a table.

Sequence = ``prefix`` (template run before the first cell: system prompt, instruction, ``Table:``)
followed by the ``body``: slot runs and template runs in rendering order, then the answer. The
prefix never changes, so its keys/values can be computed once.

For hard permutations, ``body_source`` maps every body position to a *bank* index::

    bank = [template tokens (Tt)] ++ [slot tokens, (n+1) · m · L_max, slot-major]

so ``bank[body_source]`` is the permuted body, whether the bank holds token ids (hard) or mixed
cell embeddings ``Σ D_r[a, i] E[i, j, k] D_c[j, b]`` (soft, paper Eq. 11).

Tokenization: a cell run carries the whitespace that precedes every cell in the style (markdown's
``" "`` after ``|``), which keeps BPE pre-token boundaries where the full string has them. Where the
per-cell tokens differ from tokenizing the whole text anyway (token merges across a boundary,
chiefly in csv/html/json), ``Layout.is_compositional`` says so for the original order. Only markdown is
trusted beyond it (``Layout.exact``): there every cell sits between ``"|"`` and ``" |"``, and on all
1,569 unique WTQ/TAT-QA/FeTaQA dev tables with both zoo tokenizers, no original or permuted order
mismatched (``atp-layout-mismatch``), while in csv/json a cell such as ``""`` or ``#`` can
merge with a different neighbour after a permutation. Reported numbers always come from re-rendering
and re-tokenizing the permuted text.

Padding to a shape bucket (``atp_jax.tables.buckets``) is invisible: pad rows and columns are cells of length
0 that no run refers to, pad runs are template runs of length 0 (``place`` skips empty runs), pad template
and cell tokens are never gathered, and body positions past the real body (after the answer) take bank
index 0 — under causal attention nothing real attends to them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from atp_jax.tables.buckets import Sizes
from atp_jax.tables.prompt import Prompt, PromptStyle, encode_text, reference_answer, render_prompt
from atp_jax.tables.table import Example, Table

TEMPLATE_RUN, SLOT_RUN = 0, 1


@dataclasses.dataclass(frozen=True)
class Layout:
    """Token layout of one example's prompt. Arrays are numpy; ``n`` data rows, ``m`` columns.

    prefix_ids: ``[P]`` tokens before the first cell (never move).
    template_ids: ``[Tt]`` all later template tokens, concatenated (incl. the answer at the end).
    cell_ids: ``[n+1, m, L]`` each cell's tokens (row 0 = header), padded with 0.
    cell_lengths: ``[n+1, m]`` token count of each cell.
    item_kind, item_start, item_length, item_row, item_col: ``[I]`` the body's runs in order;
      templates use start/length into ``template_ids``, slots use row/col (slot coordinates).
    answer_ids: ``[A]`` reference answer tokens (the last A tokens of the body); empty without one.
    """

    prefix_ids: np.ndarray
    template_ids: np.ndarray
    cell_ids: np.ndarray
    cell_lengths: np.ndarray
    item_kind: np.ndarray
    item_start: np.ndarray
    item_length: np.ndarray
    item_row: np.ndarray
    item_col: np.ndarray
    answer_ids: np.ndarray
    prompt: Prompt
    is_compositional: bool

    @property
    def exact(self) -> bool:
        """Whether the layout's tokens can stand for the re-tokenized text of *every* order (see module doc)."""
        return self.is_compositional and self.prompt.table.style == "markdown"

    @property
    def n_rows(self) -> int:
        return self.cell_ids.shape[0] - 1

    @property
    def n_cols(self) -> int:
        return self.cell_ids.shape[1]

    @property
    def max_cell_tokens(self) -> int:
        return self.cell_ids.shape[2]

    @property
    def prefix_length(self) -> int:
        return len(self.prefix_ids)

    @property
    def body_length(self) -> int:
        """Static body length: template tokens plus every slot's cell tokens."""
        slots = self.item_kind == SLOT_RUN
        return len(self.template_ids) + int(self.cell_lengths[self.item_row[slots], self.item_col[slots]].sum())

    @property
    def seq_length(self) -> int:
        return self.prefix_length + self.body_length

    @property
    def answer_length(self) -> int:
        return len(self.answer_ids)

    def answer_logit_positions(self) -> np.ndarray:
        """Body indices ``[A]`` whose logits predict the answer tokens (each one before its token)."""
        return np.arange(self.body_length - self.answer_length - 1, self.body_length - 1)

    @property
    def sizes(self) -> Sizes:
        """The layout's own (unpadded) sizes."""
        return Sizes(
            rows=self.n_rows + 1,
            cols=self.n_cols,
            cell_tokens=self.max_cell_tokens,
            runs=len(self.item_kind),
            template=len(self.template_ids),
            body=self.body_length,
            prefix=self.prefix_length,
            answer=self.answer_length,
        )

    def static_sizes(self, sizes: Sizes | None = None) -> dict[str, int]:
        """The keyword arguments of ``place`` that fix shapes (static under ``jit``), padded to ``sizes``."""
        sizes = sizes or self.sizes
        return {"body_length": sizes.body, "max_cell_tokens": sizes.cell_tokens}

    def arrays(self, xp=jnp, sizes: Sizes | None = None) -> dict:
        """The integer arrays ``place`` needs, padded to ``sizes`` (default: none): device arrays for ``jit``
        (default), or ``xp=np``. Pad cells have length 0; pad runs are empty template runs."""
        sizes = sizes or self.sizes
        runs = lambda a: pad_to(a, (sizes.runs,))  # noqa: E731  (TEMPLATE_RUN = 0: pads are empty templates)
        arrays = {
            "template_length": np.int32(sizes.template),
            "cell_lengths": pad_to(self.cell_lengths, (sizes.rows, sizes.cols)).astype(np.int32),
            "item_kind": runs(self.item_kind).astype(np.int32),
            "item_start": runs(self.item_start).astype(np.int32),
            "item_length": runs(self.item_length).astype(np.int32),
            "item_row": runs(self.item_row).astype(np.int32),
            "item_col": runs(self.item_col).astype(np.int32),
        }
        # A transfer, not jnp.asarray: that compiles a program per shape to stage each array (one per bucket).
        return arrays if xp is np else jax.device_put(arrays)

    def token_arrays(self, sizes: Sizes | None = None) -> dict[str, np.ndarray]:
        """The token ids an attack embeds, padded to ``sizes`` (default: none); numpy.

        prefix_ids ``[P]``, template_ids ``[Tt]``, cell_ids ``[n+1, m, L]`` and cell_mask (True at a cell's own
        tokens) padded with 0 / False; answer_ids and answer_positions ``[A]`` (body indices whose logits
        predict each answer token) padded by repeating the last real one, answer_mask ``[A]`` False there.
        """
        sizes = sizes or self.sizes
        real = np.ones(self.answer_length, bool)
        cells = self.cell_lengths[..., None] > np.arange(self.max_cell_tokens)
        return {
            "prefix_ids": pad_to(self.prefix_ids, (sizes.prefix,)),
            "template_ids": pad_to(self.template_ids, (sizes.template,)),
            "cell_ids": pad_to(self.cell_ids, (sizes.rows, sizes.cols, sizes.cell_tokens)),
            "cell_mask": pad_to(cells, (sizes.rows, sizes.cols, sizes.cell_tokens)),
            "answer_ids": pad_to(self.answer_ids, (sizes.answer,), edge=True),
            "answer_positions": pad_to(self.answer_logit_positions(), (sizes.answer,), edge=True),
            "answer_mask": pad_to(real, (sizes.answer,)),
        }

    def runs(self, row_perm=None, col_perm=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The body's runs ``[I]`` under an order: token counts, and each slot run's cell (row, col).

        Rows/columns are the table's own (semantic) coordinates, 0 = header row; -1 for template runs.
        """
        n, m = self.n_rows, self.n_cols
        rows = full_row_perm(np.arange(n) if row_perm is None else np.asarray(row_perm))
        cols = np.arange(m) if col_perm is None else np.asarray(col_perm)
        is_slot = self.item_kind == SLOT_RUN
        row = np.where(is_slot, rows[self.item_row], -1)
        col = np.where(is_slot, cols[self.item_col], -1)
        length = np.where(is_slot, self.cell_lengths[np.maximum(row, 0), np.maximum(col, 0)], self.item_length)
        return length, row, col

    def ids(self, row_perm=None, col_perm=None) -> np.ndarray:
        """Full token ids ``[S]`` of the prompt + answer with the cells placed by the permutation."""
        n, m = self.n_rows, self.n_cols
        rp = np.arange(n) if row_perm is None else np.asarray(row_perm)
        cp = np.arange(m) if col_perm is None else np.asarray(col_perm)
        source = place(self.arrays(np), rp, cp, **self.static_sizes())
        slot_ids = self.cell_ids[full_row_perm(rp)][:, cp]
        bank = np.concatenate([self.template_ids, slot_ids.reshape(-1)])
        return np.concatenate([self.prefix_ids, bank[source]])


def _array_module(x):
    return np if isinstance(x, np.ndarray) else jnp


def pad_to(array: np.ndarray, shape: tuple[int, ...], edge: bool = False) -> np.ndarray:
    """``array`` padded at the end of each axis to ``shape``: with zeros, or (``edge``) its last entries."""
    array = np.asarray(array)
    widths = [(0, size - have) for size, have in zip(shape, array.shape)]
    if any(w < 0 for _, w in widths):
        raise ValueError(f"cannot pad an array of shape {array.shape} to the smaller {shape}")
    if edge and array.size:
        return np.pad(array, widths, mode="edge")
    return np.pad(array, widths)


def pad_perms(perms, size: int) -> np.ndarray:
    """Permutations ``[..., k]`` extended to ``[..., size]`` with the pads fixed in place (``k, …, size-1``)."""
    perms = np.asarray(perms, np.int32)
    pads = np.arange(perms.shape[-1], size, dtype=np.int32)
    return np.concatenate([perms, np.broadcast_to(pads, (*perms.shape[:-1], len(pads)))], axis=-1)


def full_row_perm(row_perm):
    """σ_r over all n+1 rows from a permutation of the n data rows (header pinned at 0)."""
    xp = _array_module(row_perm)
    return xp.concatenate([xp.zeros((1,), row_perm.dtype), row_perm + 1])


def _run_lengths(arrays: dict, row_perm, col_perm):
    """Token count ``[I]`` of every run (cell slots and template text) under an order."""
    xp = _array_module(row_perm)
    rows = full_row_perm(row_perm)
    kind, item_row, item_col = arrays["item_kind"], arrays["item_row"], arrays["item_col"]
    slot_length = arrays["cell_lengths"][rows[item_row], col_perm[item_col]]
    return xp.where(kind == SLOT_RUN, slot_length, arrays["item_length"])


def _covering_runs(length, body_length: int):
    """For every body position ``t < body_length``: the run covering it and the offset in that run."""
    xp = _array_module(length)
    ends = xp.cumsum(length)
    t = xp.arange(body_length)
    # The run covering position t (skips empty runs); past the real body, the last run.
    item = xp.minimum(xp.searchsorted(ends, t, side="right"), len(ends) - 1)
    return item, t - (ends[item] - length[item]), ends


def place(arrays: dict, row_perm, col_perm, *, body_length: int, max_cell_tokens: int):
    """Bank indices ``[body_length]`` of the body for hard permutations.

    Pure array code: JAX (jit/vmap-able) for JAX inputs, numpy for numpy inputs (``Layout.ids``).

    Args:
      arrays: ``Layout.arrays()`` (padded or not).
      row_perm: int ``[n]``, data row ``row_perm[a]`` goes to slot row ``a + 1`` (pad rows: ``row_perm[a] = a``).
      col_perm: int ``[m]``, column ``col_perm[b]`` goes to slot column ``b`` (pad columns likewise).
      body_length, max_cell_tokens: the static sizes (``Layout.static_sizes``); positions past the real
        body get bank index 0.
    """
    xp = _array_module(row_perm)
    kind, item_row, item_col = arrays["item_kind"], arrays["item_row"], arrays["item_col"]
    item, offset, ends = _covering_runs(_run_lengths(arrays, row_perm, col_perm), body_length)
    n_cols = arrays["cell_lengths"].shape[1]
    slot_index = (item_row[item] * n_cols + item_col[item]) * max_cell_tokens + offset
    template_index = arrays["item_start"][item] + offset
    source = xp.where(kind[item] == SLOT_RUN, arrays["template_length"] + slot_index, template_index)
    return xp.where(xp.arange(body_length) < ends[-1], source, 0)


def run_positions(arrays: dict, row_perm, col_perm, run_lengths, *, body_length: int):
    """Body position ids ``[body_length]`` (from 0) of the order ``(row_perm, col_perm)`` laid out as ``place``
    lays it out, except that every run — each cell slot and each piece of template text — starts where runs of
    lengths ``run_lengths [I]`` (integer or fractional) would put it, its tokens counting on from there.

    With the order's own run lengths these are ``0, 1, 2, ...``; ``anchored_positions`` and the soft positions of
    a relaxation (``attack.problem.soft_positions``) are the two other uses.
    """
    item, offset, _ = _covering_runs(_run_lengths(arrays, row_perm, col_perm), body_length)
    starts = _array_module(run_lengths).cumsum(run_lengths) - run_lengths
    return starts[item] + offset


def anchored_positions(arrays: dict, row_perm, col_perm, anchor_rows, anchor_cols, *, body_length: int):
    """``run_positions`` with every run starting where it starts under the anchor order.

    With the anchor the original order, a reorder then changes which content sits in which slot but shifts no
    token's position: where two swapped cells differ in length, ids overlap or leave a gap (RoPE sees only
    differences of ids, so both are well defined). Under the anchor order itself the ids are ``0, 1, 2, ...``.
    """
    anchor_lengths = _run_lengths(arrays, anchor_rows, anchor_cols)
    return run_positions(arrays, row_perm, col_perm, anchor_lengths, body_length=body_length)


def fixed_slot_positions(arrays: dict, row_perm, col_perm, *, body_length: int):
    """``run_positions`` with every cell slot as long as the table's longest cell: a reorder then exchanges the
    contents of slots and shifts no position (a cell shorter than its slot leaves a gap in the ids after its
    tokens; RoPE sees only differences of ids). The same ids for every order."""
    lengths = arrays["cell_lengths"]  # pad cells are 0 long: the longest is a real cell
    slots = _array_module(lengths).full_like(lengths, lengths.max())
    return run_positions(arrays, row_perm, col_perm, slot_run_lengths(arrays, slots), body_length=body_length)


def slot_run_lengths(arrays: dict, slot_lengths):
    """Run lengths ``[I]`` when cell slot ``(a, b)`` holds ``slot_lengths[a, b]`` tokens (template runs as they
    are)."""
    xp = _array_module(slot_lengths)
    slot = slot_lengths[arrays["item_row"], arrays["item_col"]]
    return xp.where(arrays["item_kind"] == SLOT_RUN, slot, arrays["item_length"])


def build_layout(
    tokenizer,
    example: Example,
    table: Table | None = None,
    style: PromptStyle = PromptStyle(),
    with_answer: bool = True,
) -> Layout:
    """Tokenizes ``example``'s prompt run by run (see the module docstring).

    ``with_answer=False`` leaves the answer out (label-free objectives, generation).
    """
    table = example.table if table is None else table
    prompt = render_prompt(tokenizer, example, table, style)
    # Template text before each cell piece, and the template text after the last one.
    preceding, pending = [], prompt.before
    for segment in prompt.table.segments:
        if segment.is_cell:
            preceding.append(pending)
            pending = ""
        else:
            pending += segment.text
    trailing = pending + prompt.after
    # Spaces that precede every cell move into the cell's run: " Alice" is one pre-token, "|" another.
    tails = {text[len(text.rstrip(" ")) :] for text in preceding}
    tail = tails.pop() if len(tails) == 1 else ""

    n, m = table.n_rows, table.n_cols
    cell_tokens = [[encode_text(tokenizer, tail + _cell_text(prompt, i, j)) for j in range(m)] for i in range(n + 1)]
    lengths = np.array([[len(t) for t in row] for row in cell_tokens], np.int32)
    cell_ids = np.zeros((n + 1, m, max(1, int(lengths.max()))), np.int32)
    for i in range(n + 1):
        for j in range(m):
            cell_ids[i, j, : lengths[i, j]] = cell_tokens[i][j]

    answer_ids = encode_text(tokenizer, reference_answer(example)) if with_answer else []
    template: list[int] = []
    items: list[tuple[int, int, int, int, int]] = []  # kind, start, length, row, col

    def add_template(tokens):
        items.append((TEMPLATE_RUN, len(template), len(tokens), 0, 0))
        template.extend(tokens)

    cells = [s.cell for s in prompt.table.segments if s.is_cell]
    for k, (i, j) in enumerate(cells):
        if k > 0:
            add_template(encode_text(tokenizer, preceding[k][: len(preceding[k]) - len(tail)]))
        items.append((SLOT_RUN, 0, 0, i, j))
    add_template(encode_text(tokenizer, trailing))
    if with_answer:
        add_template(answer_ids)
    kind, start, length, row, col = (np.asarray(column, np.int32) for column in zip(*items))
    layout = Layout(
        prefix_ids=np.asarray(encode_text(tokenizer, preceding[0][: len(preceding[0]) - len(tail)]), np.int32),
        template_ids=np.asarray(template, np.int32),
        cell_ids=cell_ids,
        cell_lengths=lengths,
        item_kind=kind,
        item_start=start,
        item_length=length,
        item_row=row,
        item_col=col,
        answer_ids=np.asarray(answer_ids, np.int32),
        prompt=prompt,
        is_compositional=True,
    )
    whole = encode_text(tokenizer, prompt.text) + list(answer_ids)
    return dataclasses.replace(layout, is_compositional=layout.ids().tolist() == whole)


def _cell_text(prompt: Prompt, i: int, j: int) -> str:
    start, end = prompt.table.cell_spans[i][j]
    return prompt.table.text[start:end]
