"""Replays the orders found in one run on another model and/or prompt style (transfer of attacks).

  atp-transfer --results results/smollm --model qwen2.5-coder-0.5b-instruct \
      --output_dir results/smollm_to_qwen --generate

Every (example, attack) record of ``--results`` (all shards) is re-scored under its recorded row and
column order: the reference answer's loss on the re-rendered text for the target model and style, and
with ``--generate`` the model's answer and its score. The new folder has the schema of run_attack.py
plus ``transferred_from`` (source folder, model, style and the source's answer_loss) in every record,
so ``report.py --results results/smollm,results/smollm_to_qwen`` puts both in one table.

``--victim_url`` replays the orders on a model behind an OpenAI-compatible server instead (the paper's transfer to
a closed model; ``--model`` then names the local copy whose tokenizer renders the prompts, by default the
source's model, and for a chat-only server the answers' scores stand in for the loss):

  atp-transfer --results results/qwen7b --victim_url https://api.example.com --victim_name gpt-4o \
      --victim_endpoint chat --generate --output_dir results/qwen7b_to_gpt4o
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import flags
from tqdm import tqdm

from atp_jax.cli import model_flags, selection, victim_flags
from atp_jax.cli.console import run_app, tag_process, tagged
from atp_jax.data.datasets import load_dataset
from atp_jax.distributed import MODES, maybe_initialize
from atp_jax.runs.blackbox import replay_on_server
from atp_jax.runs.experiment import environment, replay
from atp_jax.runs.fingerprints import dataset_fingerprint, model_fingerprint
from atp_jax.runs.folders import load_run
from atp_jax.runs.manifest import ManifestMismatch, ResultsFolder, provenance
from atp_jax.runs.records import read_records
from atp_jax.runs.report import markdown_table, summarize
from atp_jax.tables.linearize import STYLES
from atp_jax.tables.prompt import PromptStyle

flags.DEFINE_string("results", None, "The results folder whose orders are replayed.")
model_flags.define_model_flags(
    None, "Target model: zoo name, HF directory, .gguf or hub id (default: the source's, where it was loaded from)."
)
flags.DEFINE_enum("style", None, list(STYLES), "Target table linearization (default: the source's).")
flags.DEFINE_enum("reasoning", None, ["concise", "step_by_step"], "Target answer style (default: the source's).")
flags.DEFINE_string("dataset", None, "Dataset of the source examples (default: the source's run.json).")
flags.DEFINE_string("split", None, "Split (default: the source's run.json).")
flags.DEFINE_string("data_dir", None, "Folder with wtq/, tatqa/, fetaqa/ (default: $ATP_JAX_DATA).")
flags.DEFINE_list("attacks", None, "Replay only these attacks (default: all recorded).")
flags.DEFINE_integer("num_examples", 0, "Replay the first N source examples, 0 for all.")
flags.DEFINE_bool("generate", False, "Also generate and score the target model's answer under each order.")
flags.DEFINE_integer("max_new_tokens", 32, "Generation budget with --generate.")
flags.DEFINE_string("output_dir", None, "Where the transferred results.jsonl and run.json go.")
flags.DEFINE_integer("process_index", None, "This process's shard (default: jax.process_index()).")
flags.DEFINE_integer("process_count", None, "Number of shards (default: jax.process_count()).")
flags.DEFINE_enum(
    "distributed",
    "auto",
    list(MODES),
    "Join jax.distributed: auto (when SLURM/TPU-slice/JAX_COORDINATOR_ADDRESS says so), on, off.",
)
flags.DEFINE_bool(
    "restart",
    False,
    "When --output_dir holds transfers made under another target model, style or source: set them aside "
    "(renamed, never deleted) and start over. Without it such a resume is refused.",
)
victim_flags.define_victim_flags()
flags.mark_flags_as_required(["results", "output_dir"])
FLAGS = flags.FLAGS


def main(argv):
    del argv
    jax_index, jax_count = maybe_initialize(FLAGS.distributed)  # before anything creates a backend
    process_index = jax_index if FLAGS.process_index is None else FLAGS.process_index
    process_count = jax_count if FLAGS.process_count is None else FLAGS.process_count
    tag_process(process_index, process_count)
    source_dir, out = Path(FLAGS.results), Path(FLAGS.output_dir)
    if out.resolve() == source_dir.resolve():
        sys.exit(f"--output_dir={out} is the source folder; write the transfer to a new folder")
    source = load_run(source_dir)
    records = [r for r in source.records if FLAGS.attacks is None or r["attack"] in FLAGS.attacks]
    if not records:
        sys.exit(
            f"no records of attacks {FLAGS.attacks} in {source_dir}; recorded: "
            f"{', '.join(dict.fromkeys(r['attack'] for r in source.records))}"
        )
    ids = list(dict.fromkeys(r["id"] for r in records))
    if FLAGS.num_examples:
        ids = ids[: FLAGS.num_examples]
    if not 0 <= process_index < process_count:
        sys.exit(f"process_index={process_index} must be in [0, process_count={process_count})")
    ids = ids[process_index::process_count]

    dataset = FLAGS.dataset or source.manifest.get("dataset")
    split = FLAGS.split or source.manifest.get("split", "dev")
    if dataset is None:
        sys.exit(f"{source_dir}/run.json names no dataset; pass --dataset")
    examples = {ex.id: ex for ex in load_dataset(dataset, split, FLAGS.data_dir)}
    missing = [i for i in ids if i not in examples]
    if missing:
        sys.exit(
            f"{len(missing)} source example(s) not in dataset {dataset!r} ({split}), e.g. {missing[:3]}; "
            "pass the --dataset/--split/--data_dir the source run used"
        )

    source_style = source.manifest.get("style") or {}
    style = PromptStyle(
        linearization=FLAGS.style or source_style.get("linearization", "markdown"),
        reasoning=FLAGS.reasoning or source_style.get("reasoning", "concise"),
        system=source_style.get("system"),
        # A source recorded before answer formats existed was prompted with the plain wording.
        answer_format=source_style.get("answer_format", "plain"),
        paragraphs=source_style.get("paragraphs", False),
    )
    target = FLAGS.model or source.manifest.get("model_source") or source.model
    origin = {
        "results": str(source_dir),
        "model": source.model,
        "model_sha256": source.manifest.get("model_sha256"),
        "style": source_style,
    }
    folder = ResultsFolder(selection.writable_folder(out), process_index, process_count)
    try:
        model_identity = (
            victim_flags.identity(target)
            if FLAGS.victim_url
            else {**model_fingerprint(target), **model_flags.identity()}
        )
        identity = {
            **model_identity,
            **dataset_fingerprint(dataset, split, FLAGS.data_dir),
            "style": style.as_dict(),
            "generate": FLAGS.generate,
            "max_new_tokens": FLAGS.max_new_tokens,
            "transferred_from": origin,
        }
        recorded = source.manifest.get("attacks", {})
        folder.begin(
            identity,
            {a: recorded.get(a) for a in dict.fromkeys(r["attack"] for r in records)},
            provenance(sys.argv),
            flags_text=FLAGS.flags_into_string(),
            restart=FLAGS.restart,
            extra={"examples": len(ids), **model_flags.manifest(model_flags.check_model_flags()), **environment()},
        )
    except (ManifestMismatch, ValueError) as e:
        sys.exit(str(e) if FLAGS.model else f"{e} (the source's model; pass --model to name its file)")
    if FLAGS.victim_url:
        model, replay_one = victim_flags.victim_from_flags(folder.path, target), replay_on_server
    else:
        model, replay_one = model_flags.load_model_from_flags(target), replay

    done = folder.done_keys()
    by_id = {i: [r for r in records if r["id"] == i and (i, r["attack"]) not in done] for i in ids}
    print(tagged(f"{len(ids)} examples, {sum(map(len, by_id.values()))} orders to replay ({len(done)} recorded)"))
    for example_id in tqdm(ids, desc="replaying", disable=process_index != 0):
        if by_id[example_id]:
            for record in replay_one(
                model,
                examples[example_id],
                by_id[example_id],
                style,
                source=origin,
                generate=FLAGS.generate,
                max_new_tokens=FLAGS.max_new_tokens,
            ):
                folder.append(record)
    if process_index != 0:
        return  # process 0 prints the table: one copy per process would bury a shared log
    print(markdown_table(summarize(r for r in read_records(folder.results_file) if "skipped" not in r)))


def run() -> None:
    """The console script ``atp-transfer``."""
    run_app(main, __doc__)


if __name__ == "__main__":
    run()
