"""Runs attacks on table-QA examples and records one result per (example, attack).

  atp-attack --model smollm2-135m-instruct --num_examples 12 \
      --attacks vanilla,best_of_k,paper,search,search_reversed,search_random --output_dir results/smollm

Results go to ``OUTPUT_DIR/results.jsonl`` (or ``results.shardK.jsonl`` per process), appended
atomically; a rerun skips the (id, attack) pairs already recorded. ``run.json`` holds the config.

``--victim_url URL`` attacks the model behind an OpenAI-compatible server instead (gradient-free attacks;
``--model`` then names a local copy of the served model, for its tokenizer; see ``atp_jax.inference.server``):

  atp-attack --victim_url http://127.0.0.1:8000 --victim_name Qwen/Qwen2.5-7B-Instruct \
      --model Qwen/Qwen2.5-7B-Instruct --attacks closed_table --output_dir results/qwen7b_server

``--smoothing_k 1,5,9`` also answers each chosen order under the permutation-smoothing defense
(``atp_jax.defense.smoothing``) with 1, 5 and 9 votes, recorded under ``defended``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys

from absl import flags

from atp_jax.attack.presets import ATTACK_GROUPS, PRESETS, attack_names, canonical, preset
from atp_jax.cli import selection, victim_flags
from atp_jax.cli.console import run_app, tag_process, tagged
from atp_jax.cli.model_flags import load_model_from_flags
from atp_jax.defense.smoothing import SmoothingConfig
from atp_jax.distributed import maybe_initialize
from atp_jax.eval.judge import PAPER_JUDGE_PROMPT, ModelJudge, OpenAICompatibleJudge
from atp_jax.eval.scoring import Scorer, metric_names
from atp_jax.models.loading import DEFAULT_MODEL
from atp_jax.runs.defense_report import defense_table
from atp_jax.runs.folders import merge_records, results_files
from atp_jax.runs.loop import Job, pending, run_pending
from atp_jax.runs.report import broken_answers, compile_rows, markdown_table, summarize
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import ANSWER_FORMATS, PromptStyle

# With no flags this is the demo (README): the paper's table on two small sample tables, ≤ 10 min on 2 CPU cores.
selection.define_flags(num_examples=2, max_rows=8, max_cols=5)
selection.define_run_flags(model=DEFAULT_MODEL, output_dir="results/demo", tracking=True)
selection.define_bucket_flags()
victim_flags.define_victim_flags()
flags.DEFINE_enum("style", "markdown", list(STYLES), "Table linearization.")
flags.DEFINE_list(
    "attack_modules",
    [],
    "Python modules imported first, which may register attack methods "
    "(atp_jax.attack.registry.register) and presets (atp_jax.attack.presets.register_preset).",
)
flags.DEFINE_enum(
    "answer_format",
    "dataset",
    list(ANSWER_FORMATS),
    "How the prompt asks for the answer: "
    "dataset (TAT-QA: a number with its scale word or percent sign) or plain (one wording for all).",
)
flags.DEFINE_bool(
    "paragraphs",
    False,
    "Show each example's paragraphs (TAT-QA's text beside the table, read from its official release) after the "
    "table; they stay in place while the table is permuted.",
)
flags.DEFINE_list(
    "attacks",
    ["paper_table"],
    f"Comma list of: {', '.join(PRESETS)}; or a group: "
    + "; ".join(f"{k} = {', '.join(v)}" for k, v in ATTACK_GROUPS.items() if k != "all")
    + "; all = every attack.",
)
flags.DEFINE_integer("n_attack", None, "Override steps/iterations of gradient attacks.")
flags.DEFINE_float("lambda_row", None, "Override λ_r of ATP attacks.")
flags.DEFINE_float("lambda_col", None, "Override λ_c of ATP attacks.")
flags.DEFINE_integer("restarts", None, "Override restarts of ATP attacks.")
flags.DEFINE_integer("seed", 0, "Seed of every attack.")
flags.DEFINE_integer("max_new_tokens", 32, "Generation budget for the answer under the chosen order.")
flags.DEFINE_bool("generate", True, "Generate and score the model's answer under each chosen order.")
flags.DEFINE_list(
    "smoothing_k",
    [],
    "Permutation-smoothing defense: comma list of vote counts (e.g. 1,5,9) to "
    "evaluate on each chosen order; empty: no defense. Needs --generate.",
)
flags.DEFINE_bool(
    "smoothing_canonical",
    True,
    "Draw the smoothing orders from the table's canonical order (the "
    "answer then depends on the content only); false: from the order it arrives in.",
)
flags.DEFINE_bool("smoothing_include_original", False, "The arriving (attacked) order casts one extra, first vote.")
flags.DEFINE_list("metrics", ["auto"], f"Scores of each answer: {', '.join(metric_names())} (auto: the dataset's own).")
flags.DEFINE_string("judge_model", None, "The 'judge' metric with a local model: zoo name, HF directory or .gguf.")
flags.DEFINE_string("judge_url", None, "The 'judge' metric from an OpenAI-compatible server, e.g. http://host:8000.")
flags.DEFINE_string("judge_name", "judge", "The model name sent to --judge_url.")
flags.DEFINE_string("judge_api_key_env", "OPENAI_API_KEY", "Environment variable holding --judge_url's API key.")
FLAGS = flags.FLAGS

_FIELD_FLAGS = ("n_attack", "lambda_row", "lambda_col", "restarts")  # applied to the attacks that have the field


def _configs(names: list[str]) -> dict:
    """{recorded spec: config}: the field flags fold into each attack's name, so a run with other settings
    records other names and never mixes into the columns of this one."""
    configs = {}
    for name in names:
        base = preset(name)
        overrides = {f: getattr(FLAGS, f) for f in _FIELD_FLAGS if getattr(FLAGS, f) is not None and hasattr(base, f)}
        configs[canonical(name, **overrides)] = preset(name, seed=FLAGS.seed, **overrides)
    return configs


def _smoothing_ks(values: list[str], generate: bool) -> tuple[int, ...] | str:
    """The sorted distinct vote counts of ``--smoothing_k``, or the message naming what is wrong."""
    ks = []
    for value in values:
        try:
            k = int(value)
        except ValueError:
            k = 0
        if k < 1:
            return (
                f"--smoothing_k={','.join(values)}: {value!r} is not a vote count; give integers >= 1, "
                "e.g. --smoothing_k 1,5,9 (or leave it empty for no defense)"
            )
        ks.append(k)
    if ks and not generate:
        return (
            "--smoothing_k needs --generate: the defense votes over generated answers; drop --nogenerate "
            "or --smoothing_k"
        )
    return tuple(sorted(set(ks)))


def _judge_from_url() -> OpenAICompatibleJudge | None:
    """Checks the metric and judge flags; the URL judge, probed once, or None."""
    unknown = [m for m in FLAGS.metrics if m not in metric_names()]
    if unknown:
        sys.exit(f"--metrics: unknown {', '.join(unknown)}; choose from {', '.join(metric_names())}")
    wants_judge = "judge" in FLAGS.metrics
    if wants_judge != bool(FLAGS.judge_model or FLAGS.judge_url) or (FLAGS.judge_model and FLAGS.judge_url):
        sys.exit(
            "the 'judge' metric needs exactly one of --judge_model or --judge_url, and they need "
            "--metrics to include judge (e.g. --metrics auto,judge --judge_url http://host:8000)"
        )
    if wants_judge and not FLAGS.generate:
        sys.exit("--metrics judge scores generated answers: drop --nogenerate")
    if not FLAGS.judge_url:
        return None
    try:
        api_key = os.environ.get(FLAGS.judge_api_key_env)
        judge = OpenAICompatibleJudge(FLAGS.judge_url, FLAGS.judge_name, api_key=api_key)
        judge.check()
    except (ValueError, ConnectionError) as e:
        sys.exit(f"--judge_url {FLAGS.judge_url}: {e}")
    return judge


def _running_means(record: dict, running: dict) -> dict:
    """Progress-bar postfix: the mean loss (and first score) so far of the attack that just ran."""
    if "skipped" in record:
        return {"attack": record["attack"], "skipped": record["skipped"][:40]}
    losses, scores = running.setdefault(record["attack"], ([], []))
    losses.append(record["answer_loss"])
    values = [v for v in (record.get("scores") or {}).values() if isinstance(v, (int, float))]
    if values:
        scores.append(values[0])
    postfix = {"attack": record["attack"], "mean_CE": f"{sum(losses) / len(losses):.3f}"}
    if scores:
        postfix["mean_score"] = f"{sum(scores) / len(scores):.3f}"
    return postfix


def main(argv):
    del argv
    # First: jax.distributed must be joined before anything creates a backend.
    jax_index, jax_count = maybe_initialize(FLAGS.distributed)
    for module in FLAGS.attack_modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            sys.exit(f"--attack_modules: cannot import {module!r} ({e}); is it on PYTHONPATH?")
    try:
        attacks = attack_names(FLAGS.attacks)
    except ValueError as e:
        sys.exit(str(e))
    smoothing_ks = _smoothing_ks(FLAGS.smoothing_k, FLAGS.generate)
    if isinstance(smoothing_ks, str):
        sys.exit(smoothing_ks)
    if FLAGS.victim_url:
        victim_flags.check_attacks(attacks)
        if smoothing_ks:
            sys.exit("--smoothing_k runs in process: drop it with --victim_url")
        if FLAGS.batch_examples > 1:
            sys.exit("--batch_examples batches questions on an in-process model: drop it with --victim_url")
    smoothing = None
    if smoothing_ks:
        smoothing = SmoothingConfig(
            k=max(smoothing_ks),
            canonical=FLAGS.smoothing_canonical,
            include_original=FLAGS.smoothing_include_original,
            seed=FLAGS.seed,
        )
    process_index = jax_index if FLAGS.process_index is None else FLAGS.process_index
    process_count = jax_count if FLAGS.process_count is None else FLAGS.process_count
    tag_process(process_index, process_count)
    # Everything a user can get wrong is checked here, before a model is loaded.
    judge_url = _judge_from_url()
    examples = selection.examples(process_index, process_count)
    if not examples:
        sys.exit(
            f"--dataset {FLAGS.dataset}: no examples selected (--num_examples {FLAGS.num_examples}, --max_rows "
            f"{FLAGS.max_rows}, --max_cols {FLAGS.max_cols}, --filter_order_sensitive "
            f"{FLAGS.filter_order_sensitive}); loosen the selection"
        )
    if FLAGS.paragraphs and not any(example.paragraphs for example in examples):
        sys.exit(
            f"--paragraphs: the examples of --dataset {FLAGS.dataset} carry no paragraphs; read TAT-QA from its "
            "official release (--dataset tatqa --data_dir <a TAT-QA checkout>), or drop --paragraphs"
        )
    style = PromptStyle(linearization=FLAGS.style, answer_format=FLAGS.answer_format, paragraphs=FLAGS.paragraphs)
    configs = _configs(attacks)
    identity = {
        "style": style.as_dict(),
        "seed": FLAGS.seed,
        "metrics": FLAGS.metrics,
        "judge": FLAGS.judge_model or (FLAGS.judge_url and f"{FLAGS.judge_name} at {FLAGS.judge_url}"),
        "judge_prompt": PAPER_JUDGE_PROMPT.summary() if "judge" in FLAGS.metrics else None,
        "generate": FLAGS.generate,
        "max_new_tokens": FLAGS.max_new_tokens,
        "smoothing": None if smoothing is None else {**dataclasses.asdict(smoothing), "ks": list(smoothing_ks)},
    }
    if FLAGS.victim_url:
        identity["victim_query_budget"] = FLAGS.victim_query_budget
    folder = selection.open_folder(
        identity,
        {k: v.as_dict() for k, v in configs.items()},
        len(examples),
        process_index=process_index,
        process_count=process_count,
        model_identity=victim_flags.identity() if FLAGS.victim_url else None,
    )
    sinks = selection.open_sinks(
        {**identity, "model": FLAGS.model, "dataset": FLAGS.dataset, "attacks": list(configs)},
        process_index,
        process_count,
    )

    if FLAGS.victim_url:
        model = victim_flags.victim_from_flags(folder.path)
        options = {"query_budget": FLAGS.victim_query_budget}
    else:
        model = load_model_from_flags()
        options = {
            "smoothing": smoothing,
            "smoothing_ks": smoothing_ks or None,
            "memory_budget_bytes": selection.memory_budget(),
            "buckets": selection.bucket_grid(),
            "batch_examples": FLAGS.batch_examples,
        }
    judge = judge_url
    if FLAGS.judge_model:
        if FLAGS.judge_model == FLAGS.model and not FLAGS.victim_url:
            judge = ModelJudge.from_model(model)
        else:
            judge = ModelJudge.from_model(load_model_from_flags(FLAGS.judge_model, getattr(model, "mesh", None)))
    scorer = Scorer(tuple(FLAGS.metrics), judge)

    jobs = [Job(folder, name, config) for name, config in configs.items()]
    recorded = len(folder.done_keys())
    print(
        tagged(
            f"{len(examples)} examples x {len(configs)} attacks: {recorded} recorded, "
            f"{len(pending(examples, jobs))} to run"
        )
    )
    running = {}
    run_pending(
        model,
        examples,
        jobs,
        style,
        on_record=lambda record: _running_means(record.as_dict(), running),
        sinks=sinks,
        progress=process_index == 0,
        generate=FLAGS.generate,
        max_new_tokens=FLAGS.max_new_tokens,
        scorer=scorer,
        **options,
    )
    for sink in sinks:
        sink.close()
    if process_index != 0:
        return  # process 0 prints the tables: one copy per process would bury a shared log
    records = [r for r in merge_records(results_files(folder.path)) if "skipped" not in r]
    if process_count > 1:
        print(f"Every shard of {folder.path} recorded so far (atp-report --results {folder.path} when all are done):")
    print(markdown_table(summarize(records)))
    broken = broken_answers(records)
    if broken:
        print("\nAnswers right in the original order and wrong in the attack's:")
        print(markdown_table(broken))
    compiles = compile_rows(records)
    if compiles:
        print("\nCompiles (XLA programs built and seconds spent making them, per attack):")
        print(markdown_table(compiles))
    if any(r.get("defended") for r in records):
        print(defense_table(records))


def run() -> None:
    """The console script ``atp-attack``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
