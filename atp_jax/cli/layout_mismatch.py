"""How often the per-cell token layout disagrees with tokenizing the prompt text whole.

``build_layout`` tokenizes every cell on its own; the attack places those tokens by a permutation.
The reference is to render the permuted table as text and tokenize it whole (as
``tests/test_layout.py::_retokenized`` does). Per dataset x tokenizer x style, over unique tables
(the first example with a non-empty answer supplies question and answer), this counts

  identity mismatch: ``layout.is_compositional`` is False (original order already differs);
  permuted mismatch: ``layout.ids(rp, cp)`` differs from re-tokenizing ``table.permute(rp, cp)``;

and, for permuted mismatches, the token-length difference and the share of differing tokens
(tokens in regions that differ, aligning both lists at shared byte offsets). Mismatching cells are located
and shown for the styles in ``--show_styles``.

  atp-layout-mismatch --data_dir data --json_out mismatch.json
"""

from __future__ import annotations

import difflib
import json
import os
import time

import numpy as np
from absl import flags
from tqdm import tqdm

from atp_jax.cli.console import run_app
from atp_jax.data.datasets import DATA_ENV_VAR, load_dataset
from atp_jax.models import gguf, zoo
from atp_jax.tables.layout import build_layout
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle, encode_text, reference_answer, render_prompt

_DATA_DIR = flags.DEFINE_string("data_dir", os.environ.get(DATA_ENV_VAR), "Directory with <name>/dev.jsonl.")
_DATASETS = flags.DEFINE_list("datasets", ["wtq", "tatqa", "fetaqa"], "Datasets (dev split).")
_MODELS = flags.DEFINE_list(
    "models", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"], "Zoo names whose tokenizers to use."
)
_STYLES = flags.DEFINE_list("styles", list(STYLES), "Linearization styles.")
_PERMS = flags.DEFINE_integer("perms_per_table", 1, "Random (row, column) permutations per table.")
_MAX_TABLES = flags.DEFINE_integer("max_tables", None, "At most this many unique tables per dataset (seeded subset).")
_SEED = flags.DEFINE_integer("seed", 0, "RNG seed (table subset and permutations).")
_SHOW_STYLES = flags.DEFINE_list("show_styles", ["markdown"], "Styles whose mismatching cells are printed.")
_EXAMPLES = flags.DEFINE_integer("examples", 3, "Mismatch examples kept per dataset x model x style.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Also write the figures (and examples) as JSON here.")


def _retokenized(tokenizer, example, table, style: PromptStyle) -> list[int]:
    """The independent reference: render ``table`` as text and tokenize it whole, plus the answer."""
    text = render_prompt(tokenizer, example, table, style).text
    return encode_text(tokenizer, text) + encode_text(tokenizer, reference_answer(example))


def _unique_tables(examples):
    """First example with a non-empty answer per distinct table, in file order; and the skip counts."""
    first, skipped = {}, 0
    all_tables = set()
    for example in examples:
        all_tables.add(example.table)
        if not any(a.strip() for a in example.answers):
            skipped += 1
            continue
        first.setdefault(example.table, example)
    return list(first.values()), skipped, len(all_tables) - len(first)


def _byte_lengths(tokenizer) -> np.ndarray:
    """Bytes each token id spells (byte-level BPE: one character of the token string per byte)."""
    size = len(tokenizer)
    return np.array([len(t) for t in tokenizer.convert_ids_to_tokens(list(range(size)))], np.int64)


def _diff(layout_ids: list[int], ref: list[int], byte_lengths: np.ndarray):
    """Differing regions ``(tag, i1, i2, j1, j2)`` and the number of differing tokens.

    Both lists spell the same bytes, so they are aligned linearly at the byte offsets where both
    have a token boundary; a segment between two such offsets is equal when it is one identical
    token on both sides, else it counts ``max(tokens in layout, tokens in ref)``. Falls back to
    difflib if the spelled bytes differ in length.
    """
    a, b = np.asarray(layout_ids), np.asarray(ref)
    ea, eb = np.cumsum(byte_lengths[a]), np.cumsum(byte_lengths[b])
    if ea[-1] != eb[-1]:
        ops = [
            op
            for op in difflib.SequenceMatcher(None, layout_ids, ref, autojunk=False).get_opcodes()
            if op[0] != "equal"
        ]
        return ops, sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops)
    common = np.intersect1d(ea, eb)
    na = np.searchsorted(ea, common, side="right")  # tokens of a up to each common boundary
    nb = np.searchsorted(eb, common, side="right")
    sa, sb = np.concatenate([[0], na[:-1]]), np.concatenate([[0], nb[:-1]])
    da, db = na - sa, nb - sb
    same = (da == 1) & (db == 1) & (a[na - 1] == b[nb - 1])
    bad = np.flatnonzero(~same)
    ops = [("replace", int(sa[k]), int(na[k]), int(sb[k]), int(nb[k])) for k in bad]
    return ops, int(np.maximum(da, db)[bad].sum())


def _runs(layout, rp, cp):
    """Per body run, in order: (start, end) in the full sequence and the original cell (i, j) or None."""
    length, row, col = layout.runs(rp, cp)
    ends = layout.prefix_length + np.cumsum(length)
    return [(int(e - n), int(e), None if r < 0 else (int(r), int(c))) for e, n, r, c in zip(ends, length, row, col)]


def _explain(tokenizer, layout, table, ids, ref, ops, rp, cp):
    """The first differing region: the cells whose runs it touches and both tokenizations of it."""
    tag, i1, i2, j1, j2 = ops[0]
    lo, hi = i1, max(i2, i1 + 1)
    cells = []
    for start, end, cell in _runs(layout, rp, cp):
        # A run touches the region if it overlaps it or ends/starts right at its edge (boundary merges).
        if cell is not None and start <= hi and end >= lo:
            text = table.cells[cell[0]][cell[1]]
            if not cells or cells[-1]["cell"] != list(cell):
                cells.append(
                    {
                        "cell": list(cell),
                        "text": text,
                        "cell_tokens": tokenizer.convert_ids_to_tokens(
                            layout.cell_ids[cell[0], cell[1], : layout.cell_lengths[cell]].tolist()
                        ),
                    }
                )
    ctx = 3
    return {
        "op": tag,
        "position": i1,
        "cells": cells,
        "layout_tokens": tokenizer.convert_ids_to_tokens(ids[max(0, i1 - ctx) : i2 + ctx]),
        "whole_tokens": tokenizer.convert_ids_to_tokens(ref[max(0, j1 - ctx) : j2 + ctx]),
        "layout_text": tokenizer.decode(ids[max(0, i1 - ctx) : i2 + ctx]),
        "n_ops": len(ops),
    }


def _measure(tokenizer, byte_lengths, examples, style_name, seed, n_perms, n_keep):
    style = PromptStyle(linearization=style_name)
    stats = {
        "tables": 0,
        "errors": 0,
        "identity_mismatch": 0,
        "perm_pairs": 0,
        "perm_mismatch": 0,
        "perm_mismatch_tables": 0,
        "compositional_but_perm_mismatch": 0,
        "abs_dlen": [],
        "diff_frac": [],
        "diff_tokens": [],
        "identity_abs_dlen": [],
        "identity_diff_frac": [],
    }
    examples_out = []
    for t, example in enumerate(tqdm(examples, desc=style_name, leave=False, mininterval=2)):
        table = example.table
        try:
            layout = build_layout(tokenizer, example, style=style)
        except ValueError as error:  # e.g. json with a header-only table
            stats["errors"] += 1
            stats.setdefault("error_messages", []).append(f"{example.id}: {str(error)[:80]}")
            continue
        stats["tables"] += 1
        n, m = table.n_rows, table.n_cols
        if not layout.is_compositional:
            stats["identity_mismatch"] += 1
            ids, ref = layout.ids().tolist(), _retokenized(tokenizer, example, table, style)
            _, d = _diff(ids, ref, byte_lengths)
            stats["identity_abs_dlen"].append(abs(len(ids) - len(ref)))
            stats["identity_diff_frac"].append(d / len(ref))
        rng = np.random.default_rng([seed, t])  # same permutations for every model and style
        any_mismatch = False
        for _ in range(n_perms):
            rp, cp = rng.permutation(n), rng.permutation(m)
            ids = layout.ids(rp, cp).tolist()
            ref = _retokenized(tokenizer, example, table.permute(rp, cp), style)
            stats["perm_pairs"] += 1
            if ids == ref:
                continue
            any_mismatch = True
            stats["perm_mismatch"] += 1
            stats["compositional_but_perm_mismatch"] += int(layout.is_compositional)
            ops, d = _diff(ids, ref, byte_lengths)
            stats["abs_dlen"].append(abs(len(ids) - len(ref)))
            stats["diff_tokens"].append(d)
            stats["diff_frac"].append(d / len(ref))
            if len(examples_out) < n_keep:
                examples_out.append(
                    {
                        "id": example.id,
                        "seq_len": len(ref),
                        "diff_tokens": d,
                        **_explain(tokenizer, layout, table, ids, ref, ops, rp, cp),
                    }
                )
        stats["perm_mismatch_tables"] += int(any_mismatch)
    for key in ("abs_dlen", "diff_frac", "diff_tokens", "identity_abs_dlen", "identity_diff_frac"):
        values = stats.pop(key)
        stats[f"mean_{key}"] = float(np.mean(values)) if values else None
    return stats, examples_out


def _pct(a, b):
    return f"{100 * a / b:.1f}" if b else "-"


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def main(argv):
    del argv
    start = time.perf_counter()
    data = {}
    for name in _DATASETS.value:
        examples = load_dataset(name, data_dir=_DATA_DIR.value)
        unique, skipped, lost = _unique_tables(examples)
        total = len(unique)
        if _MAX_TABLES.value is not None and total > _MAX_TABLES.value:
            pick = np.sort(np.random.default_rng(_SEED.value).choice(total, _MAX_TABLES.value, replace=False))
            unique = [unique[k] for k in pick]
        data[name] = unique
        print(
            f"{name}: {len(examples)} examples, {total} unique tables with an answer "
            f"(skipped {skipped} empty-answer examples, {lost} tables lost to them), using {len(unique)}"
        )

    results, shown = [], []
    for model in _MODELS.value:
        tokenizer = gguf.load_gguf_tokenizer(zoo.resolve(model))
        byte_lengths = _byte_lengths(tokenizer)
        for name, examples in data.items():
            for style in _STYLES.value:
                t0 = time.perf_counter()
                stats, found = _measure(
                    tokenizer, byte_lengths, examples, style, _SEED.value, _PERMS.value, _EXAMPLES.value
                )
                stats.update(dataset=name, model=model, style=style, seconds=time.perf_counter() - t0, examples=found)
                results.append(stats)
                if style in _SHOW_STYLES.value:
                    shown.extend((name, model, style, e) for e in found)
                print(
                    f"  {name} / {model} / {style}: {stats['tables']} tables, "
                    f"{stats['identity_mismatch']} identity / {stats['perm_mismatch']} permuted mismatches "
                    f"({stats['seconds']:.1f}s)",
                    flush=True,
                )

    order = {m: k for k, m in enumerate(_MODELS.value)}
    results.sort(
        key=lambda r: (_DATASETS.value.index(r["dataset"]), order[r["model"]], _STYLES.value.index(r["style"]))
    )
    print()
    print(
        "| dataset | model | style | tables | identity mismatch % | permuted mismatch % "
        "| mean \\|Δlen\\| | mean differing tokens (% of seq) | compositional yet permuted mismatch | errors |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        frac = r["mean_diff_frac"]
        print(
            f"| {r['dataset']} | {r['model']} | {r['style']} | {r['tables']} "
            f"| {_pct(r['identity_mismatch'], r['tables'])} | {_pct(r['perm_mismatch'], r['perm_pairs'])} "
            f"| {_fmt(r['mean_abs_dlen'], '.2f')} | {_fmt(r['mean_diff_tokens'], '.1f')} "
            f"({_fmt(None if frac is None else 100 * frac, '.2f')}) "
            f"| {r['compositional_but_perm_mismatch']} | {r['errors']} |"
        )
    print(
        "\n(permuted mismatch % is over table x permutation pairs; Δlen and differing tokens are over the "
        "permuted mismatches; differing tokens = sum over differing regions of max(layout tokens, whole "
        "tokens), regions delimited by byte offsets where both tokenizations have a boundary)"
    )

    if shown:
        print("\nMismatch examples (first differing region of a permuted layout vs the re-tokenized text):")
        for name, model, style, e in shown:
            print(
                f"- {name} / {model} / {style} / {e['id']} (seq {e['seq_len']}, {e['diff_tokens']} differing "
                f"tokens, {e['n_ops']} regions): cells {[(c['text'], c['cell_tokens']) for c in e['cells']]!r}"
            )
            print(f"    layout: {e['layout_tokens']}")
            print(f"    whole:  {e['whole_tokens']}")
    wall = time.perf_counter() - start
    print(f"\nwall time: {wall:.1f}s")
    if _JSON_OUT.value:
        with open(_JSON_OUT.value, "w") as f:
            json.dump(
                {
                    "flags": {
                        "datasets": _DATASETS.value,
                        "models": _MODELS.value,
                        "styles": _STYLES.value,
                        "perms_per_table": _PERMS.value,
                        "max_tables": _MAX_TABLES.value,
                        "seed": _SEED.value,
                    },
                    "wall_seconds": wall,
                    "results": results,
                },
                f,
                indent=1,
                ensure_ascii=False,
            )


def run() -> None:
    """The console script ``atp-layout-mismatch``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
