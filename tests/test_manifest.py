"""Results folders refuse to mix: a resume whose model, dataset, style, seed or attack configuration
differs from the folder's manifest stops with a message naming the difference; ``--flagfile`` replays a run."""

import json
from pathlib import Path

import pytest
from conftest import run_binary

from atp_jax.runs.fingerprints import dataset_fingerprint, model_fingerprint
from atp_jax.runs.manifest import ManifestMismatch, ResultsFolder

REPO = Path(__file__).resolve().parents[1]
TIMING = ("seconds", "generate_seconds", "compiles")

IDENTITY = {
    "model": "m",
    "model_sha256": "a" * 64,
    "dataset": "sample",
    "split": "dev",
    "dataset_sha256": "b" * 64,
    "style": {"linearization": "markdown"},
    "seed": 0,
    "metrics": ["auto"],
}
ATTACKS = {"vanilla": {"method": "vanilla", "mode": "joint", "objective": "ce", "seed": 0}}


def _folder_with_a_record(tmp_path) -> ResultsFolder:
    folder = ResultsFolder(tmp_path / "run")
    folder.begin(IDENTITY, ATTACKS, {"argv": ["first"]})
    folder.append({"id": "e1", "attack": "vanilla", "answer_loss": 1.0})
    return folder


@pytest.mark.parametrize(
    "key, value",
    [
        ("model", "other"),
        ("model_sha256", "c" * 64),
        ("dataset", "wtq"),
        ("dataset_sha256", "d" * 64),
        ("style", {"linearization": "csv"}),
        ("seed", 1),
        ("metrics", ["judge"]),
    ],
)
def test_a_resume_under_another_identity_is_refused_naming_the_difference(tmp_path, key, value):
    folder = _folder_with_a_record(tmp_path)
    with pytest.raises(ManifestMismatch, match=rf"(?s){key.split('_')[0]}.*recorded.*this run.*--restart"):
        folder.begin({**IDENTITY, key: value}, ATTACKS, {"argv": ["second"]})
    assert folder.done_keys() == {("e1", "vanilla")}  # nothing was touched


def test_attacks_may_be_added_but_never_redefined(tmp_path):
    folder = _folder_with_a_record(tmp_path)
    more = {**ATTACKS, "best_of_k": {"method": "best_of_k", "k": 20}}
    manifest = folder.begin(IDENTITY, more, {"argv": ["second"]})
    assert set(manifest["attacks"]) == {"vanilla", "best_of_k"} and len(manifest["provenance"]) == 2
    with pytest.raises(ManifestMismatch, match="attack best_of_k: recorded"):
        folder.begin(IDENTITY, {"best_of_k": {"method": "best_of_k", "k": 5}}, {"argv": ["third"]})


def test_a_resume_records_its_session_only_once_it_writes_a_record(tmp_path):
    folder = _folder_with_a_record(tmp_path)
    before = folder.manifest_file.read_bytes()
    resumed = ResultsFolder(tmp_path / "run")
    resumed.begin(IDENTITY, ATTACKS, {"argv": ["second"]}, flags_text="--seed=0\n")
    assert folder.manifest_file.read_bytes() == before and not folder.flags_file.exists()  # nothing new yet
    resumed.append({"id": "e2", "attack": "vanilla", "answer_loss": 2.0})
    manifest = json.loads(folder.manifest_file.read_text())
    assert [s["argv"] for s in manifest["provenance"]] == [["first"], ["second"]]
    assert folder.flags_file.read_text() == "--seed=0\n"
    resumed.append({"id": "e3", "attack": "vanilla", "answer_loss": 3.0})
    assert len(json.loads(folder.manifest_file.read_text())["provenance"]) == 2  # once per session


def test_a_session_that_adds_an_attack_records_itself_at_once(tmp_path):
    _folder_with_a_record(tmp_path)
    more = {**ATTACKS, "row_reverse": {"method": "row_reverse", "mode": "joint"}}
    ResultsFolder(tmp_path / "run").begin(IDENTITY, more, {"argv": ["second"]})
    manifest = json.loads((tmp_path / "run" / "run.json").read_text())
    assert set(manifest["attacks"]) == set(more) and len(manifest["provenance"]) == 2


def test_a_field_added_to_a_method_since_resumes_only_at_its_default(tmp_path):
    from atp_jax.attack.presets import preset

    current = preset("atp_joint").as_dict()
    before = {k: v for k, v in current.items() if k != "positions"}  # recorded before ATP had `positions`
    folder = ResultsFolder(tmp_path / "run")
    folder.begin(IDENTITY, {"atp_joint": before}, {"argv": ["first"]})
    folder.append({"id": "e1", "attack": "atp_joint", "answer_loss": 1.0})
    folder.begin(IDENTITY, {"atp_joint": current}, {"argv": ["second"]})  # the default: the old behaviour
    with pytest.raises(ManifestMismatch, match="attack atp_joint: recorded"):
        folder.begin(IDENTITY, {"atp_joint": {**current, "positions": "soft"}}, {"argv": ["third"]})
    with pytest.raises(ManifestMismatch, match="attack atp_joint: recorded"):
        folder.begin(IDENTITY, {"atp_joint": {**current, "lr": 0.5}}, {"argv": ["fourth"]})


def test_restart_sets_the_old_records_aside(tmp_path):
    folder = _folder_with_a_record(tmp_path)
    folder.begin({**IDENTITY, "seed": 1}, ATTACKS, {"argv": ["second"]}, restart=True)
    assert folder.done_keys() == set()
    kept = sorted(p.name.split(".replaced-")[0] for p in folder.path.iterdir() if ".replaced-" in p.name)
    assert kept == ["results.jsonl", "run.json"]
    assert json.loads(folder.manifest_file.read_text())["seed"] == 1


def test_records_without_a_current_manifest_are_refused(tmp_path):
    folder = ResultsFolder(tmp_path / "old")
    folder.path.mkdir()
    folder.manifest_file.write_text(json.dumps({"model": "m"}))  # a manifest of an older version
    folder.append({"id": "e1", "attack": "vanilla"})
    with pytest.raises(ManifestMismatch, match="without a version-2 manifest"):
        folder.begin(IDENTITY, ATTACKS, {})


def test_fingerprints_name_the_files_not_their_location(tmp_path, tiny_checkpoint):
    sample = dataset_fingerprint("sample")
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((REPO / "atp_jax" / "data" / "wtq_sample.jsonl").read_bytes())
    assert dataset_fingerprint(str(copy))["dataset_sha256"] == sample["dataset_sha256"]
    assert (
        model_fingerprint(str(tiny_checkpoint))["model_sha256"]
        == model_fingerprint(str(tiny_checkpoint))["model_sha256"]
    )
    assert len(model_fingerprint("smollm2-135m-instruct")["model_sha256"]) == 64
    with pytest.raises(ValueError, match="not a zoo name"):
        model_fingerprint(str(tmp_path / "missing.gguf"))


def _run(args, timeout=600):
    return run_binary("run_attack", args, timeout)


def _records(folder: Path) -> list[dict]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_the_binary_refuses_a_mixed_resume_and_replays_its_flagfile(tiny_checkpoint, tmp_path):
    out = tmp_path / "run"
    base = [
        "--model",
        str(tiny_checkpoint),
        "--dataset",
        "sample",
        "--num_examples",
        "1",
        "--nogenerate",
        "--attacks",
        "vanilla,row_reverse,best_of_k@k=3",
    ]
    first = _run([*base, "--output_dir", str(out)])
    assert first.returncode == 0, first.stderr[-3000:]
    for change, named in (
        (["--style", "csv"], "style.linearization"),
        (["--seed", "1"], "seed"),
        (["--model", "smollm2-135m-instruct"], "model"),
    ):
        refused = _run([*base, *change, "--output_dir", str(out)])
        assert refused.returncode != 0 and named in refused.stderr and "--restart" in refused.stderr, refused.stderr
    written = {name: (out / name).read_bytes() for name in ("run.json", "flags.txt", "results.jsonl")}
    again = _run([*base, "--output_dir", str(out)])
    assert "1 examples x 3 attacks: 3 recorded, 0 to run" in again.stdout
    assert {name: (out / name).read_bytes() for name in written} == written  # a rerun with nothing to do
    replay = _run(["--flagfile", str(out / "flags.txt"), "--output_dir", str(tmp_path / "replay")])
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert _records(tmp_path / "replay") == _records(out)


def test_restart_sets_aside_records_that_have_no_manifest(tmp_path):
    from atp_jax.runs.manifest import ManifestMismatch, ResultsFolder

    folder = ResultsFolder(tmp_path)
    folder.append({"id": "a", "attack": "vanilla", "answer_loss": 1.0})
    with pytest.raises(ManifestMismatch, match="without a version"):
        folder.begin({"model": "m"}, {}, {})
    folder.begin({"model": "m"}, {}, {}, restart=True)
    assert folder.done_keys() == set()
    assert [p.name.split(".replaced-")[0] for p in tmp_path.glob("*.replaced-*")] == ["results.jsonl"]
