"""``atp-swap-correlation`` from a checkout (the code is ``atp_jax/cli/swap_correlation.py``)."""

from atp_jax.cli.swap_correlation import run

if __name__ == "__main__":
    run()
