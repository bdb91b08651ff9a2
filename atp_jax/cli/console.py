"""How every binary starts and speaks: the console-script entry, and output that stays readable when many processes
of one run write one log.

``run_app(main, __doc__)`` runs an absl ``main`` whether it was started as a console script (``atp-attack``), as
``python -m atp_jax.cli.run_attack`` or through an ``experiments/`` shim, and ``--help`` shows the binary's own
docstring in each case. Once a binary knows its process index, ``tag_process(index, count)`` prefixes every
log line (absl's and every library's, through absl's handler) and every ``tagged`` line with ``[process K/N]``
when there are several processes; binaries draw progress bars and print final tables from process 0 only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from absl import app, logging

_tag = ""


class _ProcessTagFormatter(logging.PythonFormatter):
    """absl's log line format with the process tag in front."""

    def format(self, record) -> str:
        return f"{_tag}{super().format(record)}"


def run_app(main: Callable[[list[str]], None], doc: str | None) -> None:
    """Runs ``main`` as an absl app; ``--help`` shows ``doc``, the binary module's docstring (absl prints
    ``__main__``'s, which a console script's generated wrapper lacks)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before jaxlib logs anything
    sys.modules["__main__"].__doc__ = doc
    app.run(main)


def tag_process(process_index: int, process_count: int) -> None:
    """From now on, log lines and ``tagged`` lines start with ``[process K/N] `` when ``process_count > 1``."""
    global _tag
    _tag = f"[process {process_index}/{process_count}] " if process_count > 1 else ""
    logging.get_absl_handler().setFormatter(_ProcessTagFormatter())


def tagged(line: str) -> str:
    """``line`` with this process's tag in front (unchanged for a single process)."""
    return f"{_tag}{line}"
