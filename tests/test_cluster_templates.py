"""The cluster templates (experiments/cluster/) start the first time: they parse, run binaries with flags
those binaries define, name models the zoo has, keep shards independent, do not count preemptions as
failures, and open the coordinator port JAX's own TPU cluster code uses."""

import re
import shlex
import tomllib
from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import run_binary

from atp_jax.models import zoo

CLUSTER = Path(__file__).resolve().parents[1] / "experiments" / "cluster"
YAMLS = sorted(CLUSTER.glob("*.yaml"))
SBATCH = CLUSTER / "slurm_gpu.sbatch"
SCRIPTS = tomllib.loads((CLUSTER.parents[1] / "pyproject.toml").read_text())["project"]["scripts"]


@cache
def defined_flags(binary: str) -> frozenset[str]:
    """The flags ``atp_jax/cli/<binary>.py`` defines, read from its own --helpfull."""
    done = run_binary(binary, ["--helpfull"], timeout=120)
    names = set(re.findall(r"^\s+--(?:\[no\])?(\w+):", done.stdout, re.MULTILINE))
    assert "model" in names or binary == "report", done.stderr[-2000:]
    return frozenset(names)


def _commands(words: list[str]) -> list[tuple[str, list[str]]]:
    """``(binary, [tokens after it])`` for every console script (``atp-attack``, ``$VENV/bin/atp-report``) or
    ``experiments/NAME.py`` in a shell word list; ``binary`` is the module under ``atp_jax/cli``."""
    found = []
    for i, word in enumerate(words):
        binary = _binary(word)
        if binary:
            rest = []
            for token in words[i + 1 :]:
                if token in ("||", "&&", ";", "|") or _binary(token):
                    break
                rest.append(token)
            found.append((binary, rest))
    return found


def _binary(word: str) -> str | None:
    script = re.fullmatch(r"(?:\S*/)?(atp-[\w-]+)", word)
    if script and script.group(1) in SCRIPTS:
        return SCRIPTS[script.group(1)].split(":")[0].rsplit(".", 1)[1]
    match = re.fullmatch(r"experiments/(\w+)\.py", word)
    return match.group(1) if match else None


def _flags(tokens: list[str]) -> dict[str, str | None]:
    flags = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            name, _, value = token[2:].partition("=")
            nxt = tokens[i + 1] if i + 1 < len(tokens) else None
            flags[name] = value or (nxt if nxt is not None and not nxt.startswith("--") else None)
    return flags


def _containers(document: dict) -> list[dict]:
    """Every container of a Job or a JobSet's replicated Jobs."""
    if document["kind"] == "Job":
        jobs = [document["spec"]]
    else:
        jobs = [r["template"]["spec"] for r in document["spec"]["replicatedJobs"]]
    return [c for job in jobs for c in job["template"]["spec"]["containers"]]


def _yaml_commands(path: Path) -> list[tuple[str, list[str]]]:
    (document,) = yaml.safe_load_all(path.read_text())
    commands = []
    for container in _containers(document):
        line = " ".join([*container.get("command", []), *container.get("args", [])])
        commands += _commands(shlex.split(line))
    return commands


def _sbatch_commands() -> list[tuple[str, list[str]]]:
    # The shell the script runs: line continuations joined, comments dropped, the quoted srun body opened up.
    text = re.sub(r"\\\n", " ", SBATCH.read_text())
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return _commands(shlex.split(text.replace("bash -c '", "bash -c ").replace("' ||", " ||"), comments=True))


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_yaml_templates_run_binaries_with_flags_they_define_and_zoo_models(path):
    commands = _yaml_commands(path)
    assert commands, f"{path.name} runs no atp-* script"
    for binary, tokens in commands:
        flags = _flags(tokens)
        unknown = set(flags) - defined_flags(binary)
        assert not unknown, f"{path.name}: {binary}.py has no flag {sorted(unknown)}"
        assert flags.get("model") in zoo.list_models(), f"{path.name}: --model {flags.get('model')}"


def test_slurm_template_runs_binaries_with_flags_they_define_and_a_zoo_model():
    commands = _sbatch_commands()
    assert [binary for binary, _ in commands] == ["run_attack", "report"]
    for binary, tokens in commands:
        unknown = set(_flags(tokens)) - defined_flags(binary)
        assert not unknown, f"{binary}.py has no flag {sorted(unknown)}"
    (default_model,) = re.findall(r"MODEL=\$\{MODEL:-([^}]+)\}", SBATCH.read_text())
    assert default_model in zoo.list_models()


@pytest.mark.parametrize("path", [*YAMLS, SBATCH], ids=lambda p: p.name)
def test_every_model_a_template_mentions_is_in_the_zoo(path):
    named = set(re.findall(r"\b((?:smollm|qwen|llama)[\w.-]*-instruct)\b", path.read_text()))
    assert named <= set(zoo.list_models()), f"{path.name} names {sorted(named - set(zoo.list_models()))}"


def test_slurm_shards_are_independent():
    (_, tokens), _ = _sbatch_commands()
    flags = _flags(tokens)
    # No jax.distributed (whose coordination service ends every task when one dies), no srun kill of the
    # others, and each task's shard from SLURM itself.
    assert flags["distributed"] == "off"
    assert (flags["process_index"], flags["process_count"]) == ("$SLURM_PROCID", "$SLURM_NTASKS")
    assert "--kill-on-bad-exit=0" in SBATCH.read_text()


def test_kubernetes_jobs_do_not_count_preemptions_as_failures():
    (job,) = yaml.safe_load_all((CLUSTER / "k8s_gpu_job.yaml").read_text())
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]} in rules
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"  # a pod failure policy needs it

    (jobset,) = yaml.safe_load_all((CLUSTER / "k8s_tpu_jobset.yaml").read_text())
    (slice_job,) = jobset["spec"]["replicatedJobs"]
    assert {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget"}]} in slice_job["template"]["spec"][
        "podFailurePolicy"
    ]["rules"]
    assert {"action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"]} in jobset[
        "spec"
    ]["failurePolicy"]["rules"]


def test_tpu_jobset_opens_the_coordinator_port_jax_uses():
    from jax._src.clusters import cloud_tpu_cluster

    (jobset,) = yaml.safe_load_all((CLUSTER / "k8s_tpu_jobset.yaml").read_text())
    (container,) = _containers(jobset)
    ports = {p["containerPort"] for p in container["ports"]}
    assert int(cloud_tpu_cluster.coordinator_port) in ports
    # The slice joins jax.distributed, whose coordinator JAX finds from GKE's TPU variables.
    ((_, tokens),) = _yaml_commands(CLUSTER / "k8s_tpu_jobset.yaml")
    assert _flags(tokens)["distributed"] == "on"
