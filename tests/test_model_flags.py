"""The model flags every binary shares (``--model --dtype --tokenizer --mesh``, atp_jax/cli/model_flags.py): a hub
id with no hub to reach stops at once naming the id, a bad mesh is named, and a results folder records the dtype
and tokenizer in its identity and the mesh beside it — written from a sharded model on forced devices."""

import json

import pytest
from conftest import closed_port, run_binary

BINARIES = ("run_attack", "ablate", "transfer", "diagnose", "swap_correlation", "answer", "benchmark")
HUB_ID = "no-such-org/no-such-model"


@pytest.mark.parametrize("binary", BINARIES)
def test_every_binary_has_the_model_flags(binary):
    done = run_binary(binary, ["--helpfull"], timeout=120)  # absl prints the flags and exits with 1
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    for flag in ("--model", "--dtype", "--tokenizer", "--mesh"):
        assert f"  {flag}:" in done.stdout, (binary, flag)


@pytest.mark.parametrize(
    "env, reason",
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        ({"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}, "cannot be reached"),
    ],
    ids=["offline", "unreachable"],
)
def test_a_hub_id_without_a_hub_stops_at_once_naming_it(tmp_path, env, reason):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "0", **env}
    done = run_binary("answer", ["--model", HUB_ID], env=env, timeout=120)
    assert done.returncode != 0
    assert f"--model {HUB_ID}: model {HUB_ID!r}" in done.stderr and reason in done.stderr, done.stderr[-2000:]


def test_a_run_stops_on_an_unreachable_hub_before_it_loads_anything(tmp_path):
    done = run_binary(
        "run_attack",
        ["--model", HUB_ID, "--output_dir", tmp_path / "out", "--attacks", "vanilla", "--nogenerate"],
        env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    assert done.returncode != 0 and HUB_ID in done.stderr and "HF_HUB_OFFLINE" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "out" / "results.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mesh", "model=3"], "--mesh model=3: 1 devices do not split into groups of 3"),
        (["--mesh", "data=2,model=2"], "needs 4 devices; this process has 1"),
        (["--mesh", "pipeline=2"], "'pipeline=2' is not AXIS=SIZE"),
        (["--tokenizer", "/nonexistent/tokenizer"], "--tokenizer /nonexistent/tokenizer: not a folder"),
    ],
)
def test_bad_model_flags_are_named(args, message):
    done = run_binary("answer", ["--model", "config:tiny-llama", *args], timeout=120)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]


def test_a_sharded_run_records_its_dtype_tokenizer_and_mesh_and_resumes_on_another_mesh(tmp_path, smollm2_tokenizer):
    tokenizer = tmp_path / "tokenizer"
    smollm2_tokenizer.save_pretrained(tokenizer)
    out = tmp_path / "out"
    args = [
        "--model",
        "config:tiny-llama",
        "--tokenizer",
        tokenizer,
        "--dtype",
        "bfloat16",
        "--attacks",
        "best_of_k@k=4,atp_st@n_attack=1",
        "--nogenerate",
        "--num_examples",
        "1",
        "--output_dir",
        out,
    ]
    four = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    done = run_binary("run_attack", [*args, "--mesh", "data=2,model=2"], env=four)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "run.json").read_text())
    assert manifest["dtype"] == "bfloat16" and len(manifest["tokenizer_sha256"]) == 64
    assert {"dtype", "tokenizer_sha256"} <= set(manifest["identity_keys"]) and "mesh" not in manifest["identity_keys"]
    assert manifest["mesh"] == "data=2,model=2"
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(r["attack"] for r in records) == ["atp_st@n_attack=1", "best_of_k@k=4"]
    assert all("skipped" not in r and r["answer_loss"] > 0 for r in records)

    # Another mesh computes the same numbers: the folder resumes, with nothing left to run.
    done = run_binary("run_attack", [*args, "--mesh", "data=4"], env=four)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 recorded, 0 to run" in done.stdout
    # Another dtype does not: refused, naming it.
    done = run_binary("run_attack", [*args[:4], "--dtype", "float32", *args[6:]], env=four)
    assert done.returncode != 0 and "dtype" in done.stderr, done.stderr[-2000:]
