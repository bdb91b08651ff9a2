"""``atp-ablate`` from a checkout (the code is ``atp_jax/cli/ablate.py``)."""

from atp_jax.cli.ablate import run

if __name__ == "__main__":
    run()
