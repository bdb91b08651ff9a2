"""Black-box victims against a real llama.cpp server (llama-cpp-python's, serving SmolLM2; see llama_server.py):
the CE from the server equals the in-process model's, the gradient-free attacks and transfers run through the
binaries, a rerun is served from the cache, a server killed mid-run gives skips that a resume completes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from atp_jax.inference.qa import answer_losses
from atp_jax.inference.server import ServerVictim, VictimError
from atp_jax.models.gguf import write_dequantized
from atp_jax.models.loading import load_model
from atp_jax.models.zoo import resolve
from atp_jax.runs.experiment import select_examples
from atp_jax.runs.folders import load_run
from atp_jax.tables.prompt import PromptStyle
from tests.conftest import REPO, closed_port, run_binary
from tests.llama_server import SERVED_NAME, LlamaServer

# |CE(server) - CE(JAX)| on the dequantized weights and a float32 K/V cache, measured at <= 2e-5 nats on these
# questions (llama.cpp's float32 kernels against XLA's: other summation orders, other exp and rope arithmetic); the
# margin covers other CPUs' kernels.
CE_TOLERANCE = 0.01
SELECTION = ["--num_examples", "3", "--max_rows", "6", "--max_cols", "5"]
CLOSED = "vanilla,random,best_of_k@k=3,row_reverse,col_reverse,evolution@population=2,generations=1"


@pytest.fixture(scope="module")
def served_model(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("served")
    return write_dequantized(resolve("smollm2-135m-instruct"), folder / "smollm2-135m-f32.gguf")


@pytest.fixture(scope="module")
def server(served_model, tmp_path_factory):
    running = LlamaServer(served_model, closed_port(), tmp_path_factory.mktemp("log") / "server.log").start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def examples():
    return select_examples("sample", num_examples=3, max_rows=6, max_cols=5)


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def _victim_flags(server, *extra) -> list[str]:
    return ["--victim_url", server.url, "--victim_name", SERVED_NAME, "--model", "smollm2-135m-instruct", *extra]


def test_server_ce_equals_the_in_process_models(server, smollm2, examples):
    """Same weights, different kernels: the reference answer's CE under two orders of each question, from the
    server's log-probabilities by either route, within CE_TOLERANCE of the JAX model's. Echo, the slow route (the
    server sorts the vocabulary per prompt token), on the first question only."""
    for i, example in enumerate(examples):
        n, m = example.table.n_rows, example.table.n_cols
        tables = [example.table, example.table.permute(np.arange(n)[::-1], np.arange(m)[::-1])]
        local = answer_losses(smollm2, example, tables)
        for endpoint in ("echo", "forced") if i == 0 else ("forced",):
            victim = ServerVictim(server.url, SERVED_NAME, endpoint, smollm2.tokenizer, max_concurrency=1)
            served = victim.answer_losses(example, tables)
            np.testing.assert_allclose(served, local, atol=CE_TOLERANCE, err_msg=f"{example.id} via {endpoint}")
    auto = ServerVictim(server.url, SERVED_NAME, "auto", smollm2.tokenizer)
    calibration = auto.calibrate(examples[0])
    assert auto.endpoint == calibration["chosen"]
    if calibration["echo_error"] is None:  # echo answered within its allowance: it agrees, and wins if faster
        assert abs(calibration["echo_ce"] - calibration["forced_ce"]) < 0.05
        faster = "echo" if calibration["echo_seconds"] < calibration["forced_seconds"] else "forced"
        assert calibration["chosen"] == faster
    else:
        assert calibration["chosen"] == "forced" and calibration["echo_ce"] is None


def test_a_different_tokenizer_is_refused(server, examples):
    """The CE would be of another token sequence: a tokenizer that is not the served model's fails loudly."""
    from atp_jax.models.loading import load_tokenizer

    qwen = load_tokenizer("qwen2.5-coder-0.5b-instruct")
    victim = ServerVictim(server.url, SERVED_NAME, "forced", qwen)
    with pytest.raises(VictimError, match="tokenized the prompt into"):
        victim.answer_losses(examples[0], [examples[0].table])


def test_closed_table_runs_through_run_attack_and_reruns_from_the_cache(server, smollm2, examples, tmp_path):
    out = tmp_path / "closed"
    args = [
        *_victim_flags(server, "--victim_concurrency", "1"),
        *SELECTION,
        "--attacks",
        CLOSED,
        "--nogenerate",
        "--output_dir",
        out,
    ]
    first = run_binary("run_attack", args)
    assert first.returncode == 0, first.stderr[-3000:]
    records = _records(out)
    assert len(records) == 3 * 6 and not [r for r in records if "skipped" in r]
    by_attack = {}
    for r in records:
        by_attack.setdefault(r["attack"].split("@")[0], []).append(r)
        assert (
            r["trace"]["objective"] == "ce"
            and r["trace"]["server"]["requests"] + r["trace"]["server"]["cache_hits"] >= 1
        )
        assert r["seconds"] > 0
    assert {r["queries"] for r in by_attack["vanilla"]} == {1} and sum(
        r["trace"]["server"]["requests"] for r in records
    ) > 0
    assert all(r["queries"] <= 3 for r in by_attack["best_of_k"])
    assert all(r["queries"] <= 4 for r in by_attack["evolution"])
    for r in by_attack["best_of_k"]:  # the strongest of its orders, each measured on the server
        assert r["answer_loss"] == pytest.approx(max(r["trace"]["losses"]), abs=1e-9)
    # The original order's CE, as recorded, is the in-process model's.
    for r in by_attack["vanilla"]:
        example = next(e for e in examples if e.id == r["id"])
        assert r["answer_loss"] == pytest.approx(answer_losses(smollm2, example, [example.table])[0], abs=CE_TOLERANCE)

    again = run_binary("run_attack", [*args, "--restart"])
    assert again.returncode == 0, again.stderr[-3000:]
    rerun = _records(out)
    assert [r["trace"]["server"]["requests"] for r in rerun] == [0] * len(rerun)
    assert [(r["id"], r["attack"], r["row_perm"], r["answer_loss"]) for r in rerun] == [
        (r["id"], r["attack"], r["row_perm"], r["answer_loss"]) for r in records
    ]

    # The paper's closed-model table from those records and from orders transferred from the open model.
    source = tmp_path / "open"
    opened = run_binary(
        "run_attack",
        ["--model", "smollm2-135m-instruct", *SELECTION, "--attacks", "row_reverse,col_reverse", "--nogenerate",
         "--output_dir", source],
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr[-3000:]
    moved = tmp_path / "transfer"
    transfer = run_binary("transfer", ["--results", source, *_victim_flags(server), "--output_dir", moved])
    assert transfer.returncode == 0, transfer.stderr[-3000:]
    transferred = _records(moved)
    assert len(transferred) == 6 and all(r["transferred_from"]["model"] == "smollm2-135m-instruct" for r in transferred)
    local = {(r["id"], r["attack"]): r["answer_loss"] for r in _records(source)}
    for r in transferred:
        assert r["answer_loss"] == pytest.approx(local[(r["id"], r["attack"])], abs=CE_TOLERANCE)
    report = run_binary("report", ["--results", f"{out},{moved}", "--metric", "answer_loss"])
    assert report.returncode == 0, report.stderr[-3000:]
    header = next(line for line in report.stdout.splitlines() if "Vanilla" in line)
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert {"Vanilla", "Rand", "Row Rvs", "Col Rvs"} <= set(columns)
    assert "Row Rvs from smollm2-135m-instruct" in columns and "Col Rvs from smollm2-135m-instruct" in columns
    assert load_run(out).model == f"{SERVED_NAME} at {server.url}"


def test_chat_endpoint_attacks_the_answers_score(server, tmp_path):
    out = tmp_path / "chat"
    result = run_binary(
        "run_attack",
        [*_victim_flags(server, "--victim_endpoint", "chat"), "--num_examples", "1", "--max_rows", "6",
         "--max_cols", "5", "--attacks", "vanilla,best_of_k@k=2", "--max_new_tokens", "16", "--output_dir", out],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = _records(out)
    assert len(records) == 2
    for r in records:
        assert r["trace"]["objective"] == "score" and r["trace"]["endpoint"] == "chat"
        assert r["answer_loss"] == pytest.approx(1.0 - r["scores"]["accuracy"])

    # A transfer to a chat-only server: the replayed order's loss is 1 - its answer's score, the original's too.
    from atp_jax.runs.blackbox import replay_on_server

    (example,) = select_examples("sample", num_examples=1, max_rows=6, max_cols=5)
    victim = ServerVictim(server.url, SERVED_NAME, "chat", max_concurrency=1)
    (replayed,) = replay_on_server(
        victim, example, records[1:], PromptStyle(), source={"model": "x"}, generate=True, max_new_tokens=16
    )
    assert replayed.answer_loss == pytest.approx(1.0 - replayed.scores["accuracy"])
    assert replayed.clean_loss == pytest.approx(1.0 - records[0]["scores"]["accuracy"])
    assert replayed.trace["objective"] == "score" and replayed.prediction is not None


def test_the_query_budget_and_gradient_attacks_are_refused(server, tmp_path):
    out = tmp_path / "budget"
    flags_ = [*_victim_flags(server), "--num_examples", "1", "--max_rows", "6", "--max_cols", "5", "--nogenerate"]
    result = run_binary(
        "run_attack", [*flags_, "--attacks", "best_of_k@k=4", "--victim_query_budget", "2", "--output_dir", out]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = _records(out)
    assert "over the budget of 2" in record["skipped"] and "retry" not in record
    gradient = run_binary("run_attack", [*flags_, "--attacks", "atp_joint", "--output_dir", tmp_path / "g"])
    assert gradient.returncode != 0 and "needs the model's gradient" in gradient.stderr


def test_an_unreachable_server_fails_at_once(tmp_path):
    port = closed_port()
    result = run_binary(
        "run_attack",
        ["--victim_url", f"http://127.0.0.1:{port}", "--model", "smollm2-135m-instruct", "--num_examples", "1",
         "--attacks", "vanilla", "--output_dir", tmp_path / "x"],
        timeout=120,
    )  # fmt: skip
    assert result.returncode != 0 and f"127.0.0.1:{port}" in result.stderr and "did not answer" in result.stderr


def test_a_server_killed_mid_run_gives_skips_that_a_resume_completes(served_model, tmp_path):
    port = closed_port()
    server = LlamaServer(served_model, port, tmp_path / "server.log").start()
    out = tmp_path / "killed"
    args = [
        *_victim_flags(server, "--victim_concurrency", "1"),
        "--num_examples", "2", "--max_rows", "6", "--max_cols", "5", "--attacks", CLOSED, "--nogenerate",
        "--output_dir", out,
    ]  # fmt: skip
    env = {"JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    run = subprocess.Popen(
        [sys.executable, "-m", "atp_jax.cli.run_attack", *map(str, args)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        results = out / "results.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not (results.exists() and results.read_text().count("\n") >= 2):
            time.sleep(0.5)
        server.stop()  # mid-run: the remaining attacks meet a dead server
        _, stderr = run.communicate(timeout=600)
    finally:
        run.kill()
        server.stop()
    assert run.returncode == 0, stderr[-3000:]
    first = _records(out)
    failed = [r for r in first if r.get("retry")]
    assert len(first) == 2 * 6 and failed and all("victim server failed" in r["skipped"] for r in failed)

    server = LlamaServer(served_model, port, tmp_path / "server.log").start()
    try:
        resumed = run_binary("run_attack", args)
    finally:
        server.stop()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = load_run(out).records
    assert len(final) == 2 * 6 and not [r for r in final if "skipped" in r]


def test_the_dequantized_copy_holds_the_loaders_weights(served_model):
    from atp_jax.models.gguf import iter_gguf_tensors, read_gguf_config

    original = resolve("smollm2-135m-instruct")
    config = read_gguf_config(original)
    assert read_gguf_config(served_model) == config
    for (name, ours), (copy_name, copied) in zip(
        iter_gguf_tensors(original, config), iter_gguf_tensors(served_model, config)
    ):
        assert name == copy_name and np.array_equal(ours, copied), name
