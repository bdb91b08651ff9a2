"""Multi-process start-up: join ``jax.distributed`` when launched as one of several processes.

The experiment binaries split their examples between processes (each takes every N-th example and
writes its own results shard), so processes never exchange arrays; ``jax.distributed`` is needed only
where the platform insists on it (multi-host TPU slices) and to learn this process's index and the
process count from the cluster. ``maybe_initialize`` must run before anything touches a device:
``jax.distributed.initialize`` refuses to run once a backend exists.

Detection (mode ``auto``), in this order:

* SLURM: more than one task in the job step (``SLURM_STEP_NUM_TASKS``, set by ``srun``; else
  ``SLURM_NTASKS``). JAX reads the rest (node list, task id) from SLURM's variables itself.
* An explicit coordinator: ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0), with
  ``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID`` for platforms JAX cannot ask (plain Kubernetes, VMs).
* A TPU slice of several hosts: ``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES`` listing more
  than one host (what GKE sets). A Cloud TPU VM pod slice without these variables is not detected;
  pass mode ``on`` there (JAX then asks the TPU metadata server).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import jax

MODES = ("auto", "off", "on")

# Explicit-coordinator variables: JAX itself reads only the address; the other two are ours.
COORDINATOR_VAR = "JAX_COORDINATOR_ADDRESS"
NUM_PROCESSES_VAR = "JAX_NUM_PROCESSES"
PROCESS_ID_VAR = "JAX_PROCESS_ID"


def _int_var(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer; fix or unset it") from None


def _hosts(environ: Mapping[str, str], name: str) -> list[str]:
    return [h for h in environ.get(name, "").split(",") if h.strip()]


def detect_cluster(environ: Mapping[str, str] | None = None) -> str | None:
    """Why this process looks like one of several (a short reason), or None for a single process."""
    environ = os.environ if environ is None else environ
    tasks = _int_var(environ, "SLURM_STEP_NUM_TASKS")
    if tasks is None:
        tasks = _int_var(environ, "SLURM_NTASKS")
    if tasks is not None and tasks > 1:
        return f"SLURM job step with {tasks} tasks"
    if environ.get(COORDINATOR_VAR, "").strip():
        return f"{COORDINATOR_VAR}={environ[COORDINATOR_VAR]}"
    for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        hosts = _hosts(environ, name)
        if len(hosts) > 1:
            return f"TPU slice of {len(hosts)} hosts ({name})"
    return None


def initialize_kwargs(environ: Mapping[str, str] | None = None) -> dict:
    """Arguments for ``jax.distributed.initialize`` from the explicit-coordinator variables (those set).

    Everything left out is auto-detected by JAX (SLURM, TPU metadata)."""
    environ = os.environ if environ is None else environ
    kwargs = {}
    if environ.get(COORDINATOR_VAR, "").strip():
        kwargs["coordinator_address"] = environ[COORDINATOR_VAR].strip()
    for var, key in ((NUM_PROCESSES_VAR, "num_processes"), (PROCESS_ID_VAR, "process_id")):
        value = _int_var(environ, var)
        if value is not None:
            kwargs[key] = value
    return kwargs


def maybe_initialize(mode: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """Joins ``jax.distributed`` as ``mode`` says; returns ``(process_index, process_count)``.

    ``off``: never (a single process, or independent processes sharded by flags).
    ``on``: always (JAX finds the cluster, or reads the explicit-coordinator variables).
    ``auto``: when ``detect_cluster`` finds a multi-process launch.
    Call it before any other JAX call that touches a device.
    """
    if mode not in MODES:
        raise ValueError(f"distributed mode {mode!r}: choose one of {', '.join(MODES)}")
    environ = os.environ if environ is None else environ
    reason = detect_cluster(environ) if mode == "auto" else "--distributed on"
    if mode == "on" or (mode == "auto" and reason is not None):
        try:
            jax.distributed.initialize(**initialize_kwargs(environ))
        except Exception as e:  # re-raised with what triggered it and how to opt out
            raise RuntimeError(
                f"jax.distributed.initialize failed ({reason}): {e}. Launch every process of the job "
                f"(srun, an indexed Job, all TPU hosts), set {COORDINATOR_VAR}, {NUM_PROCESSES_VAR} and "
                f"{PROCESS_ID_VAR}, or pass --distributed off to run this process on its own"
            ) from e
    return jax.process_index(), jax.process_count()
