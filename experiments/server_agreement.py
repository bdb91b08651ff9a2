"""``atp-server-agreement`` from a checkout (the code is ``atp_jax/cli/server_agreement.py``)."""

from atp_jax.cli.server_agreement import run

if __name__ == "__main__":
    run()
