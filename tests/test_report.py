"""Report over results folders: shard merging, aggregation, BCa intervals, markdown/CSV/LaTeX/PDF/PNG, sweeps.

The numbers expected below are worked out by hand from the synthetic records."""

import csv
import io
import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest
from conftest import run_binary

from atp_jax.runs.ablation import plot_sweeps, sweep_rows, sweep_value
from atp_jax.runs.folders import load_run, results_files
from atp_jax.runs.records import append_record
from atp_jax.runs.report import (
    agreement_rows,
    broken_answers,
    plot_scores,
    score_csv,
    score_latex,
    score_markdown,
    score_tables,
)
from atp_jax.stats import bootstrap_interval


def rec(id_, attack, loss, **scores):
    return {
        "id": id_,
        "attack": attack,
        "answer_loss": loss,
        "clean_loss": 1.0,
        "scores": scores,
        "row_perm": [0],
        "col_perm": [0],
        "prediction": "x",
        "queries": 1,
        "backward_calls": 0,
        "seconds": 0.1,
    }


def make_folder(path, model, dataset, files, style="markdown", sha=None):
    path.mkdir(parents=True)
    manifest = {"model": model, "dataset": dataset, "style": {"linearization": style, "reasoning": "concise"}}
    (path / "run.json").write_text(json.dumps(manifest if sha is None else {**manifest, "model_sha256": sha}))
    for name, records in files.items():
        for r in records:
            append_record(path / name, r)
    return path


@pytest.fixture
def folders(tmp_path):
    a = make_folder(
        tmp_path / "a",
        "m1",
        "wtq",
        {
            "results.jsonl": [rec("e1", "vanilla", 1.0, accuracy=1.0), rec("e2", "vanilla", 2.0, accuracy=0.0)],
            "results.shard0.jsonl": [
                rec("e1", "vanilla", 9.0, accuracy=0.0),  # duplicate: the first one counts
                rec("e1", "paper", 3.0, accuracy=0.0),
                rec("e3", "vanilla", 1.5, accuracy=1.0),
            ],
            "results.shard1.jsonl": [
                rec("e2", "paper", 2.5, accuracy=1.0),
                {"id": "e3", "attack": "paper", "skipped": "one data row"},
            ],
        },
    )
    with (a / "results.shard1.jsonl").open("a") as f:
        f.write('{"id": "e4", "attack": "van')  # torn last line: ignored
    b = make_folder(
        tmp_path / "b",
        "m2",
        "wtq",
        {"results.jsonl": [rec("e1", "vanilla", 0.5, accuracy=1.0), rec("e1", "paper", 4.0, accuracy=0.0)]},
    )
    c = make_folder(
        tmp_path / "c",
        "m1",
        "tatqa",
        {"results.jsonl": [rec("t1", "vanilla", 1.0, em=1.0, f1=1.0), rec("t2", "vanilla", 3.0, em=0.0, f1=0.5)]},
    )
    return a, b, c


def cell(table, model, attack):
    return table.cells[(model, attack)]


# --------------------------------------------------------------------------- merging


def test_results_files_in_shard_order(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    for name in (
        "results.shard10.jsonl",
        "results.shard2.jsonl",
        "results.jsonl",
        "results.shard0.jsonl",
        "results.shardX.jsonl",
        "other.jsonl",
    ):
        (folder / name).write_text("")
    assert [p.name for p in results_files(folder)] == [
        "results.jsonl",
        "results.shard0.jsonl",
        "results.shard2.jsonl",
        "results.shard10.jsonl",
    ]


def test_load_run_merges_shards_keeps_first_and_skips_torn_line(folders):
    run = load_run(folders[0])
    assert run.model == "m1" and run.dataset == "wtq"
    keys = [(r["id"], r["attack"]) for r in run.records]
    assert keys == [
        ("e1", "vanilla"),
        ("e2", "vanilla"),
        ("e1", "paper"),
        ("e3", "vanilla"),
        ("e2", "paper"),
        ("e3", "paper"),
    ]
    assert run.records[0]["answer_loss"] == 1.0  # results.jsonl's, not shard0's duplicate


def test_missing_pieces_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"no results\.jsonl or results\.shard\*\.jsonl"):
        load_run(tmp_path / "empty")
    (tmp_path / "nomanifest").mkdir()
    append_record(tmp_path / "nomanifest" / "results.jsonl", rec("e1", "vanilla", 1.0))
    with pytest.raises(FileNotFoundError, match=r"no run\.json"):
        load_run(tmp_path / "nomanifest")


def test_shard_manifests_must_agree(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    append_record(folder / "results.shard0.jsonl", rec("e1", "vanilla", 1.0))
    (folder / "run.shard0.json").write_text(json.dumps({"model": "m1", "dataset": "wtq"}))
    (folder / "run.shard1.json").write_text(json.dumps({"model": "m2", "dataset": "wtq"}))
    with pytest.raises(ValueError, match="model='m2'"):
        load_run(folder)
    (folder / "run.shard1.json").write_text(json.dumps({"model": "m1", "dataset": "wtq"}))
    assert load_run(folder).model == "m1"


# --------------------------------------------------------------------------- aggregation


def test_tables_per_dataset_with_default_metric(folders):
    wtq, tatqa = score_tables([load_run(f) for f in folders])
    assert (wtq.dataset, wtq.metric, wtq.models, wtq.attacks) == ("wtq", "accuracy", ["m1", "m2"], ["vanilla", "paper"])
    # m1 vanilla: e1 1, e2 0, e3 1; paper: e1 0, e2 1 (e3 skipped).
    assert cell(wtq, "m1", "vanilla").mean == pytest.approx(2 / 3) and cell(wtq, "m1", "vanilla").n == 3
    assert cell(wtq, "m1", "paper").mean == pytest.approx(0.5) and cell(wtq, "m1", "paper").n == 2
    assert (cell(wtq, "m2", "vanilla").mean, cell(wtq, "m2", "paper").mean) == (1.0, 0.0)
    assert cell(wtq, "m1", "vanilla").low is None
    assert (tatqa.metric, tatqa.models, tatqa.attacks) == ("em", ["m1"], ["vanilla"])
    assert cell(tatqa, "m1", "vanilla").mean == 0.5


def test_loss_metric_and_unknown_metric(folders):
    (wtq,) = score_tables([load_run(folders[0])], metric="answer_loss")
    assert cell(wtq, "m1", "vanilla").mean == pytest.approx((1.0 + 2.0 + 1.5) / 3)
    assert cell(wtq, "m1", "paper").mean == pytest.approx((3.0 + 2.5) / 2)
    (tatqa,) = score_tables([load_run(folders[2])], metric="f1")
    assert cell(tatqa, "m1", "vanilla").mean == 0.75
    with pytest.raises(
        ValueError, match="metric 'f1' is not recorded in the 'wtq' results; available: accuracy, answer_loss"
    ):
        score_tables([load_run(folders[0])], metric="f1")


def test_runs_without_scores_default_to_the_loss(tmp_path):
    folder = make_folder(
        tmp_path / "nogen", "m1", "sample", {"results.jsonl": [rec("e1", "vanilla", 1.0), rec("e2", "vanilla", 2.0)]}
    )
    (table,) = score_tables([load_run(folder)])
    assert table.metric == "answer_loss" and cell(table, "m1", "vanilla").mean == 1.5


def test_paired_keeps_examples_measured_for_every_attack(folders):
    (wtq,) = score_tables([load_run(folders[0])], paired=True)
    # e3 has no paper measurement (skipped): only e1 and e2 count.
    assert cell(wtq, "m1", "vanilla").mean == 0.5 and cell(wtq, "m1", "vanilla").n == 2
    assert cell(wtq, "m1", "paper").n == 2


def test_folders_of_one_model_share_a_row_first_folder_wins(tmp_path, folders):
    extra = make_folder(
        tmp_path / "extra",
        "m1",
        "wtq",
        {"results.jsonl": [rec("e1", "vanilla", 7.0, accuracy=0.0), rec("e5", "vanilla", 1.0, accuracy=0.0)]},
    )
    wtq, _ = score_tables([load_run(folders[0]), load_run(extra), load_run(folders[2])])
    assert wtq.models == ["m1"]
    # e1 from folder a (1), e2 0, e3 1, e5 0 (e1's duplicate in `extra` ignored).
    assert cell(wtq, "m1", "vanilla").mean == 0.5 and cell(wtq, "m1", "vanilla").n == 4


def test_one_name_with_different_weights_gets_a_row_per_weights(tmp_path):
    # Two fine-tunes exported as "model": the same name, different weights, the same question ids.
    def folder(name, sha, accuracy):
        records = {"results.jsonl": [rec("e1", "vanilla", 1.0, accuracy=accuracy)]}
        return load_run(make_folder(tmp_path / name, "model", "wtq", records, sha=sha))

    (table,) = score_tables([folder("random", "aa", 1.0), folder("clean", "bb", 0.0), folder("again", "aa", 0.0)])
    assert table.models == ["model [random]", "model [clean]"]  # "again" holds random's weights: its row
    assert cell(table, "model [clean]", "vanilla").mean == 0.0 and cell(table, "model [random]", "vanilla").mean == 1.0
    # the same weights in two folders (a run resumed elsewhere) still share one row
    (table,) = score_tables([folder("one", "aa", 1.0), folder("two", "aa", 0.0)])
    assert table.models == ["model"] and cell(table, "model", "vanilla").n == 1
    # different weights in folders of one name (random/eval, clean/eval): told apart by their hashes
    a = load_run(
        make_folder(
            tmp_path / "r" / "eval", "model", "wtq", {"results.jsonl": [rec("e1", "vanilla", 1.0)]}, sha="a" * 64
        )
    )
    b = load_run(
        make_folder(
            tmp_path / "c" / "eval", "model", "wtq", {"results.jsonl": [rec("e1", "vanilla", 1.0)]}, sha="b" * 64
        )
    )
    (table,) = score_tables([a, b])
    assert table.models == [f"model [{'a' * 12}]", f"model [{'b' * 12}]"]
    # a folder without a recorded hash keeps the plain name beside them
    plain = load_run(make_folder(tmp_path / "old", "model", "wtq", {"results.jsonl": [rec("e2", "vanilla", 1.0)]}))
    (table,) = score_tables([a, b, plain])
    assert table.models == [f"model [{'a' * 12}]", f"model [{'b' * 12}]", "model"]


def test_one_model_in_two_styles_gets_two_rows(tmp_path):
    md = make_folder(tmp_path / "md", "m1", "wtq", {"results.jsonl": [rec("e1", "vanilla", 1.0, accuracy=1.0)]})
    cs = make_folder(
        tmp_path / "cs", "m1", "wtq", {"results.jsonl": [rec("e1", "vanilla", 1.0, accuracy=0.0)]}, style="csv"
    )
    (table,) = score_tables([load_run(md), load_run(cs)])
    assert table.models == ["m1 (markdown/concise)", "m1 (csv/concise)"]
    assert cell(table, "m1 (csv/concise)", "vanilla").mean == 0.0


# --------------------------------------------------------------------------- intervals


def test_ci_cells_bracket_the_mean(folders):
    wtq, _ = score_tables([load_run(f) for f in folders], ci=True)
    c = cell(wtq, "m1", "vanilla")
    assert (c.low, c.high) == bootstrap_interval([1.0, 0.0, 1.0])
    assert c.low <= c.mean <= c.high and wtq.ci_level == 0.95
    paper = cell(wtq, "m1", "paper")  # two examples: BCa is undefined, no interval
    assert paper.n == 2 and math.isnan(paper.low) and math.isnan(paper.high)


# --------------------------------------------------------------------------- outputs


def test_markdown_content(folders):
    text = score_markdown(score_tables([load_run(f) for f in folders]))
    assert text == (
        "### wtq: mean accuracy\n\n"
        "| model | Vanilla | paper |\n|---|---|---|\n"
        "| m1 | 0.667 (n=3) | 0.500 (n=2) |\n"
        "| m2 | 1.000 (n=1) | 0.000 (n=1) |\n\n"
        "### tatqa: mean em (2 examples per cell)\n\n"
        "| model | Vanilla |\n|---|---|\n"
        "| m1 | 0.500 |"
    )


def test_markdown_with_ci_shows_half_the_interval(folders):
    wtq, tatqa = score_tables([load_run(f) for f in folders], ci=True)
    low, high = bootstrap_interval([1.0, 0.0, 1.0])
    assert f"| m1 | 0.667 ± {(high - low) / 2:.3f} (n=3) | 0.500 ± n/a (n=2) |" in score_markdown([wtq])
    assert score_markdown([tatqa]).startswith(
        "### tatqa: mean em ± half the 95% BCa bootstrap interval (n/a below 3 examples) (2 examples per cell)"
    )


def test_csv_content(folders):
    rows = list(csv.reader(io.StringIO(score_csv(score_tables([load_run(f) for f in folders])))))
    assert rows == [
        ["dataset", "metric", "model", "Vanilla", "Vanilla n", "paper", "paper n"],
        ["wtq", "accuracy", "m1", repr(2 / 3), "3", "0.5", "2"],
        ["wtq", "accuracy", "m2", "1.0", "1", "0.0", "1"],
        ["tatqa", "em", "m1", "0.5", "2", "", ""],
    ]


def test_csv_with_ci_columns(folders):
    rows = list(csv.DictReader(io.StringIO(score_csv(score_tables([load_run(f) for f in folders], ci=True)))))
    m1 = rows[0]
    assert (float(m1["Vanilla ci_low"]), float(m1["Vanilla ci_high"])) == bootstrap_interval([1.0, 0.0, 1.0])
    assert m1["paper ci_low"] == m1["paper ci_high"] == ""  # two examples: undefined
    assert rows[2]["paper ci_low"] == ""


def test_plot_writes_a_pdf_and_a_png(folders, tmp_path):
    written = plot_scores(score_tables([load_run(f) for f in folders], ci=True), tmp_path / "chart.png")
    assert written == [tmp_path / "chart.pdf", tmp_path / "chart.png"]
    data = (tmp_path / "chart.png").read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    assert (tmp_path / "chart.pdf").read_bytes().startswith(b"%PDF")


def test_report_binary_writes_markdown_csv_and_png(folders, tmp_path):
    prefix = tmp_path / "out" / "table"
    done = run_binary("report", ["--results", ",".join(map(str, folders)), "--ci", "--output", prefix], timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| m1 | 0.667 ± " in done.stdout
    assert Path(f"{prefix}.md").read_text().startswith("### wtq: mean accuracy ± half the 95% BCa bootstrap interval")
    assert Path(f"{prefix}.csv").read_text().startswith("dataset,metric,model,Vanilla,Vanilla n,Vanilla ci_low")
    assert Path(f"{prefix}.tex").read_text().startswith("\\begin{table}")
    assert Path(f"{prefix}.png").stat().st_size > 5000 and Path(f"{prefix}.pdf").stat().st_size > 5000


# --------------------------------------------------------------------------- sweeps


def test_sweep_values_read_from_attack_specs():
    assert sweep_value("paper@lambda_col=0.5,lambda_row=0.5", "lambda") == 0.5
    assert sweep_value("paper", "lambda") == 10.0  # the preset's own value is a point of every sweep
    assert sweep_value("atp_row@n_attack=40", "n_attack") == 40
    assert sweep_value("paper@lambda_row=0.5", "lambda") is None  # λ_r alone is not a point of the λ sweep
    assert sweep_value("paper@lr=0.3", "lambda") is None  # another field changed
    assert sweep_value("paper@lambda=x", "lambda") is None and sweep_value("vanilla", "lambda") is None


def test_sweep_rows_sorted_by_value(tmp_path):
    records = [
        rec("e1", "paper@n_attack=10", 2.0, accuracy=0.0),
        rec("e1", "paper@n_attack=5", 1.0, accuracy=1.0),
        rec("e2", "paper@n_attack=5", 3.0, accuracy=0.0),
        rec("e1", "paper@lambda_col=1.0,lambda_row=1.0", 9.0, accuracy=0.0),
        rec("e1", "vanilla", 9.0, accuracy=0.0),
        {"id": "e3", "attack": "paper@n_attack=5", "skipped": "x"},
    ]
    rows = sweep_rows(records, "n_attack")
    # Below three examples a point has no interval (NaN ends).
    assert all(math.isnan(row["loss_ci_low"]) and math.isnan(row["loss_ci_high"]) for row in rows)
    assert [{k: v for k, v in row.items() if not k.startswith("loss_ci")} for row in rows] == [
        {"n_attack": 5.0, "examples": 2, "mean_loss": 2.0, "mean_clean_loss": 1.0, "mean_accuracy": 0.5},
        {"n_attack": 10.0, "examples": 1, "mean_loss": 2.0, "mean_clean_loss": 1.0, "mean_accuracy": 0.0},
    ]
    assert isinstance(rows[0]["n_attack"], int)  # shown as 5, not 5.000
    assert [r["lambda"] for r in sweep_rows(records, "lambda")] == [1.0]
    three = sweep_rows([rec(f"e{k}", "paper@n_attack=5", float(k)) for k in range(3)], "n_attack")[0]
    assert (three["loss_ci_low"], three["loss_ci_high"]) == bootstrap_interval([0.0, 1.0, 2.0])
    plot_sweeps({"n_attack": rows, "lambda": sweep_rows(records, "lambda")}, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "sweep.pdf").read_bytes().startswith(b"%PDF")


def test_paired_comparisons_by_hand():
    from atp_jax.runs.report import comparison_markdown, paired_comparisons

    records = [
        rec("e1", "search_warm", 3.0),
        rec("e1", "search_warm_reversed", 2.0),
        rec("e2", "search_warm", 1.0),
        rec("e2", "search_warm_reversed", 1.5),
        rec("e3", "search_warm", 2.0),  # no control on e3: left out of the pair
        {"id": "e4", "attack": "search_warm", "skipped": "too big"},
        # best_of_k higher by exactly 1 on three examples: zero variance, the interval is the point.
        *(rec(f"e{k}", "best_of_k", k + 1.0) for k in (1, 2, 3)),
        *(rec(f"e{k}", "search_warm_random", float(k)) for k in (1, 2, 3)),
    ]
    pairs = [("search_warm", "search_warm_reversed"), ("atp_st", "best_of_k"), ("best_of_k", "search_warm_random")]
    row, exact = paired_comparisons(records, pairs=pairs)
    assert row["examples"] == 2 and row["mean_difference"] == pytest.approx(0.25) and row["higher"] == 1
    assert math.isnan(row["ci_low"]) and math.isnan(row["ci_high"])  # two examples: no BCa interval
    assert (exact["examples"], exact["mean_difference"], exact["ci_low"], exact["ci_high"]) == (3, 1.0, 1.0, 1.0)
    text = comparison_markdown([row, exact])
    assert "| search_warm | search_warm_reversed | 2 | +0.250 [n/a] | 1/2 |" in text
    assert "| best_of_k | search_warm_random | 3 | +1.000 [+1.000, +1.000] | 3/3 |" in text


def test_equal_budget_pairs_give_best_of_k_at_least_the_attacks_compute():
    from atp_jax.runs.report import equal_budget_pairs, forward_equivalents, paired_comparisons

    def cost(id_, attack, queries, backward=0, loss=1.0):
        return {**rec(id_, attack, loss), "queries": queries, "backward_calls": backward}

    records = [
        *(cost(e, "structured", q) for e, q in (("e1", 5), ("e2", 3))),  # mean 4 forwards
        *(cost(e, "atp_joint", 22, 20) for e in ("e1", "e2")),  # 22 + 1.5 x 20 = 52
        *(cost(e, "atp_st_reversed", 22, 20) for e in ("e1", "e2")),  # a control: never paired by budget
        *(cost(e, "vanilla", 1) for e in ("e1", "e2")),  # no search
        *(cost(e, "best_of_k", 20, loss=2.0) for e in ("e1", "e2")),
        *(cost(e, "best_of_k@k=5", 5, loss=0.5) for e in ("e1", "e2")),
        *(cost(e, "best_of_k@k=52", 52) for e in ("e1", "e2")),
        *(cost(e, "best_of_k@k=90", 90) for e in ("e1", "e2")),
    ]
    assert forward_equivalents(records, 1.5)["atp_joint"] == 52.0
    assert equal_budget_pairs(records, backward_cost=1.5) == [
        ("structured", "best_of_k@k=5"),
        ("atp_joint", "best_of_k@k=52"),
    ]
    # A dearer backward: 22 + 2 x 20 = 62 forwards, so the next k up.
    assert ("atp_joint", "best_of_k@k=90") in equal_budget_pairs(records)
    compared = {(r["attack"], r["against"]) for r in paired_comparisons(records, backward_cost=1.5)}
    assert {("structured", "best_of_k@k=5"), ("atp_joint", "best_of_k"), ("atp_joint", "best_of_k@k=52")} <= compared


def test_option_rows_by_hand():
    from atp_jax.runs.ablation import option_rows

    records = [
        rec("e1", "atp_st", 2.0),
        rec("e2", "atp_st", 4.0),
        rec("e1", "atp_st@init=uniform", 3.0),
        rec("e2", "atp_st@init=uniform", 3.0),
        rec("e1", "atp_st@keep_best=off", 1.0),  # only on e1: compared there alone
        rec("e1", "paper", 9.0),
        {"id": "e2", "attack": "atp_st@keep_best=off", "skipped": "x"},
    ]
    rows = option_rows(records, "atp_st")
    assert [r["attack"] for r in rows] == ["atp_st", "atp_st@init=uniform", "atp_st@keep_best=off"]
    assert rows[0] == {"attack": "atp_st", "examples": 2, "mean_answer_loss": 3.0}
    # Differences +1 and −1: mean 0; two examples give no BCa interval.
    assert rows[1]["minus_atp_st"] == "+0.000 [n/a]" and rows[1]["higher_on"] == "1/2"
    assert rows[2]["examples"] == 1 and rows[2]["minus_atp_st"] == "-1.000 [n/a]"
    assert rows[2]["higher_on"] == "0/1"


def test_summaries_skip_the_text_beside_a_null_judge_score():
    from atp_jax.runs.report import available_metrics, summarize

    records = [rec("e1", "vanilla", 1.0, accuracy=1.0), rec("e2", "vanilla", 2.0, accuracy=0.0)]
    records[0]["scores"].update(judge=0.5)
    records[1]["scores"].update(judge=None, judge_error="out_of_range", judge_raw="1.5")
    (row,) = summarize(records)
    assert row["judge"] == 0.5 and row["accuracy"] == 0.5 and "judge_error" not in row and "judge_raw" not in row
    assert available_metrics(records) == ["accuracy", "judge", "answer_loss"]


# --------------------------------------------------------------------------- the paper's layout, three formats

PAPER_IDS = ["atp_joint", "search_warm", "vanilla", "evolution", "best_of_k", "random"]  # recorded in this order


def _paper_folders(tmp_path):
    """Two models, four questions, the attacks recorded out of the paper's order plus one of ours."""
    folders, means = [], {}
    for m, model in enumerate(["qwen-a", "smol_b"]):  # '_' must be escaped in LaTeX
        records = []
        for k, attack in enumerate(PAPER_IDS):
            for e in range(4):
                loss = 1.0 + 0.37 * k + 0.11 * e * (m + 1) + 0.05 * (e == 2)
                records.append(rec(f"q{e}", attack, loss, accuracy=float((e + k + m) % 3 == 0)))
            values = [r for r in records if r["attack"] == attack]
            means[(model, attack)] = statistics.fmean(r["scores"]["accuracy"] for r in values)
        folders.append(make_folder(tmp_path / model, model, "wtq", {"results.jsonl": records}))
    return folders, means


def test_paper_layout_in_markdown_csv_and_latex_for_two_models(tmp_path):
    folders, means = _paper_folders(tmp_path)
    prefix = tmp_path / "out" / "paper"
    done = run_binary("report", ["--results", ",".join(map(str, folders)), "--output", prefix], timeout=120)
    assert done.returncode == 0, done.stderr
    # The paper's columns in its order and names, then ours under its id.
    ids = ["vanilla", "random", "best_of_k", "evolution", "atp_joint", "search_warm"]
    names = ["Vanilla", "Rand", "Best 20", "E-Search", "ATP Row&Col", "search_warm"]

    lines = [line for line in Path(f"{prefix}.md").read_text().splitlines() if line.startswith("| ")]
    header, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    assert header == ["model", *names]
    for model, *cells in rows:
        assert [float(c.split()[0]) for c in cells] == [round(means[(model, a)], 3) for a in ids]
        assert all(" ± " in c for c in cells)

    table = list(csv.DictReader(io.StringIO(Path(f"{prefix}.csv").read_text())))
    assert [row["model"] for row in table] == ["qwen-a", "smol_b"]
    for row in table:
        for attack, name in zip(ids, names):
            assert float(row[name]) == means[(row["model"], attack)] and row[f"{name} n"] == "4"
            assert float(row[f"{name} ci_low"]) <= float(row[name]) <= float(row[f"{name} ci_high"])

    tex = Path(f"{prefix}.tex").read_text().splitlines()
    assert tex[tex.index(r"\toprule") - 1] == r"\begin{tabular}{l" + "r" * len(ids) + "}"
    body = tex[tex.index(r"\toprule") + 1 : tex.index(r"\bottomrule")]
    assert body[1] == r"\midrule"
    assert body[0] == " & ".join(
        ["Model", "Vanilla", "Rand", "Best 20", "E-Search", r"ATP Row\&Col", r"search\_warm"]
    ) + (r" \\")
    for line, model in zip(body[2:], ["qwen-a", r"smol\_b"]):
        first, *cells = line.removesuffix(r" \\").split(" & ")
        assert first == model
        plain = model.replace("\\", "")
        assert [float(c.split()[0]) for c in cells] == [round(means[(plain, a)], 3) for a in ids]
        assert all(r" $\pm$ " in c for c in cells)
    assert Path(f"{prefix}.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex is not installed")
def test_latex_table_compiles_with_booktabs(tmp_path):
    folders, _ = _paper_folders(tmp_path)
    tex = score_latex(score_tables([load_run(f) for f in folders], ci=True))
    document = tmp_path / "doc.tex"
    document.write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n" + tex + "\\end{document}\n"
    )
    done = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "doc.pdf").read_bytes().startswith(b"%PDF")


# --------------------------------------------------------------------------- agreement of two runs


def test_agreement_of_two_runs_pairs_questions_and_attacks(tmp_path):
    first = [
        {**rec("e1", "best_of_k", 2.0), "row_perm": [1, 0], "compiles": {"compile_seconds": 3.0}},
        {**rec("e2", "best_of_k", 1.0), "row_perm": [0, 1], "compiles": {"compile_seconds": 1.0}},
        rec("e1", "vanilla", 1.0),
        rec("e9", "vanilla", 5.0),  # only in the first run: not paired
    ]
    second = [
        {**rec("e1", "best_of_k", 2.25), "row_perm": [1, 0], "seconds": 0.3, "compiles": {"trace_seconds": 0.5}},
        {**rec("e2", "best_of_k", 1.5), "row_perm": [1, 0], "clean_loss": 1.25, "seconds": 0.1},
        {**rec("e1", "vanilla", 1.0), "seconds": 0.05},
        {"id": "e3", "attack": "vanilla", "skipped": "too long"},
    ]
    rows = {row["attack"]: row for row in agreement_rows(first, second)}
    assert rows["best_of_k"]["pairs"] == 2 and rows["best_of_k"]["same_order"] == "1/2"
    assert rows["best_of_k"]["mean_abs_dloss"] == pytest.approx((0.25 + 0.5) / 2)
    assert rows["best_of_k"]["max_abs_dloss"] == pytest.approx(0.5)
    assert rows["best_of_k"]["mean_abs_dclean"] == pytest.approx(0.125)
    assert rows["best_of_k"]["attack_s_ratio"] == pytest.approx(0.4 / 0.2)
    assert (rows["best_of_k"]["compile_s_a"], rows["best_of_k"]["compile_s_b"]) == (4.0, 0.5)
    assert rows["vanilla"]["pairs"] == 1 and rows["vanilla"]["attack_s_ratio"] == pytest.approx(0.5)


def test_report_agreement_needs_two_folders(folders):
    a, b, c = folders
    done = run_binary("report", ["--results", f"{a},{b}", "--agreement"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"{b} against {a}" in done.stdout and "| vanilla | 1 | 0.500 |" in done.stdout
    done = run_binary("report", ["--results", str(a), "--agreement"])
    assert done.returncode != 0 and "two results folders" in done.stderr


def test_broken_answers_are_right_in_the_original_order_and_wrong_in_the_attacks():
    records = [
        {**rec("e1", "vanilla", 1.0, accuracy=1.0), "prediction": "Cuba"},
        {**rec("e1", "best_of_k", 2.0, accuracy=0.0), "prediction": "Ecuador"},
        {**rec("e1", "random", 1.1, accuracy=1.0), "prediction": "Cuba"},
        {**rec("e2", "vanilla", 1.0, accuracy=0.0), "prediction": "2"},
        {**rec("e2", "best_of_k", 2.0, accuracy=0.0), "prediction": "3"},  # wrong already: not broken
        {"id": "e1", "attack": "evolution", "skipped": "too long"},
    ]
    assert broken_answers(records) == [
        {"id": "e1", "attack": "best_of_k", "vanilla_answer": "Cuba", "attacked_answer": "Ecuador", "score": 0.0}
    ]
    from atp_jax.runs.report import summarize

    rows = {row["attack"]: row for row in summarize([r for r in records if "skipped" not in r])}
    assert rows["best_of_k"]["broken"] == "1/1" and rows["random"]["broken"] == "0/1"
    assert "broken" not in rows["vanilla"]


def test_report_summary_counts_the_answers_each_attack_broke(folders):
    a, _, _ = folders
    done = run_binary("report", ["--results", str(a), "--summary", "--noci"])
    assert done.returncode == 0, done.stderr[-2000:]
    table = done.stdout.split("per attack")[1]
    header = [c.strip() for c in table.splitlines()[2].strip("|").split("|")]
    rows = {
        cells[0]: dict(zip(header, cells))
        for line in table.splitlines()[4:]
        if line.startswith("|") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    # Vanilla is right on e1 and e3; paper is wrong on e1 (broken) and its e3 was skipped: 1 of 1 broken.
    assert rows["paper"]["broken"] == "1/1" and rows["paper"]["examples"] == "2"
    assert float(rows["paper"]["mean_loss"]) == pytest.approx((3.0 + 2.5) / 2)
    assert float(rows["vanilla"]["mean_loss"]) == pytest.approx((1.0 + 2.0 + 1.5) / 3)
