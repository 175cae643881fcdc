r"""Command line: the §5 zero-shot heuristics (``gpt_tf/analysis/heuristics.py``) on a pre-training run's checkpoints.

    python -m gpt_tf.analysis.zero_shot --run_dir=runs/books_tiny \
        --task=cola,sst2,story_cloze --data_dir=../shared/data/glue/CoLA,../shared/data/glue/SST-2,../shared/data/story_cloze \
        --output_csv=runs/study/zero_shot_books_tiny.csv [--step=N] [--reference_json=ref.json] [--tb_dir=DIR]

Evaluates every checkpoint the run kept (``run_dir/checkpoints``; or only ``--step``), in step order,
plus (``--include_init``) a fresh initialisation drawn with the run's seed as step 0, and appends one
CSV row per checkpoint and task (``heuristics.CSV_COLUMNS``); ``--tb_dir`` also gets TensorBoard
scalars. ``--data_dir`` lists each task's folder in its official layout, in ``--task`` order.

The tokenizer and the beginning-of-text token come from the run (``gpt_tf.runs.folder.RunFolder``):
``train_config.json`` names the pre-training data, whose ``manifest.json`` names the tokenizer and the document separator, which
is put before every scored text (it is what precedes a document in pre-training). The model is
scored in float32 whatever precision it was trained in. Nothing is written into ``--run_dir``.
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags, logging

from gpt_tf.runs.files import MODEL_CONFIG

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The CLI's flags (defined when it starts, so importing this module defines none)."""
    flags.DEFINE_string("run_dir", None, "Pre-training run (model_config.json, train_config.json, checkpoints/).")
    flags.DEFINE_list("task", [], "Zero-shot tasks: cola, sst2, race, story_cloze, dprd.")
    flags.DEFINE_list("data_dir", [], "Each task's folder (or file) in its official layout, in --task order.")
    flags.DEFINE_string("output_csv", None, "CSV the rows are appended to.")
    flags.DEFINE_integer("step", 0, "Evaluate only this checkpoint step (0: every kept checkpoint).")
    flags.DEFINE_bool("include_init", False, "Also score a fresh initialisation with the run's seed, as step 0.")
    flags.DEFINE_string("tb_dir", "", "Also write TensorBoard scalars here (empty: none).")
    flags.DEFINE_string("tokenizer_dir", "", "BPE files (default: the one the run's pre-training manifest names).")
    flags.DEFINE_string("reference_json", "", "JSON {task: reference score} for the normalised score (Fig. 2 right).")
    flags.DEFINE_integer("max_examples", 0, "Score a fixed hash sample of this many examples per split (0: all).")
    flags.DEFINE_float("holdout_fraction", 0.3, "Story Cloze: score the hash hold-out of val that fine-tuning uses as dev.")
    flags.DEFINE_integer("batch_size", 32, "Sequences per LM call.")


def _check_flags() -> list[str]:
    problems = [f"--{name} is required" for name in ("run_dir", "output_csv") if not getattr(FLAGS, name)]
    if not FLAGS.task:
        problems.append("--task is required (one or more of cola, sst2, race, story_cloze, dprd)")
    if FLAGS.run_dir and not os.path.isfile(os.path.join(FLAGS.run_dir, MODEL_CONFIG)):
        problems.append(f"--run_dir={FLAGS.run_dir} has no {MODEL_CONFIG}: not a gpt_tf pre-training run")
    if FLAGS.reference_json and not os.path.isfile(FLAGS.reference_json):
        problems.append(f"--reference_json={FLAGS.reference_json} does not exist")
    if FLAGS.output_csv and FLAGS.run_dir and os.path.abspath(FLAGS.output_csv).startswith(os.path.abspath(FLAGS.run_dir) + os.sep):
        problems.append("--output_csv must be outside --run_dir (the run is read, never written)")
    return problems


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    from gpt_tf.analysis.heuristics import ZeroShotConfig

    reference = {}
    if FLAGS.reference_json:
        with open(FLAGS.reference_json) as f:
            reference = {k: float(v) for k, v in json.load(f).items() if k in FLAGS.task}
    config = ZeroShotConfig(tasks=tuple(FLAGS.task), data_dirs=tuple(FLAGS.data_dir), max_examples=FLAGS.max_examples,
                            holdout_fraction=FLAGS.holdout_fraction, batch_size=FLAGS.batch_size, reference=reference)
    problems = _check_flags() + config.problems()
    run = None
    if FLAGS.run_dir and os.path.isfile(os.path.join(FLAGS.run_dir, MODEL_CONFIG)):
        from gpt_tf.runs.folder import RunFolder

        try:
            run = RunFolder.open(FLAGS.run_dir, tokenizer_dir=FLAGS.tokenizer_dir)
        except (FileNotFoundError, ValueError) as err:
            problems.append(f"--run_dir={FLAGS.run_dir}: {err}")
    if run is not None and run.kind != "pretrain":
        problems.append(f"--run_dir={FLAGS.run_dir} is not a gpt_tf pre-training run (no train_config.json)")
    elif run is not None:
        problems += run.tokenizer_problems()
    if problems:
        from gpt_tf.flag_checks import fail

        fail("gpt_tf.analysis.zero_shot", problems)

    from gpt_tf.console import import_tensorflow, start_command

    start_command()
    tf = import_tensorflow()  # its start-up lines off the console (GPT_TF_VERBOSE=1 keeps them)
    import keras

    from gpt_tf.analysis.heuristics import ZeroShotSuite, append_csv, write_summaries
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.runs.checkpoints import restore_weights
    from gpt_tf.write_errors import WriteError

    bos_id = run.bos_id
    print(f"beginning-of-text token: {bos_id if bos_id is not None else 'none (first tokens are context only)'}",
          file=sys.stderr, flush=True)
    suite = ZeroShotSuite(config, run.tokenizer, bos_id=bos_id)
    checkpoints = [(s, p) for s, p in run.checkpoints if not FLAGS.step or s == FLAGS.step]
    if not checkpoints:
        sys.exit(f"gpt_tf.analysis.zero_shot: {FLAGS.run_dir}/checkpoints: no kept checkpoint at step {FLAGS.step}")
    keras.utils.set_random_seed(run.seed)
    lm = causal_lm_for(run.model_config)
    writer = tf.summary.create_file_writer(FLAGS.tb_dir) if FLAGS.tb_dir else None
    points = ([(0, None)] if FLAGS.include_init else []) + checkpoints
    for step, prefix in points:
        if prefix is not None:
            restore_weights(lm.variables, prefix)
        rows = suite.evaluate(lm, step=step)
        try:
            append_csv(FLAGS.output_csv, rows)
        except WriteError as err:  # the file keeps the rows of the steps before, whole
            sys.exit(f"gpt_tf.analysis.zero_shot: {err}; {FLAGS.output_csv} holds the steps before {step}")
        if writer:
            write_summaries(writer, rows, step)
        for row in rows:
            print(json.dumps(row), flush=True)
    if writer:
        writer.flush()


def run():
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
