"""``atp-train`` end to end on a tiny checkpoint: a run writes its manifest, log and exported model, a rerun resumes
instead of training again, a rerun under other settings is refused, and held-out questions are never trained on."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from conftest import REPO, run_binary
from safetensors.numpy import load_file

from atp_jax.models.loading import load_model


def _dataset(path):
    records = [
        {
            "id": f"q{i}",
            "dataset": "wtq",
            "question": "Which player scored the most goals?",
            "answers": [f"P{i}"],
            "table": {"header": ["Player", "Goals"], "rows": [[f"P{i}", "12"], ["Bob", "7"], ["Cy", str(i)]]},
        }
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_train_exports_resumes_and_refuses_other_settings(tiny_checkpoint, tmp_path):
    data = _dataset(tmp_path / "train.jsonl")
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text(data.read_text().splitlines()[0] + "\n")  # q0 is the evaluation's: never trained on
    out = tmp_path / "run"
    args = ["--model", tiny_checkpoint, "--dataset", data, "--heldout", heldout, "--inner", "random"]
    args += ["--steps", "2", "--batch_size", "2", "--learning_rate", "1e-3", "--nocompilation_cache"]
    first = run_binary("train", [*args, "--output_dir", out])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "3 questions (1 held out)" in first.stdout
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    trained_on = {order["id"] for r in log for order in r["orders"]}
    assert trained_on and "q0" not in trained_on
    manifest = json.loads((out / "run.json").read_text())
    assert "random" in manifest["attacks"] and manifest["training"]["learning_rate"] == 1e-3
    loaded = load_model(out / "model")
    assert loaded.config.num_layers == 2 and loaded.tokenizer is not None

    assert len(manifest["provenance"]) == 1
    again = run_binary("train", [*args, "--output_dir", out])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "(2 resumed)" in again.stdout
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 2  # nothing trained twice
    assert json.loads((out / "run.json").read_text()) == manifest  # nor a session recorded that trained nothing
    longer = run_binary("train", [*args, "--steps", "3", "--output_dir", out])  # the last --steps holds
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert len(json.loads((out / "run.json").read_text())["provenance"]) == 2  # this one trained step 3

    other = run_binary("train", [*args[:-3], "--learning_rate", "1e-2", "--nocompilation_cache", "--output_dir", out])
    assert other.returncode != 0
    assert "learning_rate" in other.stderr


def test_a_run_killed_mid_training_resumes_to_the_uninterrupted_run(tiny_checkpoint, tmp_path):
    """kill -9 after a checkpoint and a step past it; the rerun continues from the checkpoint and ends with the
    losses and the exported weights of a run never interrupted."""
    data = _dataset(tmp_path / "train.jsonl")
    args = ["--model", tiny_checkpoint, "--dataset", data, "--heldout", "", "--inner", "random", "--steps", "5"]
    args += ["--batch_size", "2", "--learning_rate", "1e-3", "--checkpoint_every", "2", "--nocompilation_cache"]
    whole = run_binary("train", [*args, "--output_dir", tmp_path / "whole"])
    assert whole.returncode == 0, whole.stderr[-3000:]

    killed = tmp_path / "killed"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "atp_jax.cli.train", *map(str, args), "--output_dir", str(killed)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = killed / "train_log.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= 3:  # step 3 done: past checkpoint 2
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before it could be killed mid-training"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (killed / "model").exists()

    resumed = run_binary("train", [*args, "--output_dir", killed])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed)" in resumed.stdout and "(0 resumed)" not in resumed.stdout

    def losses(folder):
        return [json.loads(line)["loss"] for line in (folder / "train_log.jsonl").read_text().splitlines()]

    assert losses(killed) == losses(tmp_path / "whole")
    a = load_file(str(killed / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    assert all(np.array_equal(a[name], b[name]) for name in b)
