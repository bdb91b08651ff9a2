"""``atp-answer`` from a checkout (the code is ``atp_jax/cli/answer.py``)."""

from atp_jax.cli.answer import run

if __name__ == "__main__":
    run()
