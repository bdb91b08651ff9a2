"""A real llama.cpp server for the black-box victim tests: llama-cpp-python's OpenAI-compatible server (the
``blackbox`` extra) on 127.0.0.1. The tests serve the zoo's SmolLM2 GGUF with its weights dequantized to float32
(``atp_jax.models.gguf.write_dequantized``) and keep its K/V cache in float32, so that the server multiplies the
very weights the in-process JAX model holds at its precision (with llama.cpp's default float16 cache the CEs
differ by up to 0.003 nats, with float32 by 2e-5). On the zoo's own Q4_1 file llama.cpp also quantizes the
activations to 8 bits for its integer dot products, and the two CEs differ by up to tenths of a nat for that
alone (docs/benchmarks/blackbox.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SERVED_NAME = "smollm2"


class LlamaServer:
    """``python -m llama_cpp.server`` serving ``model`` as ``SERVED_NAME`` on ``port``; ``start()`` waits until it
    answers, ``stop()`` kills it."""

    def __init__(self, model: Path, port: int, log: Path):
        self.model, self.port, self.log = model, port, log
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> LlamaServer:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError as e:
            raise RuntimeError(
                f"the black-box tests serve a model with llama-cpp-python's server ({e}); install the project's "
                "blackbox extra: pip install -e '.[dev,blackbox]'"
            ) from None
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", SERVED_NAME,
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", "2048",
            "--n_threads", "2", "--n_threads_batch", "2",
            "--type_k", "0", "--type_v", "0",  # a float32 K/V cache (GGML_TYPE_F32): llama.cpp's f16 default alone
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        stop_at = time.monotonic() + timeout
        while time.monotonic() < stop_at:
            if self.process.poll() is not None:
                raise RuntimeError(f"the llama.cpp server exited at start: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as reply:
                    if SERVED_NAME in json.load(reply)["data"][0]["id"]:
                        return self
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"the llama.cpp server did not answer within {timeout:.0f} s: {self.log.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.process = None
