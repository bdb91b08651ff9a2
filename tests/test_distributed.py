"""Multi-process detection and example sharding. ``jax.distributed.initialize`` is replaced by a recorder:
the tests check when it would be called and with what, never start a real coordinator."""

import jax
import pytest

from atp_jax import distributed
from atp_jax.data.datasets import filter_examples, load_dataset
from atp_jax.distributed import detect_cluster, initialize_kwargs, maybe_initialize
from atp_jax.runs.experiment import select_examples

CLUSTER_VARS = (
    "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_NUM_PROCESSES",
    "JAX_PROCESS_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_PROCESS_ADDRESSES",
)


@pytest.fixture
def env(monkeypatch):
    """A process environment with no cluster variables; set the ones a test needs."""
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def calls(monkeypatch):
    recorded = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: recorded.append(kwargs))
    return recorded


@pytest.mark.parametrize(
    "variables, multi",
    [
        ({}, False),
        ({"SLURM_NTASKS": "1"}, False),
        ({"SLURM_NTASKS": "8"}, True),
        ({"SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "1"}, False),  # `srun -n1` inside a bigger allocation
        ({"SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "4"}, True),
        ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, True),
        ({"JAX_COORDINATOR_ADDRESS": "  "}, False),
        ({"TPU_WORKER_HOSTNAMES": "host-0"}, False),  # a single-host TPU VM
        ({"TPU_WORKER_HOSTNAMES": "host-0,host-1,host-2,host-3"}, True),
        ({"TPU_PROCESS_ADDRESSES": "10.0.0.1:8476,10.0.0.2:8476"}, True),
    ],
)
def test_detection(env, variables, multi):
    for name, value in variables.items():
        env.setenv(name, value)
    assert (detect_cluster() is not None) == multi


def test_detection_reasons_name_the_source(env):
    env.setenv("SLURM_NTASKS", "16")
    assert detect_cluster() == "SLURM job step with 16 tasks"
    assert detect_cluster({"TPU_WORKER_HOSTNAMES": "a,b"}) == "TPU slice of 2 hosts (TPU_WORKER_HOSTNAMES)"


def test_bad_integer_variable_is_named(env):
    env.setenv("SLURM_NTASKS", "eight")
    with pytest.raises(ValueError, match="SLURM_NTASKS='eight' is not an integer"):
        detect_cluster()


def test_explicit_coordinator_arguments(env):
    assert initialize_kwargs() == {}
    env.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    env.setenv("JAX_NUM_PROCESSES", "4")
    env.setenv("JAX_PROCESS_ID", "2")
    assert initialize_kwargs() == {"coordinator_address": "10.0.0.1:1234", "num_processes": 4, "process_id": 2}


def test_auto_without_cluster_does_not_initialize(env, calls):
    assert maybe_initialize("auto") == (0, 1)
    assert calls == []


def test_off_never_initializes(env, calls):
    env.setenv("SLURM_NTASKS", "8")
    assert maybe_initialize("off") == (0, 1)
    assert calls == []


def test_auto_on_slurm_lets_jax_read_slurm(env, calls):
    env.setenv("SLURM_NTASKS", "8")
    maybe_initialize("auto")
    assert calls == [{}]


def test_auto_with_coordinator_passes_it(env, calls):
    env.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    env.setenv("JAX_NUM_PROCESSES", "2")
    env.setenv("JAX_PROCESS_ID", "1")
    maybe_initialize("auto")
    assert calls == [{"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1}]


def test_on_always_initializes(env, calls):
    maybe_initialize("on")
    assert calls == [{}]


def test_failed_initialization_says_how_to_opt_out(env, monkeypatch):
    def refuse(**kwargs):
        raise ValueError("coordinator_address should be defined.")

    monkeypatch.setattr(jax.distributed, "initialize", refuse)
    env.setenv("SLURM_NTASKS", "8")
    with pytest.raises(RuntimeError, match=r"SLURM job step with 8 tasks.*--distributed off"):
        maybe_initialize("auto")


def test_unknown_mode(env):
    with pytest.raises(ValueError, match="choose one of auto, off, on"):
        maybe_initialize("yes")
    assert distributed.MODES == ("auto", "off", "on")


# --------------------------------------------------------------------------- example shards


def test_shards_are_disjoint_and_cover_the_selection():
    everything = filter_examples(load_dataset("sample"), order_sensitive=False, max_rows=12, max_cols=8)[:10]
    assert len(everything) == 10
    for count in (1, 3, 4):
        shards = [
            select_examples("sample", num_examples=10, max_rows=12, max_cols=8, process_index=k, process_count=count)
            for k in range(count)
        ]
        ids = [ex.id for shard in shards for ex in shard]
        assert sorted(ids) == sorted(ex.id for ex in everything) and len(set(ids)) == 10
        assert [ex.id for ex in shards[0]] == [ex.id for ex in everything[::count]]


def test_bad_shard_index_is_an_error():
    with pytest.raises(ValueError, match=r"process_index=4 must be in \[0, process_count=4\)"):
        select_examples("sample", process_index=4, process_count=4)
