"""``atp-report`` from a checkout (the code is ``atp_jax/cli/report.py``)."""

from atp_jax.cli.report import run

if __name__ == "__main__":
    run()
