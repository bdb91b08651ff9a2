"""``atp-diagnose`` from a checkout (the code is ``atp_jax/cli/diagnose.py``)."""

from atp_jax.cli.diagnose import run

if __name__ == "__main__":
    run()
