"""run_attack.py stops on a bad flag with one clear message, before any model work.

Every case passes ``--model`` as a file that does not exist: if the binary touched the model before
checking the flag, the error would be about the model instead.
"""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import closed_port

REPO = Path(__file__).resolve().parents[1]
NO_MODEL = "/nonexistent/model.gguf"


def _run(tmp_path, *args):
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.run_attack",
        "--model",
        NO_MODEL,
        "--output_dir",
        str(tmp_path / "out"),
        *args,
    ]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--attacks", "vanilla,atp_magic"], "unknown attack(s) atp_magic"),
        (["--dataset", "/nonexistent/data.jsonl"], "--dataset /nonexistent/data.jsonl"),
        (["--metrics", "bleu"], "--metrics: unknown bleu"),
        (["--answer_format", "fancy"], "--answer_format"),
        (["--metrics", "auto,judge"], "needs exactly one of --judge_model or --judge_url"),
        (["--metrics", "auto,judge", "--judge_model", "x", "--nogenerate"], "drop --nogenerate"),
        (["--order_filter", "regex"], "--order_filter=regex: value should be one of <classifier|keywords>"),
        (["--paragraphs"], "--paragraphs: the examples of --dataset sample carry no paragraphs"),
        (["--dataset", "wtq", "--data_dir", "/nonexistent/data"], "--dataset wtq: /nonexistent/data/wtq/dev.jsonl"),
        # Offline, or no hub reachable: either way one message naming the id, before the model.
        (["--dataset", "hf:atp-jax-test/no-such-dataset"], "--dataset hf:atp-jax-test/no-such-dataset: "),
    ],
)
def test_bad_flag_stops_before_the_model(tmp_path, args, message):
    done = _run(tmp_path, *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]
    assert "nonexistent/model" not in done.stderr


def test_unreachable_judge_url_is_named(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    done = _run(tmp_path, "--metrics", "auto,judge", "--judge_url", url)
    assert done.returncode != 0
    assert f"--judge_url {url}" in done.stderr and "connection_error" in done.stderr, done.stderr[-2000:]
    assert "nonexistent/model" not in done.stderr


def test_unwritable_output_dir_is_named(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    command = [
        sys.executable,
        "-m",
        "atp_jax.cli.run_attack",
        "--model",
        NO_MODEL,
        "--output_dir",
        str(blocker / "out"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert f"--output_dir {blocker / 'out'} is not a writable folder" in done.stderr, done.stderr[-2000:]


def test_with_good_flags_the_missing_model_is_what_stops_it(tmp_path):
    """The control: the cases above would have mentioned the model had they reached it."""
    done = _run(tmp_path, "--attacks", "vanilla", "--num_examples", "1")
    assert done.returncode != 0 and "nonexistent/model" in done.stderr, done.stderr[-2000:]


def test_attack_groups_expand_in_order_without_duplicates():
    from atp_jax.attack.presets import PRESETS, attack_names

    assert attack_names(["paper_table"]) == [
        "vanilla",
        "random",
        "best_of_k",
        "row_reverse",
        "col_reverse",
        "evolution",
        "atp_row",
        "atp_col",
        "atp_joint",
    ]
    assert attack_names(["paper", "all"]) == ["paper", *[a for a in PRESETS if a != "paper"]]
    assert attack_names(["closed_table"]) == [
        "vanilla",
        "random",
        "best_of_k",
        "row_reverse",
        "col_reverse",
        "evolution",
    ]
    with pytest.raises(ValueError, match="unknown attack.*nope.*or a group: paper_table, closed_table, all"):
        attack_names(["vanilla", "nope"])
