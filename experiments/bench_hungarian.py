"""``atp-bench-hungarian`` from a checkout (the code is ``atp_jax/cli/bench_hungarian.py``)."""

from atp_jax.cli.bench_hungarian import run

if __name__ == "__main__":
    run()
