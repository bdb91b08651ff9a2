"""Compile accounting and the persistent cache: a run records the programs each attack built, and a second
process with the cache on fetches them instead of compiling (JAX's own cache-hit events say so)."""

import json
import logging

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


def _compiled_names(records) -> list[str]:
    prefix = "Finished XLA compilation of "
    return [r.getMessage()[len(prefix) :].split(" ")[0] for r in records if r.getMessage().startswith(prefix)]


def test_an_attack_on_a_new_bucket_compiles_only_named_programs(tiny_llama, caplog):
    """Host values reach the device by transfer: a question of a new shape bucket compiles the attack's own
    programs and no eager staging or conversion program (``jnp.asarray`` of a host array compiles one per shape
    and dtype, which a sweep pays again at every bucket)."""
    from atp_jax.attack.presets import preset
    from atp_jax.attack.run import attack
    from atp_jax.tables.table import Example, Table

    loaded = tiny_llama()

    def example(n_rows: int, n_cols: int, name: str) -> Example:
        header = [f"c{j}" for j in range(n_cols)]
        rows = [[f"r{i}v{j}" for j in range(n_cols)] for i in range(n_rows)]
        return Example("Which row comes first?", Table(header, rows), ["r0v0"], name, dataset="wtq")

    attacks = [preset(name) for name in ("vanilla", "best_of_k", "atp_joint", "search")]
    for config in attacks:  # the first bucket: every per-process program (PRNG key setup included) compiles here
        attack(loaded, example(3, 2, "small"), config)
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            for config in attacks:
                attack(loaded, example(20, 9, "large"), config)
    finally:
        jax.config.update("jax_log_compiles", False)
    names = _compiled_names(caplog.records)
    assert names, "a new bucket must compile the attack's programs"  # the check sees compiles at all
    eager = [n for n in names if n in {"jit(stage)", "jit(convert_element_type)", "jit(broadcast_in_dim)"}]
    assert not eager, f"eager programs compiled for a new bucket: {names}"


def test_atp_start_program_is_shared_by_buckets_of_one_table_size(tiny_llama, caplog):
    """ATP's start θ (random-number kernels) is a program of its own that depends on the padded table size
    only: a question whose prompt length falls in a new bucket but whose table pads to the same rows and
    columns compiles ATP's optimisation program again and not the start program."""
    from atp_jax.attack.presets import preset
    from atp_jax.attack.run import attack
    from atp_jax.tables.table import Example, Table

    loaded = tiny_llama()

    def example(cell: str, name: str) -> Example:
        rows = [[f"{cell}{i}{j}" for j in range(3)] for i in range(4)]
        return Example("Which row comes first?", Table(["a", "b", "c"], rows), ["x"], name, dataset="wtq")

    config = preset("atp_joint", n_attack=2, restarts=3)  # restarts no other test uses: nothing compiled yet
    compiled = []
    jax.config.update("jax_log_compiles", True)
    try:
        for cell, name in (("v", "short"), ("a much longer cell value, many tokens ", "long")):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="jax"):
                attack(loaded, example(cell, name), config)
            compiled.append(_compiled_names(caplog.records))
    finally:
        jax.config.update("jax_log_compiles", False)
    first, second = compiled
    assert "jit(_run_atp)" in first and "jit(_start_thetas)" in first, first
    assert "jit(_run_atp)" in second, second  # a new bucket
    assert "jit(_start_thetas)" not in second, second
