"""The flags that make a victim behind an OpenAI-compatible server (``atp_jax.inference.server``), shared by
``atp-attack`` and ``atp-transfer``.

With ``--victim_url`` the attacked model is the server's; ``--model`` (or ``--tokenizer``) then names a local copy
of the served model, used only for its tokenizer and chat template (not needed with ``--victim_endpoint chat``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from absl import flags

from atp_jax.attack.presets import preset
from atp_jax.attack.registry import method_of
from atp_jax.http_client import RequestPolicy
from atp_jax.inference.server import ENDPOINTS, ServerVictim, VictimError
from atp_jax.models.loading import load_tokenizer
from atp_jax.runs.fingerprints import model_fingerprint

FLAGS = flags.FLAGS
CACHE_FILE = "victim_cache.jsonl"  # in the results folder: replies kept across reruns and resumes


def define_victim_flags() -> None:
    flags.DEFINE_string(
        "victim_url",
        None,
        "Attack the model behind this OpenAI-compatible server (vLLM, SGLang, llama.cpp, a hosted API), e.g. "
        "http://127.0.0.1:8000, instead of an in-process model; gradient-free attacks only.",
    )
    flags.DEFINE_string("victim_name", "victim", "The model name sent to --victim_url.")
    flags.DEFINE_string("victim_api_key_env", "OPENAI_API_KEY", "Environment variable holding --victim_url's API key.")
    flags.DEFINE_enum(
        "victim_endpoint",
        "auto",
        list(ENDPOINTS),
        "echo: the CE from the prompt's echoed log-probabilities (vLLM); forced: one request per answer token "
        "(llama.cpp servers); chat: answers only, attacked on their score (hosted chat APIs); auto: echo where it "
        "agrees with forced on the first prompt, else forced.",
    )
    flags.DEFINE_integer("victim_concurrency", 4, "Requests to --victim_url in flight at once.", lower_bound=1)
    flags.DEFINE_float("victim_deadline", 120.0, "Seconds one request may take, retries included.", lower_bound=1.0)
    flags.DEFINE_integer(
        "victim_query_budget",
        None,
        "Most queries (distinct orders) one attack may send for one example; an attack asking more is a recorded "
        "skip. Default: no cap.",
        lower_bound=1,
    )


def check_attacks(names) -> None:
    """Exits naming the first attack a server victim cannot run (one that needs the gradient)."""
    for name in names:
        if method_of(preset(name)).uses_gradient:
            sys.exit(
                f"--attacks: {name!r} needs the model's gradient, which a server victim (--victim_url) does not give; "
                "use vanilla, random, best_of_k, row_reverse, col_reverse, evolution (or the group closed_table), "
                "or find orders on an open model and replay them with atp-transfer --victim_url"
            )


def identity(tokenizer_model: str | None = None) -> dict:
    """What names the victim in a results folder: the server's model and the local copy whose tokenizer renders
    its prompts (``tokenizer_model``, default ``--model``: its fingerprint; none for the chat endpoint without
    one)."""
    named = {"model": f"{FLAGS.victim_name} at {FLAGS.victim_url}", "victim": _describe()}
    if FLAGS.victim_endpoint != "chat" or FLAGS.tokenizer:
        try:
            spec = tokenizer_model or FLAGS.model
            named["tokenizer_of"] = {"dir": FLAGS.tokenizer} if FLAGS.tokenizer else model_fingerprint(spec)
        except ValueError as e:
            sys.exit(str(e))
    return named


def _describe() -> dict:
    return {"url": FLAGS.victim_url, "name": FLAGS.victim_name, "endpoint": FLAGS.victim_endpoint}


def victim_from_flags(folder: Path | None, tokenizer_model: str | None = None) -> ServerVictim:
    """The victim the flags name, probed once; replies cached in ``folder`` (None: in memory); the tokenizer from
    ``--tokenizer``, else ``tokenizer_model`` (default ``--model``). Exits with one message when the tokenizer
    cannot be loaded or the server does not answer."""
    tokenizer = None
    if FLAGS.victim_endpoint != "chat" or FLAGS.tokenizer:
        spec = tokenizer_model or FLAGS.model
        try:
            tokenizer = load_tokenizer(spec, FLAGS.tokenizer)
        except (ValueError, OSError) as e:
            sys.exit(f"--model {spec}: the served model's tokenizer renders its prompts: {e}")
    try:
        victim = ServerVictim(
            FLAGS.victim_url,
            FLAGS.victim_name,
            FLAGS.victim_endpoint,
            tokenizer,
            api_key=os.environ.get(FLAGS.victim_api_key_env),
            policy=RequestPolicy(deadline=FLAGS.victim_deadline, attempt_timeout=FLAGS.victim_deadline / 2),
            max_concurrency=FLAGS.victim_concurrency,
            cache_path=None if folder is None else folder / CACHE_FILE,
        )
        victim.check()
    except (ValueError, VictimError) as e:
        sys.exit(f"--victim_url {FLAGS.victim_url}: {e}")
    return victim
