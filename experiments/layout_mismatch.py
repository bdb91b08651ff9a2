"""``atp-layout-mismatch`` from a checkout (the code is ``atp_jax/cli/layout_mismatch.py``)."""

from atp_jax.cli.layout_mismatch import run

if __name__ == "__main__":
    run()
