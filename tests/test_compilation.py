"""Compile accounting and the persistent cache: a run records the programs each attack built, and a second
process with the cache on fetches them instead of compiling (JAX's own cache-hit events say so)."""

import json

import jax
import jax.numpy as jnp
from conftest import run_binary

from atp_jax.compilation import compile_totals


def test_totals_count_a_new_program_once():
    before = compile_totals()
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + x.shape[0])
    f(jnp.ones(7)).block_until_ready()
    f(jnp.ones(7)).block_until_ready()  # the same shape: no new program
    after = compile_totals()
    delta = after - before
    assert delta.programs >= 1 and delta.compile_seconds > 0 and delta.trace_seconds > 0
    f(jnp.ones(7)).block_until_ready()
    assert (compile_totals() - after).programs == 0


def test_records_carry_compiles_and_a_rerun_hits_the_cache(tiny_checkpoint, tmp_path):
    # No threshold given: the project's default keeps even the tiny model's sub-second programs.
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla")}
    args = ["--model", tiny_checkpoint, "--num_examples", "1", "--attacks", "vanilla,best_of_k@k=3", "--nogenerate"]
    first = run_binary("run_attack", [*args, "--output_dir", tmp_path / "a"], env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Compiles (XLA programs built" in first.stdout
    records = [json.loads(line) for line in (tmp_path / "a" / "results.jsonl").read_text().splitlines()]
    assert all(r["compiles"]["programs"] >= 0 for r in records) and records[0]["compiles"]["programs"] > 0
    assert any((tmp_path / "xla").iterdir())
    second = run_binary("run_attack", [*args, "--output_dir", tmp_path / "b"], env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    compiles = [json.loads(line)["compiles"] for line in (tmp_path / "b" / "results.jsonl").open()]
    # Every program the rerun asks for comes from the cache, the sub-second ones included.
    assert sum(c["programs"] for c in compiles) > 0
    assert sum(c["cache_hits"] for c in compiles) == sum(c["programs"] for c in compiles)
    off = run_binary("run_attack", [*args, "--nocompilation_cache", "--output_dir", tmp_path / "c"], env=env)
    assert off.returncode == 0, off.stderr[-3000:]
    hits = [json.loads(line)["compiles"]["cache_hits"] for line in (tmp_path / "c" / "results.jsonl").open()]
    assert sum(hits) == 0
