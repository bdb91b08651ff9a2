"""Shape buckets: the sizes a prompt's arrays are padded up to, so that one compiled program serves every
example whose sizes fall in the same bucket.

Under ``jit`` every distinct array shape is its own XLA program. A table's body length, row and column
counts, tokens per cell, answer length and prefix length all enter the attack's shapes, so without
padding each question compiles its own programs. A ``BucketGrid`` maps each of those sizes up the rungs of
a ``Ladder`` (geometric steps); the padding is invisible to every result (see ``Layout.arrays`` and
``atp_jax.attack.problem`` for how each padded slot is kept inert), so the grid only trades padded compute
against compiles. Why the default rungs are where they are: ``docs/benchmarks/buckets.md``.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Ladder:
    """Sizes ``minimum · 2^k · (1 + j / steps_per_octave)`` for ``k ≥ 0``, ``0 ≤ j < steps_per_octave``.

    ``steps_per_octave=1`` gives powers of two times ``minimum`` (64, 128, 256, …); 2 gives the half
    octaves (64, 96, 128, 192, 256, …): at most 50% padding, about 20% on average over smooth
    distributions. ``fit(size)`` is the smallest rung ≥ ``size``.
    """

    minimum: int
    steps_per_octave: int = 1

    def __post_init__(self):
        if self.minimum < 1 or self.steps_per_octave < 1 or self.minimum % self.steps_per_octave:
            raise ValueError(
                f"Ladder(minimum={self.minimum}, steps_per_octave={self.steps_per_octave}): the minimum must be "
                "a positive multiple of the steps per octave (so that every rung is an integer)"
            )

    def fit(self, size: int) -> int:
        octave = self.minimum
        while True:
            for j in range(self.steps_per_octave):
                rung = octave * (self.steps_per_octave + j) // self.steps_per_octave
                if rung >= size:
                    return rung
            octave *= 2


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The sizes that fix the shapes of one attack problem's arrays (real or padded).

    rows: slot rows, header included (``n + 1``); cols: columns (``m``); cell_tokens: tokens per cell slot
    (``L``); runs: the body's template and slot runs (``I``); template: template tokens (``Tt``); body: body
    tokens (``S``: table, question, answer); prefix: tokens before the first cell (``P``); answer: reference
    answer tokens (``A``).
    """

    rows: int
    cols: int
    cell_tokens: int
    runs: int
    template: int
    body: int
    prefix: int
    answer: int


@dataclasses.dataclass(frozen=True)
class BucketGrid:
    """How far each size is padded. A ``None`` ladder keeps that size exact.

    The transformer's cost grows with ``body``, ``prefix`` and ``answer`` (positions it runs or scores), so
    they climb in half octaves; rows, columns and tokens per cell only size the cheap embedding bank and the
    Sinkhorn matrices, so they climb in octaves from generous minimums (most tables then share one bucket in
    them). ``template`` is padded to the body's bucket (template tokens are part of the body) and ``runs``
    to ``2 · rows · cols + 1`` (one run per cell, one between cells, the text after the table and the
    answer), so neither adds a dimension of its own. ``text`` pads re-rendered prompts (``answer_losses``).

    ``candidate_batch``: a batch of two or more candidate orders is padded to exactly this many sequences (a
    pad repeats a real order and is dropped), so scoring 2, 5 or 20 orders reuses one program; a single order
    has a program of its own (``candidate_batches``), so the one-order attacks (the original order, a random
    one, the reversals) do not pay for a full batch.
    """

    body: Ladder | None = Ladder(64, 2)
    prefix: Ladder | None = Ladder(64, 2)
    answer: Ladder | None = Ladder(16)
    rows: Ladder | None = Ladder(16)
    cols: Ladder | None = Ladder(8)
    cell_tokens: Ladder | None = Ladder(32)
    text: Ladder | None = Ladder(64, 2)
    candidate_batch: int = 8

    def __post_init__(self):
        if self.candidate_batch < 1:
            raise ValueError(f"BucketGrid.candidate_batch={self.candidate_batch}; it must be >= 1")

    def with_length_steps(self, steps_per_octave: int) -> BucketGrid:
        """This grid with the prompt's lengths (body, prefix, re-rendered text) climbing ``steps_per_octave``
        rungs an octave from 64: 2 (the default grid) pads a length by ≤ 50%, 4 by ≤ 25% for about a third more
        buckets on a sweep (``docs/benchmarks/buckets.md``); ``ValueError`` unless it divides 64."""
        ladder = Ladder(64, steps_per_octave)
        return dataclasses.replace(self, body=ladder, prefix=ladder, text=ladder)

    @property
    def candidate_batches(self) -> tuple[int, ...]:
        """The batch sizes candidate orders are padded to: one order alone, or ``candidate_batch``."""
        return (1, self.candidate_batch) if self.candidate_batch > 1 else (1,)

    def fit(self, sizes: Sizes) -> Sizes:
        """The bucket of ``sizes``: every size ≥ the real one."""
        fit = lambda ladder, size: size if ladder is None else ladder.fit(size)  # noqa: E731
        rows, cols = fit(self.rows, sizes.rows), fit(self.cols, sizes.cols)
        body = fit(self.body, sizes.body)
        return Sizes(
            rows=rows,
            cols=cols,
            cell_tokens=fit(self.cell_tokens, sizes.cell_tokens),
            runs=max(sizes.runs, 2 * rows * cols + 1) if self.rows or self.cols else sizes.runs,
            template=body if self.body is not None else sizes.template,
            body=body,
            prefix=fit(self.prefix, sizes.prefix),
            answer=fit(self.answer, sizes.answer),
        )

    def text_length(self, length: int) -> int:
        return length if self.text is None else self.text.fit(length)


DEFAULT_BUCKETS = BucketGrid()


def power_of_two_batch(count: int, limit: int) -> int:
    """The smallest power of two ≥ ``count``, at most ``limit``: few distinct batch sizes, little padding."""
    size = 1
    while size < min(count, limit):
        size *= 2
    return min(size, limit)
