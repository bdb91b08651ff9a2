"""``atp-bucket-grid`` from a checkout (the code is ``atp_jax/cli/bucket_grid.py``)."""

from atp_jax.cli.bucket_grid import run

if __name__ == "__main__":
    run()
