"""``bench/experiments/study.py``'s command line: the scales (defaults of the knobs that set the cost), the recipes and the
absl flags, defined on absl's FLAGS for the CLI or on a fresh ``FlagValues`` (``parse_args``) for tests."""

from __future__ import annotations

from absl import flags

FLAGS = flags.FLAGS
SCALES = {
    # End to end in minutes: 3 tasks, 1 seed, 64 training examples, 1 epoch, a 20-step LSTM.
    "smoke": {"tasks": "sst2,rte,story_cloze", "transfer_tasks": "sst2,rte,story_cloze", "seeds": "0", "layers": "0,2",
              "epochs": 1, "train_subsample": 64, "zero_shot_tasks": "cola,sst2,story_cloze",
              "zero_shot_max_examples": 64, "lstm_steps": 20, "recipe": "paper"},
    # The study: every task with training data here, 1,000 training examples each (hash sample), 3 seeds,
    # every layer count, the paper's 3 epochs, the LSTM pre-trained as long as the transformer.
    "cpu": {"tasks": "cola,sst2,mrpc,stsb,rte,story_cloze", "transfer_tasks": "sst2,rte,story_cloze", "seeds": "0,1,2",
            "layers": "all", "epochs": 3, "train_subsample": 1000, "zero_shot_tasks": "cola,sst2,story_cloze",
            "zero_shot_max_examples": 0, "lstm_steps": 0, "recipe": "paper"},
    # As "cpu" on the task data as built in --tasks_dir (e.g. data/tasks_books: up to 4,000 examples).
    "cpu_full_data": {"tasks": "cola,sst2,mrpc,stsb,rte,story_cloze", "transfer_tasks": "sst2,rte,story_cloze",
                      "seeds": "0,1,2", "layers": "all", "epochs": 3, "train_subsample": 0,
                      "zero_shot_tasks": "cola,sst2,story_cloze", "zero_shot_max_examples": 0, "lstm_steps": 0,
                      "recipe": "paper"},
    # The books model with the small-model recipes bench/experiments/reproduction.py chose on dev (issue #13), on the
    # full training sets of the three cheapest tasks, every layer count, one seed; the full and scratch arms
    # can come from the reproduction's ledger (--reuse_ledger) and a short LSTM pre-training (150 updates).
    "books": {"tasks": "cola,rte,story_cloze", "transfer_tasks": "cola,rte,story_cloze", "seeds": "0",
              "layers": "all", "epochs": 0, "train_subsample": 0, "zero_shot_tasks": "cola,sst2,story_cloze",
              "zero_shot_max_examples": 0, "lstm_steps": 150, "recipe": "tiny"},
}
# --recipe: the flagfile suffix of each task's fine-tuning recipe (configs/finetune_<task><suffix>.flags).
RECIPES = {"paper": "", "tiny": "_tiny"}


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
    """The study's flags, on ``fv`` (absl's FLAGS for the CLI; a fresh FlagValues in ``parse_args``)."""
    flags.DEFINE_string("pretrained", None, "the transformer's pre-training run dir", flag_values=fv)
    flags.DEFINE_string("tasks_dir", "", "task TFRecords built with the run's tokenizer "
                        "(needed unless --train_subsample rebuilds them)", flag_values=fv)
    flags.DEFINE_string("data_root", "../shared/data", "official task files (GLUE, Story Cloze)", flag_values=fv)
    flags.DEFINE_string("out_dir", "docs", "results.md and the PNG figures", flag_values=fv)
    flags.DEFINE_string("runs_root", "runs/study", "runs, task data and the ledger study.jsonl", flag_values=fv)
    flags.DEFINE_enum("scale", "cpu", sorted(SCALES), "the defaults of the cost knobs", flag_values=fv)
    flags.DEFINE_string("lstm_run", "", "an LSTM pre-training run to use instead of training one", flag_values=fv)
    flags.DEFINE_string("race_dir", "", "RACE in its official layout, for zero-shot (optional)", flag_values=fv)
    flags.DEFINE_string("dprd_dir", "", "DPRD (train.c.txt/test.c.txt), for zero-shot (optional)", flag_values=fv)
    flags.DEFINE_string("precision", "mixed_bfloat16", "fine-tuning precision", flag_values=fv)
    flags.DEFINE_enum("recipe", None, sorted(RECIPES), "paper: configs/finetune_<task>.flags with --epochs; tiny: the "
                      "small-model recipes of configs/finetune_<task>_tiny.flags (their own epochs) for every arm "
                      "(default: the scale's)", flag_values=fv)
    flags.DEFINE_string("reuse_ledger", "", "a bench/experiments/reproduction.py ledger: a full or scratch run recorded there with "
                        "the same task, seed, start, data, precision and recipe is taken from it instead of being run "
                        "again", flag_values=fv)
    flags.DEFINE_bool("report_only", False, "rewrite <out_dir> from the ledger; run nothing", flag_values=fv)
    flags.DEFINE_string("part", "0/1", "i/n: this process runs the i-th of n interleaved parts of the transformer's "
                        "fine-tuning runs not yet recorded, beside the others (start them together: same command, "
                        "other --part); part 0 also builds the task data, runs zero-shot and does the whole LSTM "
                        "baseline", flag_values=fv)
    for knob in ("tasks", "transfer_tasks", "seeds", "layers", "zero_shot_tasks"):
        flags.DEFINE_string(knob, None, f"comma list (default: the scale's, {SCALES['cpu'][knob]!r})", flag_values=fv)
    for knob in ("epochs", "train_subsample", "zero_shot_max_examples", "lstm_steps"):
        flags.DEFINE_integer(knob, None, f"default: the scale's ({SCALES['cpu'][knob]} for cpu; epochs 0: the recipe's "
                             "own)", flag_values=fv)
    flags.mark_flag_as_required("pretrained", flag_values=fv)


def parse_args(argv: list[str]) -> flags.FlagValues:
    """``argv`` (flags only, no program name) parsed as the CLI parses it, on a fresh FlagValues (for tests)."""
    fv = flags.FlagValues()
    define_flags(fv)
    fv(["bench.experiments.study", *argv])
    return fv
