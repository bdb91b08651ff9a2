"""``atp-attack`` from a checkout (the code is ``atp_jax/cli/run_attack.py``)."""

from atp_jax.cli.run_attack import run

if __name__ == "__main__":
    run()
