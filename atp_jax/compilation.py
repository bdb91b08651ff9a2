"""What compiling costs a run, and the persistent compilation cache that lets reruns skip it.

``compile_totals()`` reads running totals that JAX reports through ``jax.monitoring``: XLA programs
built (each backend compile request, a persistent-cache hit included), seconds tracing to jaxprs,
lowering to MLIR and compiling (or fetching from the cache), and cache hits. Take one before and one
after a piece of work; ``after - before`` is that work's share.

``enable_persistent_cache()`` points JAX's persistent compilation cache at ``<atp_jax cache>/xla`` unless
``JAX_COMPILATION_CACHE_DIR`` (JAX's own setting) already names a folder, which then wins. Every program is
kept, however quickly it compiled (JAX's default keeps only those over a second; a sweep builds dozens of
small ones), unless ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` sets JAX's threshold. JAX never writes a
program that holds a host callback — ATP with ``hungarian="host"`` (SciPy through ``pure_callback``) —
so those compile in every process; ``hungarian="device"`` makes them cacheable.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import jax
from jax import monitoring

from atp_jax.models.zoo import cache_dir

# The event names JAX records (jax/_src/dispatch.py, jax/_src/compiler.py).
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CACHE_ENV_VAR = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_ENV_VAR = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


@dataclasses.dataclass(frozen=True)
class CompileTotals:
    programs: int = 0
    cache_hits: int = 0
    trace_seconds: float = 0.0
    lower_seconds: float = 0.0
    compile_seconds: float = 0.0

    def __sub__(self, other: CompileTotals) -> CompileTotals:
        return CompileTotals(*(a - b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


_lock = threading.Lock()
_totals = CompileTotals()
_installed = False


def _on_duration(event: str, duration: float, **_) -> None:
    global _totals
    field = {TRACE_EVENT: "trace_seconds", LOWER_EVENT: "lower_seconds", COMPILE_EVENT: "compile_seconds"}.get(event)
    if field is None:
        return
    with _lock:
        changes = {field: getattr(_totals, field) + duration}
        if event == COMPILE_EVENT:
            changes["programs"] = _totals.programs + 1
        _totals = dataclasses.replace(_totals, **changes)


def _on_event(event: str, **_) -> None:
    global _totals
    if event == CACHE_HIT_EVENT:
        with _lock:
            _totals = dataclasses.replace(_totals, cache_hits=_totals.cache_hits + 1)


def compile_totals() -> CompileTotals:
    """The totals since the first call (which starts the counting: call it before the work to measure)."""
    global _installed
    with _lock:
        if not _installed:
            monitoring.register_event_duration_secs_listener(_on_duration)
            monitoring.register_event_listener(_on_event)
            _installed = True
        return _totals


def enable_persistent_cache(directory: str | os.PathLike | None = None) -> str:
    """Turns the persistent compilation cache on and returns its folder.

    ``directory`` wins, then ``$JAX_COMPILATION_CACHE_DIR``, then ``<atp_jax cache>/xla``. Call it before the
    first compile; programs compiled earlier in the process are not written.
    """
    jax.config.update("jax_enable_compilation_cache", True)
    folder = directory or os.environ.get(CACHE_ENV_VAR) or str(cache_dir() / "xla")
    Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(Path(folder).expanduser()))
    if MIN_COMPILE_TIME_ENV_VAR not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return str(Path(folder).expanduser())


def disable_persistent_cache() -> None:
    """Turns the persistent compilation cache off, even where ``$JAX_COMPILATION_CACHE_DIR`` names one."""
    jax.config.update("jax_enable_compilation_cache", False)
