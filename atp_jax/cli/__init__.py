"""The command-line binaries (``atp-attack``, ``atp-report``, …): the top layer, which nothing in the package
imports. Each module defines its absl flags at import and a ``run()`` that the console script calls, so
import one binary per process."""
