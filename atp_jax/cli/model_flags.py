"""The model flags every binary that loads a model shares, and loading the model they name.

``define_model_flags()`` at import defines ``--model --dtype --tokenizer --remat --mesh``; in ``main``,
``check_model_flags()`` (after ``jax.distributed`` is joined, before anything slow) stops a bad value with one
message, and ``load_model_from_flags()`` loads. ``identity()`` is what of them enters a results folder's
identity (the parameter dtype and a replacement tokenizer change the numbers; the mesh does not) and
``manifest()`` the rest, for the record.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax.numpy as jnp
from absl import flags
from jax.sharding import Mesh

from atp_jax.models.loading import LoadedModel, load_model
from atp_jax.runs.manifest import sha256_files
from atp_jax.sharding import MeshError, describe, make_mesh

FLAGS = flags.FLAGS
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
MODEL_HELP = (
    "Zoo name, HF model directory, .gguf file, Hugging Face Hub id (org/name, downloaded once) or "
    "config:<architecture> (random weights)."
)


def define_model_flags(model: str | None, model_help: str = MODEL_HELP) -> None:
    """``--model`` (default ``model``) ``--dtype --tokenizer --remat --mesh``."""
    flags.DEFINE_string("model", model, model_help)
    flags.DEFINE_enum(
        "dtype",
        "float32",
        list(DTYPES),
        "Parameter dtype (norms, softmax and logits are float32 either way); bfloat16 halves the weights' memory.",
    )
    flags.DEFINE_string("tokenizer", None, "HF tokenizer directory replacing the model's own.")
    flags.DEFINE_bool(
        "remat",
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them: gradients (ATP, "
        "Frank-Wolfe, search) then fit long tables, many restarts or large models, for one more forward each.",
    )
    flags.DEFINE_string(
        "mesh",
        None,
        "This process's devices as AXIS=SIZE,...: model = devices the weights are split over (tensor-parallel), "
        "data = devices splitting independent sequences (restarts, candidate orders), each with a copy of the "
        "weights. Default: every local device on data; data defaults to the devices left over.",
    )


def check_model_flags() -> Mesh | None:
    """The mesh ``--mesh`` names on this process's devices; exits with one message on a bad ``--mesh`` or
    ``--tokenizer``. Call it after ``jax.distributed`` is joined (it asks JAX for the devices)."""
    if FLAGS.tokenizer is not None and not Path(FLAGS.tokenizer).expanduser().is_dir():
        sys.exit(f"--tokenizer {FLAGS.tokenizer}: not a folder; give a saved HF tokenizer's directory")
    try:
        return make_mesh(FLAGS.mesh)
    except MeshError as e:
        sys.exit(str(e))


def load_model_from_flags(spec: str | None = None, mesh: Mesh | None = None) -> LoadedModel:
    """The model ``spec`` (default ``--model``) in ``--dtype`` with ``--tokenizer``, on ``mesh`` (default: the
    ``--mesh`` one); exits with one message naming the model if it cannot be loaded."""
    spec = spec or FLAGS.model
    mesh = check_model_flags() if mesh is None else mesh
    try:
        return load_model(spec, dtype=DTYPES[FLAGS.dtype], tokenizer=FLAGS.tokenizer, mesh=mesh, remat=FLAGS.remat)
    except (ValueError, OSError) as e:  # a corrupt or truncated file, a config the decoder cannot take, the hub
        sys.exit(f"--model {spec}: {e}")


def identity() -> dict:
    """What of these flags changes a result: the parameter dtype and a replacement tokenizer (its files' sha256).

    Each is named only when it differs from the default (float32, the model's own tokenizer), so that folders
    recorded before these flags existed, which hold exactly that, resume as they were."""
    named = {}
    if FLAGS.dtype != "float32":
        named["dtype"] = FLAGS.dtype
    if FLAGS.tokenizer is not None:
        folder = Path(FLAGS.tokenizer).expanduser()
        files = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name in TOKENIZER_FILES)
        named["tokenizer_sha256"] = sha256_files(folder, files)
    return named


def manifest(mesh: Mesh | None) -> dict:
    """What of these flags does not change a result, for the record: the mesh (and ``remat`` when on)."""
    return {"mesh": describe(mesh), **({"remat": True} if FLAGS.remat else {})}
