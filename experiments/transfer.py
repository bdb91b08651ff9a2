"""``atp-transfer`` from a checkout (the code is ``atp_jax/cli/transfer.py``)."""

from atp_jax.cli.transfer import run

if __name__ == "__main__":
    run()
