"""``atp-train`` from a checkout (the code is ``atp_jax/cli/train.py``)."""

from atp_jax.cli.train import run

if __name__ == "__main__":
    run()
