"""Permutation smoothing: a defense that answers under k random orders of the table and takes a majority vote.

Why it works
------------
An order attack changes nothing but the order in which the table arrives. If the k orders the model
answers under are drawn as uniform random permutations *of a canonical order of the table* (data rows
sorted by their cell texts, columns by header text, see :func:`canonical_order`), with a seed that does
not depend on the order the table arrives in, the defended answer is an exact function of the table's
*content*::

    smoothed(T.permute(row_perm, col_perm)) == smoothed(T)   for every row_perm, col_perm

so no order attack, adaptive or not, can change it. What remains is the accuracy cost of answering
under random orders (k=1 is "answer under one random order"; a larger k votes that noise down).

The seed here is ``SmoothingConfig.seed`` mixed with a digest of the table's content (an order-free
summary): still independent of the arrival order, but it gives each table its own draws, so that tables
of one shape are not all read under the same index permutations.

Two weaker variants, for comparison:

- ``canonical=False``: the orders are ``σ_i ∘ (arrival order)``, i.e. ``table.permute(σ_i)``. For a
  fixed arrival order and a random σ_i each order is still uniform, so an attacker who does not know the
  seed only changes *which* random orders are drawn. One who knows it (the σ_i are a deterministic
  function of the seed and the content) can pick the arrival order ``σ_1⁻¹ ∘ bad`` and fully control the
  first vote: with k=1 this variant is no defense against a seed-aware attacker.
- ``include_original=True``: the arrival order itself casts one extra vote, the first one (so it also
  wins ties). The attacker controls that vote fully; it is the adaptive attack's only handle on the
  canonical defense, and the ordinary attack on the original order already is that adaptive attack.

Votes are compared after the dataset's answer normaliser (``atp_jax.data.registry``; for every built-in dataset
:func:`atp_jax.tables.normalize.normalize_wtq`: Unicode folding, quotes and dashes
unified, trailing citations/parenthesised details/one final "." dropped, whitespace collapsed, lower
case): "Alice" and "alice." are one vote, "Paris" and "Paris, France" are two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from atp_jax.data.registry import answer_normalizer
from atp_jax.inference.qa import answers
from atp_jax.models.loading import LoadedModel
from atp_jax.tables.normalize import normalize_wtq
from atp_jax.tables.prompt import PromptStyle
from atp_jax.tables.table import Example, Table

__all__ = [
    "SmoothedAnswer",
    "SmoothingConfig",
    "canonical_order",
    "smoothed_answers",
    "smoothing_tables",
    "vote",
]

# Column arrangements tried at most when columns tie on header and cell multiset (see canonical_order):
# 8! covers the experiments' default --max_cols 8 even when every column ties.
MAX_ARRANGEMENTS = math.factorial(8)
_DEFAULT_STYLE = PromptStyle()


def _check_int(value, name: str, minimum: int) -> int:
    # bool is an int subclass; True votes would be a bug upstream, not a count.
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


@dataclasses.dataclass(frozen=True)
class SmoothingConfig:
    """Configuration of permutation smoothing.

    k: number of random orders voted over (>= 1); the largest k evaluated.
    canonical: draw the orders as permutations of the canonical order (content-only defense) rather
      than of the arrival order.
    include_original: the arrival order casts one extra vote, the first.
    seed: base seed of the draws (>= 0), mixed with a digest of the table's content.
    """

    k: int
    canonical: bool = True
    include_original: bool = False
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "k", _check_int(self.k, "SmoothingConfig.k", 1))
        object.__setattr__(self, "seed", _check_int(self.seed, "SmoothingConfig.seed", 0))


@dataclasses.dataclass(frozen=True)
class SmoothedAnswer:
    """The defended answer for one k.

    prediction: the winning answer as the model wrote it (its first vote with the winning normal form).
    agreement: the fraction of votes with the winning normal form, in (0, 1].
    votes: the answers voted over, in draw order (the arrival order's first with ``include_original``).
    """

    prediction: str
    agreement: float
    votes: tuple[str, ...]


def canonical_order(table: Table) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(row_perm, col_perm)`` such that ``table.permute(row_perm, col_perm)`` is the canonical table.

    Columns are sorted by ``(header text, sorted cell texts)`` and data rows by their cell texts read in
    that column order. Both keys ignore the arrival order, except when several columns tie on the
    column key (same header, same cells in another arrangement): the row sort then depends on how the
    tied columns are arranged, so every distinct arrangement of each tie group is tried and the one
    whose sorted rows are smallest wins (columns equal cell for cell are interchangeable and not
    enumerated). The canonical *table* is therefore the same for every ``table.permute(...)``; the
    returned indices may differ between equal rows or equal columns, which render identically.

    Raises:
        ValueError: when the ties need more than ``MAX_ARRANGEMENTS`` arrangements (many columns with the
            same header and the same cells); rename the duplicate headers or use ``canonical=False``.
    """
    n, m = table.n_rows, table.n_cols
    columns = [tuple(row[j] for row in table.rows) for j in range(m)]  # [m][n], in arrival row order
    keys = [(table.header[j], tuple(sorted(columns[j]))) for j in range(m)]
    order = sorted(range(m), key=lambda j: keys[j])
    groups = [list(g) for _, g in itertools.groupby(order, key=lambda j: keys[j])]

    def arrangements(group: list[int]) -> list[tuple[int, ...]]:
        # Columns with equal vectors stay equal under any row order: keep one arrangement per pattern.
        if len({columns[j] for j in group}) == 1:
            return [tuple(group)]
        seen, out = set(), []
        for perm in itertools.permutations(group):
            pattern = tuple(columns[j] for j in perm)
            if pattern not in seen:
                seen.add(pattern)
                out.append(perm)
        return out

    count = 1
    for group in groups:
        if len({columns[j] for j in group}) > 1:
            distinct = Counter(columns[j] for j in group)
            count *= math.factorial(len(group)) // math.prod(math.factorial(c) for c in distinct.values())
    if count > MAX_ARRANGEMENTS:
        raise ValueError(
            f"the table (header {list(table.header)}) has columns with the same header and the same cells in "
            f"other arrangements; its canonical order would try {count} column arrangements (limit "
            f"{MAX_ARRANGEMENTS}). Rename the duplicate headers or use SmoothingConfig(canonical=False)."
        )
    best = None
    for parts in itertools.product(*(arrangements(g) for g in groups)):
        col_perm = tuple(j for part in parts for j in part)
        row_perm = tuple(sorted(range(n), key=lambda i: tuple(table.rows[i][j] for j in col_perm)))
        rows = tuple(tuple(table.rows[i][j] for j in col_perm) for i in row_perm)
        if best is None or rows < best[0]:
            best = (rows, row_perm, col_perm)
    return best[1], best[2]


def _content_seed(table: Table) -> int:
    """A 64-bit digest of an order-free summary of the table (its columns as (header, sorted cells), its
    rows as sorted cells, both sorted): the same for every arrival order, and stable across processes
    (``hash()`` of a str is salted per process). It needs no canonical order, so ``canonical=False``
    works on any table."""
    columns = sorted((table.header[j], sorted(row[j] for row in table.rows)) for j in range(table.n_cols))
    rows = sorted(sorted(row) for row in table.rows)
    text = json.dumps([columns, rows], ensure_ascii=False, separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def smoothing_tables(table: Table, config: SmoothingConfig) -> list[Table]:
    """The tables answered: the arrival table first with ``include_original``, then ``config.k`` draws.

    Draw i is ``base.permute(σ_r, σ_c)`` with ``σ_r`` a uniform permutation of the n data rows and ``σ_c``
    of the m columns (header pinned), where ``base`` is the canonical table (``canonical``) or ``table``.
    The draws are sequential from one generator, so the first k of a larger k are the k draws.
    """
    base = table.permute(*canonical_order(table)) if config.canonical else table
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _content_seed(table)]))
    draws = []
    for _ in range(config.k):
        row_perm = rng.permutation(table.n_rows)
        col_perm = rng.permutation(table.n_cols)
        draws.append(base.permute(row_perm, col_perm))
    return [table, *draws] if config.include_original else draws


def vote(predictions: Sequence[str], normalize: Callable[[str], str] = normalize_wtq) -> tuple[str, float]:
    """Majority over ``normalize`` forms (the dataset's, ``atp_jax.data.registry``); a tie goes to the form
    voted first.

    Returns ``(text, agreement)``: the first prediction with the winning form, as written, and the
    fraction of predictions with that form.
    """
    if isinstance(predictions, str):
        raise TypeError("vote expects a list of predictions, not a single string; wrap it as [prediction]")
    predictions = list(predictions)
    if not predictions:
        raise ValueError("vote needs at least one prediction")
    forms = [normalize(p) for p in predictions]
    counts = Counter(forms)
    top = max(counts.values())
    first = next(i for i, form in enumerate(forms) if counts[form] == top)  # earliest of the tied forms
    return predictions[first], top / len(predictions)


def smoothed_answers(
    loaded: LoadedModel,
    example: Example,
    table: Table,
    config: SmoothingConfig,
    style: PromptStyle = _DEFAULT_STYLE,
    max_new_tokens: int | None = None,
    ks: Sequence[int] | None = None,
) -> dict[int, SmoothedAnswer]:
    """The defended answer to ``example`` over ``table`` for each k in ``ks`` (default ``(config.k,)``).

    Generates once, in one batched ``answers`` call, for ``max(ks)`` draws (plus the arrival table with
    ``include_original``); each k votes over a prefix of those answers (k=1: the first draw, k=5: the
    first five), so k = 1, 5, 9 cost 9 generations, not 15. Every k must be in ``1..config.k``.
    """
    ks = (config.k,) if ks is None else tuple(_check_int(k, f"ks[{i}]", 1) for i, k in enumerate(ks))
    if not ks:
        raise ValueError("ks is empty; pass the vote counts to evaluate, e.g. ks=(1, 5, 9), or None for config.k")
    if max(ks) > config.k:
        raise ValueError(f"ks={list(ks)} asks for {max(ks)} votes but config.k={config.k}; raise config.k")
    tables = smoothing_tables(table, dataclasses.replace(config, k=max(ks)))
    predictions = answers(loaded, example, tables, style, max_new_tokens)
    extra = 1 if config.include_original else 0
    out = {}
    for k in ks:
        votes = tuple(predictions[: extra + k])
        prediction, agreement = vote(votes, answer_normalizer(example.dataset))
        out[k] = SmoothedAnswer(prediction, agreement, votes)
    return out
