"""The robustness report over several models' results folders: per-model CE, accuracy and attack gains, the paired
comparisons with their BCa intervals, the pairing by question id, the refusals, and ``atp-report --robustness``.

Expected numbers are computed here from the fabricated values with numpy and with ``scipy.stats.bootstrap`` on the
paired arrays (method BCa), independently of the module and of ``atp_jax.stats``."""

import json

import numpy as np
import pytest
import scipy.stats
from conftest import run_binary

from atp_jax.runs.folders import load_run
from atp_jax.runs.records import append_record
from atp_jax.runs.robustness import folder_labels, robustness, robustness_markdown

ATTACKS = ("vanilla", "best_of_k", "strongest")
QUESTIONS = [f"q{i}" for i in range(1, 9)]
RESAMPLES = 500


def fabricate(seed: int, shift: float) -> dict[str, dict[str, tuple[float, float]]]:
    """attack -> question -> (CE, accuracy): vanilla CE drawn per question, each attack adding its own gain."""
    rng = np.random.default_rng(seed)
    out = {attack: {} for attack in ATTACKS}
    for q in QUESTIONS:
        vanilla = float(rng.uniform(0.5, 3.0)) + shift
        out["vanilla"][q] = (vanilla, float(rng.integers(0, 2)))
        for attack, scale in (("best_of_k", 1.0), ("strongest", 2.0)):
            out[attack][q] = (vanilla + scale * float(rng.uniform(0.0, 1.0)), float(rng.integers(0, 2)))
    return out


def write_folder(path, model, values, dataset="wtq", drop=(), skip=()):
    """A results folder of ``values``, leaving out the (question, attack) pairs in ``drop`` and recording those in
    ``skip`` as skips."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"model": model, "dataset": dataset, "seed": 0, "attacks": {}}))
    for attack, by_question in values.items():
        for q, (loss, accuracy) in by_question.items():
            if (q, attack) in drop:
                continue
            if (q, attack) in skip:
                append_record(path / "results.jsonl", {"id": q, "attack": attack, "skipped": "prompt too long"})
                continue
            record = {
                "id": q,
                "attack": attack,
                "answer_loss": loss,
                "clean_loss": 1.0,
                "scores": {"accuracy": accuracy},
                "prediction": "x",
                "row_perm": [0],
                "col_perm": [0],
                "queries": 1,
                "backward_calls": 0,
                "seconds": 0.1,
            }
            append_record(path / "results.jsonl", record)
    return path


BASE, CLEAN, ADVERSARIAL = fabricate(0, 0.0), fabricate(1, -0.3), fabricate(2, -0.2)
# The adversarial model's folder lacks q8 altogether and its strongest on q7; the clean one skipped strongest on q6.
ADVERSARIAL_DROP = {("q8", a) for a in ATTACKS} | {("q7", "strongest")}
CLEAN_SKIP = {("q6", "strongest")}


def measured(values, drop=(), skip=()):
    """attack -> question -> (CE, accuracy) as recorded: without the dropped and the skipped pairs."""
    return {
        a: {q: v for q, v in by_q.items() if (q, a) not in drop and (q, a) not in skip} for a, by_q in values.items()
    }


EXPECTED = {
    "base": measured(BASE),
    "clean": measured(CLEAN, skip=CLEAN_SKIP),
    "adversarial": measured(ADVERSARIAL, drop=ADVERSARIAL_DROP),
}


@pytest.fixture
def folders(tmp_path):
    return [
        write_folder(tmp_path / "base", "smollm2-135m-instruct", BASE),
        write_folder(tmp_path / "clean", str(tmp_path / "export_clean"), CLEAN, skip=CLEAN_SKIP),
        write_folder(tmp_path / "adversarial", str(tmp_path / "export_adv"), ADVERSARIAL, drop=ADVERSARIAL_DROP),
    ]


def scipy_paired(a, b):
    """BCa interval of mean(a − b) over paired arrays, straight from scipy."""
    result = scipy.stats.bootstrap(
        (np.asarray(a), np.asarray(b)),
        lambda x, y, axis=-1: np.mean(x - y, axis=axis),
        paired=True,
        vectorized=True,
        method="BCa",
        n_resamples=RESAMPLES,
        rng=np.random.default_rng(0),
    )
    return result.confidence_interval.low, result.confidence_interval.high


def gains(values, attack):
    return {q: values[attack][q][0] - values["vanilla"][q][0] for q in values[attack] if q in values["vanilla"]}


def test_per_model_figures_by_hand(folders):
    result = robustness([load_run(f) for f in folders], resamples=RESAMPLES)
    assert result.labels == ("base", "clean", "adversarial")
    assert result.metric == "accuracy" and result.attacks == ("best_of_k", "strongest")
    rows = {(r["folder"], r["attack"]): r for r in result.folder_rows}
    assert len(rows) == 3 * 3
    for label, values in EXPECTED.items():
        for attack in ATTACKS:
            row = rows[(label, attack)]
            ce = [v[0] for v in values[attack].values()]
            assert row["questions"] == len(ce)
            assert row["mean_ce"] == pytest.approx(np.mean(ce))
            assert row["accuracy"] == pytest.approx(np.mean([v[1] for v in values[attack].values()]))
            if attack == "vanilla":
                assert row["mean_gain"] is None and row["gain_questions"] is None
                continue
            # the gain pairs the attack's CE with vanilla's on each question: scipy's paired bootstrap of the two
            ids = sorted(gains(values, attack))
            attacked = [values[attack][q][0] for q in ids]
            original = [values["vanilla"][q][0] for q in ids]
            assert row["gain_questions"] == len(ids)
            assert row["mean_gain"] == pytest.approx(np.mean(attacked) - np.mean(original))
            low, high = scipy_paired(attacked, original)
            assert (row["gain_ci_low"], row["gain_ci_high"]) == pytest.approx((low, high))
    assert rows[("clean", "strongest")]["questions"] == 7  # q6 was skipped
    assert rows[("adversarial", "strongest")]["gain_questions"] == 6  # q8 and q7 are not recorded


def test_paired_comparisons_against_scipy(folders):
    result = robustness([load_run(f) for f in folders], resamples=RESAMPLES)
    # each folder against each of the first two given before it: no mirror image, no folder against itself
    pairs = sorted({(r["folder"], r["reference"]) for r in result.comparison_rows})
    assert pairs == [("adversarial", "base"), ("adversarial", "clean"), ("clean", "base")]
    assert len(result.comparison_rows) == 3 * 4  # vanilla CE, vanilla accuracy, two gains
    for row in result.comparison_rows:
        mine, theirs = EXPECTED[row["folder"]], EXPECTED[row["reference"]]
        if row["quantity"] == "gain":
            a, b = gains(mine, row["attack"]), gains(theirs, row["attack"])
        else:
            column = 0 if row["quantity"] == "vanilla_ce" else 1
            a = {q: v[column] for q, v in mine["vanilla"].items()}
            b = {q: v[column] for q, v in theirs["vanilla"].items()}
        ids = sorted(set(a) & set(b))
        x, y = np.array([a[q] for q in ids]), np.array([b[q] for q in ids])
        diff = x - y
        assert row["questions"] == len(ids), row
        assert row["mean_difference"] == pytest.approx(diff.mean())
        assert row["lower"] == (diff < 0).sum() and row["higher"] == (diff > 0).sum()
        if np.all(diff == diff[0]):  # BCa is undefined on equal values: the interval is the point
            assert row["ci_low"] == row["ci_high"] == pytest.approx(diff[0])
        else:
            assert (row["ci_low"], row["ci_high"]) == pytest.approx(scipy_paired(x, y)), row


def test_pairing_by_question_id_leaves_out_the_missing_and_the_skipped(folders):
    result = robustness([load_run(f) for f in folders], resamples=RESAMPLES)
    count = {(r["folder"], r["reference"], r["quantity"], r["attack"]): r["questions"] for r in result.comparison_rows}
    assert count[("clean", "base", "vanilla_ce", "vanilla")] == 8
    assert count[("clean", "base", "gain", "strongest")] == 7  # clean skipped q6
    assert count[("adversarial", "base", "vanilla_ce", "vanilla")] == 7  # no q8 in adversarial
    assert count[("adversarial", "base", "gain", "best_of_k")] == 7
    assert count[("adversarial", "clean", "gain", "strongest")] == 5  # q6 skipped in one, q7 and q8 not in the other


def test_references_attacks_and_metric_are_chosen(folders):
    runs = [load_run(f) for f in folders]
    one = robustness(runs, references=1, attacks=["strongest"], resamples=RESAMPLES)
    assert {(r["folder"], r["reference"]) for r in one.comparison_rows} == {("clean", "base"), ("adversarial", "base")}
    assert one.attacks == ("strongest",) and {r["attack"] for r in one.folder_rows} == {"vanilla", "strongest"}
    assert "best_of_k" not in robustness_markdown(one)
    # a spec is read in its canonical form: best_of_k@k=20 is best_of_k
    assert robustness(runs, attacks=["best_of_k@k=20"], resamples=RESAMPLES).attacks == ("best_of_k",)


def test_labels_are_directory_names_else_model_names(tmp_path):
    a = write_folder(tmp_path / "one" / "results", "model-a", BASE)
    b = write_folder(tmp_path / "two" / "results", "model-b", CLEAN)
    assert folder_labels([load_run(a), load_run(b)]) == ["model-a", "model-b"]


def test_markdown_shows_every_model_and_comparison(folders):
    result = robustness([load_run(f) for f in folders], resamples=RESAMPLES)
    text = robustness_markdown(result)
    header = (
        "| model | questions | vanilla CE | vanilla accuracy | best_of_k CE | best_of_k accuracy | best_of_k gain | "
        "strongest CE | strongest accuracy | strongest gain |"
    )
    assert header in text
    base = {(r["attack"]): r for r in result.folder_rows if r["folder"] == "base"}
    assert f"| base | 8 | {base['vanilla']['mean_ce']:.3f} | {base['vanilla']['accuracy']:.3f} |" in text
    row = next(r for r in result.comparison_rows if r["folder"] == "adversarial" and r["attack"] == "strongest")
    assert (
        f"| adversarial | {row['reference']} | strongest gain | {row['questions']} | {row['mean_difference']:+.3f} "
        f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] | {row['lower']}/{row['questions']} |"
    ) in text


def test_refusals_name_the_folder_and_the_fix(tmp_path, folders):
    runs = [load_run(f) for f in folders]
    no_vanilla = write_folder(tmp_path / "no_vanilla", "m", {a: v for a, v in BASE.items() if a != "vanilla"})
    with pytest.raises(ValueError, match=r"no_vanilla has no vanilla records.*--attacks vanilla"):
        robustness([runs[0], load_run(no_vanilla)])
    # two questions of the base model's, one of its own
    few = write_folder(
        tmp_path / "few", "m", {a: {"q1": v["q1"], "q2": v["q2"], "q99": v["q3"]} for a, v in BASE.items()}
    )
    with pytest.raises(ValueError, match=r"few and .*base share 2 question.*at least 3: evaluate both"):
        robustness([runs[0], load_run(few)])
    with pytest.raises(ValueError, match=r"has no records of evolution.*--attacks vanilla,evolution"):
        robustness(runs, attacks=["evolution"])
    with pytest.raises(ValueError, match=r"carry no 'em' score"):
        robustness(runs, metric="em")
    with pytest.raises(ValueError, match="give the base model's folder first"):
        robustness(runs[:1])
    tatqa = write_folder(tmp_path / "tatqa", "m", BASE, dataset="tatqa")
    with pytest.raises(ValueError, match=r"tatqa holds 'tatqa' questions"):
        robustness([runs[0], load_run(tatqa)])


def test_without_scores_the_accuracy_is_left_out(tmp_path):
    folders = []
    for name, values in (("a", BASE), ("b", CLEAN)):
        folder = write_folder(tmp_path / name, name, values)
        lines = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        (folder / "results.jsonl").write_text("".join(json.dumps({**r, "scores": {}}) + "\n" for r in lines))
        folders.append(load_run(folder))
    result = robustness(folders, resamples=RESAMPLES)
    assert result.metric is None and all(r["accuracy"] is None for r in result.folder_rows)
    assert {r["quantity"] for r in result.comparison_rows} == {"vanilla_ce", "gain"}
    assert "runs without generation" in robustness_markdown(result)


def test_report_binary_robustness(folders):
    results = ",".join(map(str, folders))
    done = run_binary(
        "report", ["--results", results, "--robustness", "--attacks", "best_of_k,strongest", "--resamples", RESAMPLES]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "robustness to table orders, 3 models" in done.stdout
    expected = robustness([load_run(f) for f in folders], resamples=RESAMPLES)
    row = next(r for r in expected.comparison_rows if r["folder"] == "adversarial" and r["reference"] == "clean")
    assert f"| adversarial | clean | vanilla CE | {row['questions']} | {row['mean_difference']:+.3f}" in done.stdout
    # one reference: nothing is compared with the clean model
    done = run_binary("report", ["--results", results, "--robustness", "--robustness_references", "1"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| adversarial | base |" in done.stdout and "| adversarial | clean |" not in done.stdout


def test_report_binary_robustness_refusal(tmp_path, folders):
    no_vanilla = write_folder(tmp_path / "no_vanilla", "m", {a: v for a, v in BASE.items() if a != "vanilla"})
    done = run_binary("report", ["--results", f"{folders[0]},{no_vanilla}", "--robustness"])
    assert done.returncode != 0
    assert f"--robustness: {no_vanilla} has no vanilla records" in done.stderr
    assert "Traceback" not in done.stderr
