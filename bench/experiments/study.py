r"""The paper's §5 analysis at a CPU scale, in one command: ablations, layer transfer, zero-shot, figures.

    python -m bench.experiments.study --pretrained=runs/books_tiny --scale=cpu   # --part=0/2 and 1/2: side by side
    python -m bench.experiments.study --pretrained=runs/books_tiny --tasks_dir=data/tasks_books --scale=cpu_full_data
    python -m bench.experiments.study --pretrained=runs/books_tiny --scale=smoke --out_dir=/tmp/study_smoke \
        --runs_root=runs/study_smoke                      # minutes: checks the pipeline end to end
    python -m bench.experiments.study --pretrained=runs/books_tiny --tasks_dir=data/tasks_books --scale=books \
        --precision=float32 --reuse_ledger=bench/results/reproduction.jsonl   # the chosen recipes, full data

Phases, each a subprocess whose command, output and wall-clock time go to ``<runs_root>/study.jsonl``
(a re-run skips what is recorded there, so an interrupted study resumes):

1. task data: ``--tasks_dir`` as built, or (``--train_subsample=N``) the official files under
   ``--data_root`` rebuilt with the pre-trained run's tokenizer, N train examples by guid hash;
2. zero-shot (``python -m gpt_tf.analysis.zero_shot``) on every kept checkpoint of the transformer's pre-training
   and on its initialisation (step 0);
3. fine-tuning (``bench/experiments/reproduction.py``'s runs, the paper's recipe): per task and seed the arms ``full``
   (all blocks transferred, λ 0.5), ``scratch`` (no pre-training) and ``lm0`` (λ = 0), plus
   ``transfer<k>`` for k = 0 … n_layer − 1 blocks on the layer-transfer tasks (k = n_layer is ``full``);
4. the LSTM baseline (Table 5): ``--lstm_run``, or pre-trained here (``--model=lstm_<preset>``, the data and
   recipe of ``--pretrained``'s ``train_config.json``, ``--lstm_steps`` updates, warm-up and checkpoint period
   scaled to them) in the background beside phases 2–3 (log: ``<runs_root>/lstm_<preset>.log``); then its
   zero-shot and its fine-tuning arm ``lstm``;
5. ``<out_dir>/results.md`` and ``{layer_transfer,zero_shot,ablations}.png`` (``study_report.py``), rewritten after
   each run; ``docs/results.md`` includes ``--out_dir=bench/results/study_books``'s, its figures copied to ``docs/``.

``--scale`` (``SCALES``) picks defaults for the knobs that set the cost (tasks, seeds, layers, epochs, train
subsample, zero-shot sample, LSTM steps); a knob given on the command line wins. One ``--runs_root`` holds one
configuration: a different one is refused. ``parse_args``: the flags on a fresh ``FlagValues`` (tests).
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

from absl import app, flags

from bench.experiments.reproduction import append_ledger, finetune_spec, ledger_run, load_ledger, run_one, size_of
from bench.harness import ROOT, TASK_FOLDERS, BackgroundCommand, relative, run_command, shown_command
from gpt_tf.runs.folder import RunFolder

FLAGS = flags.FLAGS
# The study: every task with training data here, 1,000 training examples each (hash sample), 3 seeds, every layer
# count, the paper's 3 epochs, the LSTM pre-trained as long as the transformer.
_CPU = {"tasks": "cola,sst2,mrpc,stsb,rte,story_cloze", "transfer_tasks": "sst2,rte,story_cloze", "seeds": "0,1,2",
        "layers": "all", "epochs": 3, "train_subsample": 1000, "zero_shot_tasks": "cola,sst2,story_cloze",
        "zero_shot_max_examples": 0, "lstm_steps": 0, "recipe": "paper"}
SCALES = {
    # End to end in minutes: 3 tasks, 1 seed, 64 training examples, 1 epoch, a 20-step LSTM.
    "smoke": {**_CPU, "tasks": "sst2,rte,story_cloze", "seeds": "0", "layers": "0,2", "epochs": 1,
              "train_subsample": 64, "zero_shot_max_examples": 64, "lstm_steps": 20},
    "cpu": _CPU,
    # As "cpu" on the task data as built in --tasks_dir (e.g. data/tasks_books: up to 4,000 examples).
    "cpu_full_data": {**_CPU, "train_subsample": 0},
    # The books model with the small-model recipes bench/experiments/reproduction.py chose on dev, on the
    # full training sets of the three cheapest tasks, every layer count, one seed; the full and scratch arms
    # can come from the reproduction's ledger (--reuse_ledger) and a short LSTM pre-training (150 updates).
    "books": {**_CPU, "tasks": "cola,rte,story_cloze", "transfer_tasks": "cola,rte,story_cloze", "seeds": "0",
              "epochs": 0, "train_subsample": 0, "lstm_steps": 150, "recipe": "tiny"},
}
# --recipe: the flagfile suffix of each task's fine-tuning recipe (configs/finetune_<task><suffix>.flags).
RECIPES = {"paper": "", "tiny": "_tiny"}


def define_flags(fv: flags.FlagValues = FLAGS) -> None:
    """The study's flags, on ``fv`` (absl's FLAGS for the CLI; a fresh FlagValues in ``parse_args``)."""
    flags.DEFINE_string("pretrained", None, "the transformer's pre-training run dir", flag_values=fv)
    flags.DEFINE_string("tasks_dir", "", "task TFRecords built with the run's tokenizer "
                        "(needed unless --train_subsample rebuilds them)", flag_values=fv)
    flags.DEFINE_string("data_root", "../shared/data", "official task files (GLUE, Story Cloze)", flag_values=fv)
    flags.DEFINE_string("out_dir", "bench/results/study", "results.md and the PNG figures (docs/results.md "
                        "includes the published run's, bench/results/study_books/results.md)", flag_values=fv)
    flags.DEFINE_string("runs_root", "runs/study", "runs, task data and the ledger study.jsonl", flag_values=fv)
    flags.DEFINE_enum("scale", "cpu", sorted(SCALES), "the defaults of the cost knobs", flag_values=fv)
    flags.DEFINE_string("lstm_run", "", "an LSTM pre-training run to use instead of training one", flag_values=fv)
    flags.DEFINE_string("race_dir", "", "RACE in its official layout, for zero-shot (optional)", flag_values=fv)
    flags.DEFINE_string("dprd_dir", "", "DPRD (train.c.txt/test.c.txt), for zero-shot (optional)", flag_values=fv)
    flags.DEFINE_string("precision", "mixed_bfloat16", "fine-tuning precision", flag_values=fv)
    flags.DEFINE_enum("recipe", None, sorted(RECIPES), "paper: configs/finetune_<task>.flags with --epochs; tiny: the "
                      "small-model recipes of configs/finetune_<task>_tiny.flags (their own epochs) for every arm "
                      "(default: the scale's)", flag_values=fv)
    flags.DEFINE_string("reuse_ledger", "", "a bench/experiments/reproduction.py ledger: a full or scratch run "
                        "recorded there with the same task, seed, start, data, precision and recipe is taken from it "
                        "instead of being run again", flag_values=fv)
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


STORY_CLOZE_HOLDOUT = 0.3  # as data/tasks_books/story_cloze: the part of val that is dev
ARMS = ("full", "scratch", "lm0", "lstm")


def resolve_plan(args, n_layer: int, pretrain_steps: int) -> dict:
    """The study's configuration: the scale's knobs with the command line's overrides, lists expanded."""
    plan = {k: (getattr(args, k) if getattr(args, k) is not None else v) for k, v in SCALES[args.scale].items()}
    plan["layers"] = list(range(n_layer + 1)) if plan["layers"] == "all" else list(map(int, plan["layers"].split(",")))
    for key in ("tasks", "transfer_tasks", "zero_shot_tasks"):
        plan[key] = [t for t in plan[key].split(",") if t]
    plan["zero_shot_tasks"] += [t for t, d in (("race", args.race_dir), ("dprd", args.dprd_dir)) if d]
    plan["seeds"] = [int(s) for s in plan["seeds"].split(",")]
    plan["lstm_steps"] = plan["lstm_steps"] or pretrain_steps
    problems = [f"unknown task {t!r}; tasks with training data: {sorted(TASK_FOLDERS)}"
                for t in plan["tasks"] + plan["transfer_tasks"] if t not in TASK_FOLDERS]
    problems += [f"--layers: {k} is not within 0..{n_layer}" for k in plan["layers"] if not 0 <= k <= n_layer]
    if problems:
        sys.exit("bench.experiments.study: " + "; ".join(problems))
    return plan


def parse_part(text: str) -> tuple[int, int]:
    try:
        part, parts = (int(x) for x in text.split("/"))
    except ValueError:
        part = parts = -1
    if not 0 <= part < parts:
        sys.exit(f"bench.experiments.study: --part={text!r} is not i/n with 0 <= i < n")
    return part, parts


def part_of(specs: list, part: int, parts: int) -> list:
    """The ``part``-th of ``parts`` interleaved parts (each gets every kind of run, so they end together)."""
    return specs[part::parts]


def task_data(plan: dict, args, tokenizer_dir: str, ledger: Path, build: bool = True) -> str:
    """The folder of task TFRecords: --tasks_dir, or the official files rebuilt with a train subsample."""
    if not plan["train_subsample"]:
        if not args.tasks_dir:
            sys.exit("bench.experiments.study: without --train_subsample the study needs --tasks_dir (task TFRecords)")
        missing = [t for t in set(plan["tasks"] + plan["transfer_tasks"])
                   if not (Path(args.tasks_dir) / t / "manifest.json").is_file()]
        if missing:
            sys.exit(f"bench.experiments.study: --tasks_dir={args.tasks_dir!r} lacks {sorted(missing)} "
                     "(build them with pipelines.finetune_data, or give --train_subsample)")
        return args.tasks_dir
    out = Path(args.runs_root) / f"tasks_sub{plan['train_subsample']}"
    for task in sorted(set(plan["tasks"] + plan["transfer_tasks"])):
        if (out / task / "manifest.json").is_file():
            continue
        if not build:
            sys.exit(f"bench.experiments.study: {out / task} is not built yet; start --part=0/n first")
        if not tokenizer_dir:
            sys.exit(f"bench.experiments.study: --pretrained={args.pretrained}: its data manifest, which names its "
                     "tokenizer, is gone; the task data cannot be rebuilt with it")
        cmd = [sys.executable, "-m", "pipelines.finetune_data", f"--task={task}",
               f"--data_dir={Path(args.data_root) / TASK_FOLDERS[task]}", f"--tokenizer_dir={tokenizer_dir}",
               f"--output_dir={out / task}", "--noprogress", f"--train_subsample={plan['train_subsample']}",
               *([f"--holdout_fraction={STORY_CLOZE_HOLDOUT}"] if task == "story_cloze" else [])]
        _, seconds = run_command(cmd)
        append_ledger(ledger, {"kind": "task_data", "task": task, "cmd": shown_command(cmd),
                               "seconds": round(seconds, 1)})
    return str(out)


def lstm_pretrain_cmd(args, train_config: dict, preset: str, steps: int) -> tuple[str, list[str]]:
    """The LSTM baseline's pre-training: the transformer run's data and recipe, ``steps`` updates."""
    scale = steps / train_config["train_steps"]
    run_dir = Path(args.runs_root) / f"lstm_{preset}"
    same = [f"--{k}={train_config[k]}" for k in ("data_dir", "batch_size", "grad_accum_steps", "learning_rate",
            "lr_decay", "weight_decay", "clip_norm", "precision", "seed", "keep_checkpoints", "eval_batches")]
    warmup, every = round(train_config["warmup_steps"] * scale), round(train_config["checkpoint_every"] * scale)
    cmd = [sys.executable, "-m", "gpt_tf.train", f"--model=lstm_{preset}", f"--run_dir={run_dir}",
           f"--train_steps={steps}", f"--warmup_steps={min(steps, max(0, warmup))}",
           f"--checkpoint_every={max(1, every)}", "--progress=false", "--json", *same]
    return str(run_dir), cmd


def coarse_to_fine(layers: list[int], n_layer: int) -> list[int]:
    """``layers`` ordered so each next k is the farthest from those already run (and from n_layer, the
    full arm): 0, n/2, n/4, 3n/4, ... — a curve cut short by time still spans 0 … n."""
    left, have, order = sorted(k for k in layers if k < n_layer), [n_layer], []
    while left:
        k = max(left, key=lambda x: (min(abs(x - h) for h in have), -x))
        order.append(k)
        have.append(k)
        left.remove(k)
    return order


def finetune_specs(plan: dict, args, tasks_dir: str, preset: str, lstm_run: str) -> list[dict]:
    """Every fine-tuning run of the study (see the module doc), in the order they run: the ablation arms of
    every seed first, then the layer-transfer points coarse to fine, each over the seeds."""
    common = dict(runs_root=Path(args.runs_root) / "finetune", tasks_dir=tasks_dir, precision=args.precision,
                  recipe=RECIPES[plan["recipe"]])
    epochs = [f"--epochs={plan['epochs']}"] if plan["epochs"] else []
    arms = {"full": (args.pretrained, []), "scratch": ("", []), "lm0": (args.pretrained, ["--lm_coef=0"]),
            "lstm": (lstm_run, [])}
    n_layer = plan["n_layer"]
    specs = []
    for seed in plan["seeds"]:
        for task in plan["tasks"]:
            for arm, (init, extra) in ((arm, arms[arm]) for arm in ARMS):
                specs.append(finetune_spec(task, arm, seed, init_checkpoint=init, model=preset, extra=extra + epochs,
                                           **common))
        for task in plan["transfer_tasks"]:
            if task not in plan["tasks"]:  # its k = n_layer point is the full arm
                specs.append(finetune_spec(task, "full", seed, init_checkpoint=args.pretrained, extra=epochs, **common))
    for k in coarse_to_fine(plan["layers"], n_layer):
        for seed in plan["seeds"]:
            for task in plan["transfer_tasks"]:
                specs.append(finetune_spec(task, f"transfer{k}", seed, init_checkpoint=args.pretrained,
                                           extra=[f"--transfer_layers={k}"] + epochs, **common))
    return specs


def reused_run(spec: dict, plan: dict, records: list[dict]) -> dict | None:
    """The reproduction ledger's run that is this study run, if any: arm full = its pretrained arm, scratch = its
    scratch arm, with the same seed, recipe (the study's own epochs give none), start, data, context and precision."""
    arm = {"full": "pretrained", "scratch": "scratch"}.get(spec["arm"])
    return None if arm is None or plan["epochs"] else ledger_run(spec, arm, RECIPES[plan["recipe"]], records)


def zero_shot_cmd(run_dir: str, plan: dict, args, out_csv: Path) -> list[str]:
    dirs = {"race": args.race_dir, "dprd": args.dprd_dir,
            **{t: str(Path(args.data_root) / TASK_FOLDERS[t]) for t in ("cola", "sst2", "story_cloze")}}
    tasks = plan["zero_shot_tasks"]
    return [sys.executable, "-m", "gpt_tf.analysis.zero_shot", f"--run_dir={run_dir}", f"--task={','.join(tasks)}",
            f"--data_dir={','.join(dirs[t] for t in tasks)}", "--include_init", f"--output_csv={out_csv}",
            f"--max_examples={plan['zero_shot_max_examples']}", f"--holdout_fraction={STORY_CLOZE_HOLDOUT}"]


def _check_configuration(runs_root: Path, config: dict) -> None:
    """One configuration per runs_root: the first run records it; a different one later is refused."""
    path = runs_root / "study_config.json"
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(k for k in set(before) | set(config) if before.get(k) != config.get(k))
        if changed:
            sys.exit(f"bench.experiments.study: {runs_root} holds a study with another configuration "
                     f"({', '.join(changed)} differ); use another --runs_root")
    else:
        runs_root.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2, sort_keys=True))


class Study:
    """One invocation: the plan, the ledger (shared by the parts started together) and the runs not yet in it."""

    def __init__(self, args):
        self.args, self.started = args, time.time()
        self.part, self.parts = parse_part(args.part)
        pre = RunFolder.open(args.pretrained)
        self.train_config, n_layer = pre.run_config, pre.model_config.n_layer
        self.preset = size_of(pre)
        self.plan = resolve_plan(args, n_layer, self.train_config["train_steps"])
        self.plan["n_layer"] = n_layer
        self.runs_root, self.ledger = Path(args.runs_root), Path(args.runs_root) / "study.jsonl"
        self.config = {"pretrained": args.pretrained, "preset": self.preset, "tasks_dir": args.tasks_dir,
                       "data_root": args.data_root, "lstm_run": args.lstm_run, "precision": args.precision,
                       "race_dir": args.race_dir, "dprd_dir": args.dprd_dir, **self.plan}
        _check_configuration(self.runs_root, self.config)
        self.reuse = load_ledger(Path(args.reuse_ledger)) if args.reuse_ledger else []
        self.have = {self.key(r) for r in load_ledger(self.ledger)}
        self.command = shlex.join(["python", "-m", "bench.experiments.study",  # --report_only runs nothing
                                   *(relative(a) for a in sys.argv[1:] if a != "--report_only")])
        self.tasks_dir = task_data(self.plan, args, pre.tokenizer_dir, self.ledger,
                                   build=self.part == 0 and not args.report_only)
        self.done = load_ledger(self.ledger)  # with the task-data builds
        self.lstm_run, self.lstm_cmd, self.lstm_job = args.lstm_run, None, None
        self.lstm_done = self.part != 0  # part 0 alone does the LSTM
        self.specs = []

    @staticmethod
    def key(r: dict) -> tuple:
        return r["kind"], r.get("task"), r.get("arm"), r.get("seed"), r.get("model")

    def spec_key(self, spec: dict) -> tuple:  # a fine-tuning run's key in the ledger
        return self.key({"kind": "finetune", **spec})

    def report(self) -> None:
        from bench.experiments.study_report import write_report

        write_report(self.done, self.config, Path(self.args.out_dir), self.command,
                     None if self.args.report_only else time.time() - self.started, self.tasks_dir)

    def record(self, entry: dict) -> None:
        append_ledger(self.ledger, entry)
        self.done[:] = load_ledger(self.ledger)  # with what other parts recorded meanwhile
        self.report()

    def zero_shot(self, model: str, run_dir: str) -> None:
        if ("zero_shot", None, None, None, model) in self.have:
            return
        out = self.runs_root / f"zero_shot_{model}.csv"
        partial = out.with_suffix(".partial.csv")
        partial.unlink(missing_ok=True)
        cmd = zero_shot_cmd(run_dir, self.plan, self.args, partial)
        print(f"zero-shot over the kept checkpoints of {run_dir} ...", flush=True)
        _, seconds = run_command(cmd)
        os.replace(partial, out)
        self.record({"kind": "zero_shot", "model": model, "run_dir": run_dir, "csv": str(out),
                     "cmd": shown_command(cmd), "seconds": round(seconds, 1)})

    def start_lstm(self) -> None:
        """The LSTM's pre-training is mostly sequential (one small matmul per time step), so it runs in the
        background beside the transformer's zero-shot and fine-tuning runs; the LSTM's own runs follow it."""
        if self.lstm_run:
            return
        steps = self.plan["lstm_steps"]
        self.lstm_run, self.lstm_cmd = lstm_pretrain_cmd(self.args, self.train_config, self.preset, steps)
        if ("pretrain", None, None, None, "lstm") not in self.have and self.part == 0:
            log = self.runs_root / f"lstm_{self.preset}.log"
            print(f"pre-training the LSTM baseline in the background (log: {log}): {shown_command(self.lstm_cmd)}",
                  flush=True)
            self.lstm_job = BackgroundCommand(self.lstm_cmd, log)

    def lstm_arm(self) -> None:
        """The LSTM's zero-shot and fine-tuning runs, once its pre-training (if running here) has ended."""
        self.lstm_done = True
        if self.lstm_job is not None:
            stdout, seconds = self.lstm_job.wait()
            self.lstm_job = None
            self.record({"kind": "pretrain", "model": "lstm", "run_dir": self.lstm_run,
                         "cmd": shown_command(self.lstm_cmd), "result": json.loads(stdout.strip().splitlines()[-1]),
                         "seconds": round(seconds, 1)})
        self.zero_shot("lstm", self.lstm_run)
        self.finetune([s for s in self.specs if s["arm"] == "lstm"])

    def finetune(self, specs: list[dict]) -> None:
        for spec in specs:
            if not self.lstm_done and (self.lstm_job is None or self.lstm_job.finished()):
                self.lstm_arm()  # as soon as it can: the LSTM's runs must not be the ones cut short by time
            if self.spec_key(spec) in self.have:
                continue
            where = f"[{spec['index']}/{len(self.specs)}] {spec['task']} {spec['arm']} seed {spec['seed']}"
            reused = reused_run(spec, self.plan, self.reuse)
            if reused is not None:
                print(f"{where}: from {self.args.reuse_ledger} ({reused['run_dir']})", flush=True)
                self.record({"kind": "finetune", "task": spec["task"], "arm": spec["arm"], "seed": spec["seed"],
                             **{k: reused[k] for k in ("run_dir", "cmd", "metrics", "seconds", "finished")},
                             "reused_from": self.args.reuse_ledger})
            else:
                print(f"{where} ...", flush=True)
                result = run_one({k: v for k, v in spec.items() if k != "index"})
                print(f"    {result['seconds']:.0f} s, dev {json.dumps(result['metrics']['dev'])}", flush=True)
                self.record({"kind": "finetune", **result})
            self.have.add(self.spec_key(spec))

    def run(self) -> None:
        self.start_lstm()
        specs = finetune_specs(self.plan, self.args, self.tasks_dir, self.preset, self.lstm_run)
        self.specs = [{**spec, "index": i} for i, spec in enumerate(specs, 1)]
        # The runs not yet recorded, split: parts started together (same ledger) take disjoint shares.
        todo = [s for s in self.specs if s["arm"] != "lstm" and self.spec_key(s) not in self.have]
        try:
            if self.part == 0:
                self.zero_shot("transformer", self.args.pretrained)
            self.finetune(part_of(todo, self.part, self.parts))
            if not self.lstm_done:
                print("the LSTM baseline's zero-shot and fine-tuning ...", flush=True)
                self.lstm_arm()
        except BaseException:
            if self.lstm_job is not None:
                self.lstm_job.stop()  # SIGTERM: the trainer saves its step; a re-run of the study resumes it
            raise
        self.done[:] = load_ledger(self.ledger)
        self.report()


def main(argv):
    del argv  # everything is a flag
    study = Study(FLAGS)
    if FLAGS.report_only:
        study.report()
        print(f"rewrote {Path(FLAGS.out_dir) / 'results.md'} from {study.ledger} ({len(study.done)} records)")
        return
    study.run()
    total = sum(r.get("seconds", 0) for r in study.done)
    now = datetime.datetime.now().isoformat(timespec="seconds")
    print(f"done {now}: this invocation {time.time() - study.started:.0f} s, all recorded runs {total:.0f} s; see "
          f"{Path(FLAGS.out_dir) / 'results.md'}", flush=True)


if __name__ == "__main__":
    os.chdir(ROOT)
    define_flags()
    app.run(main)
