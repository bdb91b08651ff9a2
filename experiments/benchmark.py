"""``atp-benchmark`` from a checkout (the code is ``atp_jax/cli/benchmark.py``)."""

from atp_jax.cli.benchmark import run

if __name__ == "__main__":
    run()
