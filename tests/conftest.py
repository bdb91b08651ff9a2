"""Fixtures shared by the test modules: the real SmolLM2 tokenizer, tiny random decoders over it, and the
shared dev data (``$ATP_JAX_DATA``, else ``shared/data`` inside or next to the checkout)."""

import functools
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from atp_jax.models import gguf, zoo
from atp_jax.models.config import ModelConfig
from atp_jax.models.loading import LoadedModel
from atp_jax.models.params import random_model
from atp_jax.tables.table import Example, Table

REPO = Path(__file__).resolve().parents[1]


LARGE_TESTS_ENV = "ATP_JAX_LARGE_TESTS"


def pytest_collection_modifyitems(config, items):
    """Tests marked ``large`` (the 1.5B checkpoint: a 1.1 GB download and minutes of CPU) run only when
    ``$ATP_JAX_LARGE_TESTS`` is 1; the 0.5B tests cover the same loader and architecture in every run."""
    if os.environ.get(LARGE_TESTS_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"the 1.5B checkpoint: set {LARGE_TESTS_ENV}=1 to run")
    for item in items:
        if "large" in item.keywords:
            item.add_marker(skip)


def run_binary(binary: str, args, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs the binary ``atp_jax/cli/<binary>.py`` with ``args`` from the checkout on the CPU (``python -m``, so
    the checkout's package is the one imported); never raises on failure."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", f"atp_jax.cli.{binary}", *map(str, args)],
        cwd=REPO,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of one TensorBoard run as TensorBoard's own reader sees it: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def closed_port() -> int:
    """A local TCP port nothing listens on: a server that refuses connections at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def find_shared_data() -> Path | None:
    """The folder holding ``wtq/dev.jsonl`` and ``scoring_cases/``, or None when this checkout has none."""
    candidates = [os.environ.get("ATP_JAX_DATA"), REPO / "shared" / "data", REPO.parent / "shared" / "data"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "wtq" / "dev.jsonl").is_file():
            return Path(candidate)
    return None


def distinct_presets(*, controls: tuple[str, ...] = ()) -> list[str]:
    """Preset names with one per distinct configuration, leaving out the controls (``direction`` reversed or
    random: a sign or a host-side random ranking on the same code path) except those named in ``controls``.
    Tests that run every attack under a new regime (padding, batching) take these: each code path once."""
    from atp_jax.attack.presets import PRESETS

    seen, names = [], []
    for name, config in PRESETS.items():
        if config in seen or (getattr(config, "direction", "gradient") != "gradient" and name not in controls):
            continue
        seen.append(config)
        names.append(name)
    return names


# Example tables the attack tests share: SMALL and SMALL_TWIN fill one bucket of the default grid (other
# cells, question and answer, the same shape); LARGE is in another.
SMALL = Example(
    "Which team plays in Rome?",
    Table(
        ["Team", "City", "Wins"],
        [["Lions", "Paris", "3"], ["Bears", "Rome", "12"], ["Owls", "Oslo", "7"], ["Foxes", "Lima", "1"]],
    ),
    ["The Bears"],
    "small",
)
# Another table of SMALL's bucket in the default grid: other cells, question and answer, the same shape.
SMALL_TWIN = Example(
    "Which city has the most wins?",
    Table(
        ["Club", "Town", "Wins"],
        [["Hawks", "Bern", "5"], ["Wolves", "Kyiv", "2"], ["Bees", "Nice", "9"], ["Crows", "Riga", "4"]],
    ),
    ["Nice"],
    "small_twin",
)
LARGE = Example(
    "How many medals did the team from Norway win in total?",
    Table(
        ["Rank", "Nation", "Gold", "Silver", "Bronze", "Total"],
        [
            ["1", "Norway", "11", "6", "9", "26"],
            ["2", "United States", "8", "6", "4", "18"],
            ["3", "Germany", "7", "9", "5", "21"],
            ["4", "Netherlands", "8", "7", "4", "19"],
            ["5", "Austria", "4", "8", "5", "17"],
            ["6", "Sweden", "2", "4", "3", "9"],
            ["7", "Switzerland", "2", "1", "1", "4"],
        ],
    ),
    ["26 medals in total"],
    "large",
)


@pytest.fixture
def host_assign_calls(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of the batches the host Hungarian receives, one entry per host call, while the test runs (a
    program traced before the test keeps the uncounted function: trace anew)."""
    from atp_jax.attack import hungarian

    calls = []
    real = hungarian._host_assign

    def counting(D, size):
        calls.append(np.shape(D))
        return real(D, size)

    monkeypatch.setattr(hungarian, "_host_assign", counting)
    return calls


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared dev data folder; tests that take it are skipped where it is absent."""
    found = find_shared_data()
    if found is None:
        pytest.skip("shared dev files not found (set ATP_JAX_DATA)")
    return found


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's real tokenizer (from the zoo's GGUF): prompts tokenize exactly as with the real model.

    ``$ATP_JAX_TEST_TOKENIZER``, a folder where it was saved (``save_pretrained``), stands in for the zoo on a
    machine that can fetch nothing (experiments/device_check.sh)."""
    saved = os.environ.get("ATP_JAX_TEST_TOKENIZER")
    if saved:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(saved)
    return gguf.load_gguf_tokenizer(zoo.resolve("smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def tiny_llama(smollm2_tokenizer):
    """Builds a random 64-wide Llama over SmolLM2's vocabulary: fast, and exact checks need no real weights."""
    return functools.partial(_tiny_llama, smollm2_tokenizer)


@pytest.fixture(scope="session")
def sharp(tiny_llama):
    """A tiny untied decoder with sharp attention: its answers (and so the KL objective) depend on the order."""
    loaded = tiny_llama(tie_word_embeddings=False)
    for name in ("q_proj", "k_proj"):
        weight = getattr(loaded.model.layers, name)
        weight[...] = 10.0 * weight[...]
    return loaded


def _tiny_llama(tokenizer, *, num_layers: int = 2, tie_word_embeddings: bool = True, seed: int = 0) -> LoadedModel:
    config = ModelConfig(
        architecture="llama",
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        tie_word_embeddings=tie_word_embeddings,
    )
    return LoadedModel("tiny", config, random_model(config, seed=seed), tokenizer, "random", 0.0)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, smollm2_tokenizer):
    """A 2-layer random Llama saved the Hugging Face way, with SmolLM2's tokenizer beside it: what the
    experiment binaries take as ``--model`` when a test runs them end to end."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = tmp_path_factory.mktemp("tiny_llama")
    config = transformers.LlamaConfig(
        vocab_size=len(smollm2_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).float().save_pretrained(path, safe_serialization=True)
    smollm2_tokenizer.save_pretrained(path)
    return path
