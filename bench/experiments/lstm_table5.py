r"""Table 5's LSTM row on the books setup (issue #32 item 3), in pieces that resume.

    # 0. the pre-training records: every 16th train book of books_tiny's corpus (and 2 held-out books), its BPE
    python -m bench.experiments.lstm_table5 --stage=data
    # 1. pre-training, as often as needed: each call trains --minutes, then SIGTERM (the trainer checkpoints
    #    the step reached, exit 143); the next call resumes from the run folder's checkpoint
    python -m bench.experiments.lstm_table5 --stage=pretrain --steps=60 --minutes=15
    # 2. fine-tuning cells (task x seed); a cell already in the ledger is skipped
    python -m bench.experiments.lstm_table5 --stage=finetune --seeds=0,1,2
    # 3. the row (median [min-max] over the seeds done) and its note into docs/results.md
    python -m bench.experiments.lstm_table5 --stage=report

The LSTM is ``lstm_tiny`` (one layer of 744 units, about ``tiny``'s non-embedding parameters) pre-trained on
``books_tiny``'s books, BPE and 128-token windows (``pipelines.pretrain_data`` with the BPE of
``gpt_tf/presets/gpt1_tiny_books_en/assets/tokenizer``), from every ``--books_every``-th train book only: the LSTM sees a small part
of the corpus's tokens on a 2-core CPU, and tokenizing all 140 MB here takes longer than the run. Its recipe is
``books_tiny``'s recipe (``gpt_tf/presets/gpt1_tiny_books_en/log.jsonl``: batch 256, peak lr 1e-3, 2% warm-up
then cosine, decay 0.01, clip 1, seed 0), scaled to ``--steps`` updates by ``bench.experiments.study.lstm_pretrain_cmd``,
in float32 (this CPU has no bf16). Fine-tuning uses each task's small-model recipe
(``configs/finetune_<task>_tiny.flags``, chosen by ``bench/reproduction.py``) as in the reproduction table.
Everything goes to one ledger, ``bench/results/lstm_table5.jsonl`` (the GPU route below: its own, ``--ledger``).

The GPU route: the same books and tokens as the transformer (issue #32 item 3). A 2-core CPU manages 16 updates
of 256 x 128 tokens an hour; books_tiny had 7,158 (234.6M tokens), trained on a lent GPU machine with PyTorch but
no TensorFlow. The LSTM goes the same way: ``bench.torch_pretrain.train --model=lstm_tiny`` trains
``bench/torch_pretrain/lstm_model.py`` (this LSTM in torch, proven equal to ``gpt_tf.gpt1.lstm`` by
``tests/test_torch_lstm.py``) with books_tiny's recipe on exactly books_tiny's windows, in float32::

    # here: books_tiny's records (all 389 train books, its BPE; slow on 2 cores) and their streams
    python -m pipelines.pretrain_data --input_dir=../shared/data/books/train --valid_dir=../shared/data/books/valid \
        --output_dir=data/books_tiny --tokenizer_dir=gpt_tf/presets/gpt1_tiny_books_en/assets/tokenizer --n_ctx=128
    python -m bench.torch_pretrain.convert --action=export --data_dir=data/books_tiny --tokens=.gpu/books_tiny.npz.xz
    # there (device calls carrying .gpu/books_tiny.npz.xz, timeout 600 s), the same call until "the run is finished";
    # books_tiny's recipe (gpt_tf/presets/gpt1_tiny_books_en/log.jsonl) with its exact update count
    bash bench/torch_pretrain/piece.sh .gpu/books_tiny.npz.xz .gpu/lstm_tiny_run 7 --model=lstm_tiny \
        --batch_size=256 --learning_rate=1e-3 --warmup_fraction=0.02 --updates=7158
    # here: the run folder (runs/lstm_table5_books/lstm_tiny) and the ledger's pretrain_done, then stages 2-3
    G="--ledger=bench/results/lstm_table5_books.jsonl --runs_root=runs/lstm_table5_books --data_dir=data/books_tiny"
    python -m bench.experiments.lstm_table5 --stage=import --weights_dir=<files_at>/lstm_tiny_run $G
    python -m bench.experiments.lstm_table5 --stage=finetune --seeds=0,1,2 $G
    python -m bench.experiments.lstm_table5 --stage=report $G

``--stage=import`` refuses a run whose recipe or token count is not books_tiny's (``gpu_recipe_problems``), and a
ledger that already holds a pre-training (the CPU route's ledger is another file). A run's pieces must follow
each other on one warm machine (docs/scaling.md: the resume state does not fit the carry limit beside the
streams), so the run should fit one call: the transformer took 0.042 s an update with four runs sharing an
H100 (5 min for 7,158); the LSTM took 151 s of updates for its 7,158 on one H100 (2026-11-26, one call of
169 s, ``bench/results/lstm_table5_books.jsonl``).
"""

from __future__ import annotations

import datetime
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from absl import app, flags

from bench.experiments.finetune_runs import (ROOT, _child_env, append_ledger, dev_score, finetune_spec, load_ledger,
                                             run_one, shown_command)
from bench.experiments.study import lstm_pretrain_cmd
from gpt_tf.precision import cpu_name

BOOKS_LOG = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en" / "log.jsonl"
LEDGER = ROOT / "bench" / "results" / "lstm_table5.jsonl"
REPRODUCTION = ROOT / "bench" / "results" / "reproduction.jsonl"  # the transformer's cells with the same recipes
TASKS = ("cola", "rte", "story_cloze")

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_enum("stage", None, ["data", "pretrain", "import", "finetune", "report"],
                      "What to do (see the module doc; import: the GPU route's weights).")
    flags.DEFINE_string("books_dir", "../shared/data/books", "--stage=data: the books (index.tsv, train/, valid/).")
    flags.DEFINE_integer("books_every", 16, "--stage=data: every n-th train book (by id), for a corpus a CPU can tokenize.")
    flags.DEFINE_integer("valid_books", 2, "--stage=data: the first n held-out books.")
    flags.DEFINE_string("data_dir", "data/books_tiny_sub16", "The books' pre-training records (books_tiny's BPE).")
    flags.DEFINE_string("tasks_dir", "data/tasks_books", "Task records built with books_tiny's BPE.")
    flags.DEFINE_string("runs_root", "runs/lstm_table5", "Where the LSTM run and the fine-tuning runs go.")
    flags.DEFINE_integer("steps", 60, "Pre-training updates (books_tiny had 7,158 of 256 x 128 tokens).")
    flags.DEFINE_float("minutes", 15.0, "--stage=pretrain: stop this piece after this many minutes (0: to the end).")
    flags.DEFINE_string("weights_dir", "", "--stage=import: the GPU run's folder (bench.torch_pretrain.train's --out_dir "
                        "as it came back: log.jsonl, weights-*.npz).")
    flags.DEFINE_list("seeds", ["0"], "--stage=finetune: seeds.")
    flags.DEFINE_list("tasks", list(TASKS), "--stage=finetune: tasks.")
    flags.DEFINE_bool("heldout", True, "--stage=finetune: first the LSTM's held-out perplexity, once (off in all but "
                      "one of several processes started side by side).")
    flags.DEFINE_string("ledger", str(LEDGER), "The JSONL ledger.")
    flags.DEFINE_string("results_md", "docs/results.md", "--stage=report: the file whose LSTM row is filled.")
    flags.DEFINE_string("figure", "lstm_vs_transformer_books.png", "--stage=report, GPU route: both models' held-out "
                        "curves, a PNG beside --results_md ('': none).")


def pick_books(index_tsv: Path, every: int, valid: int) -> dict[str, list[str]]:
    """Book ids by split: every ``every``-th train book in id order, the first ``valid`` held-out books."""
    rows = [line.split("\t") for line in Path(index_tsv).read_text().splitlines()[1:] if line.strip()]
    train = sorted(r[0] for r in rows if r[1] == "train")
    return {"train": train[::every], "valid": sorted(r[0] for r in rows if r[1] == "valid")[:valid]}


def build_data(books_dir: str, every: int, valid: int, data_dir: str) -> None:
    """Links the picked books into ``<data_dir>_books/{train,valid}`` and builds their records with the BPE."""
    picked, src = pick_books(Path(books_dir) / "index.tsv", every, valid), Path(f"{data_dir}_books")
    for split, ids in picked.items():
        (src / split).mkdir(parents=True, exist_ok=True)
        for book in ids:
            link = src / split / f"{book}.txt"
            if not link.exists():
                link.symlink_to((Path(books_dir) / split / f"{book}.txt").resolve())
    cmd = [sys.executable, "-m", "pipelines.pretrain_data", f"--input_dir={src / 'train'}", f"--valid_dir={src / 'valid'}",
           f"--output_dir={data_dir}", f"--tokenizer_dir={(BOOKS_LOG.parent / 'assets' / 'tokenizer').relative_to(ROOT)}", "--n_ctx=128",
           "--noprogress"]
    subprocess.run(cmd, cwd=ROOT, env=_child_env(), check=True)


def books_recipe(log_path: Path = BOOKS_LOG, data_dir: str = "data/books_tiny") -> dict:
    """books_tiny's pre-training recipe as a ``train_config.json`` (what ``lstm_pretrain_cmd`` scales)."""
    setting = json.loads(Path(log_path).read_text().splitlines()[0])["setting"]
    return {"data_dir": data_dir, "batch_size": setting["batch_size"], "grad_accum_steps": 1,
            "learning_rate": setting["learning_rate"], "lr_decay": "cosine", "weight_decay": setting["weight_decay"],
            "clip_norm": setting["clip_norm"], "precision": "float32", "seed": setting["seed"], "keep_checkpoints": 2,
            "eval_batches": 0, "train_steps": setting["steps"], "warmup_steps": setting["warmup"],
            "checkpoint_every": 500, "n_ctx": setting["meta"]["n_ctx"]}


def pretrain_cmd(runs_root: str, data_dir: str, steps: int) -> tuple[str, list[str]]:
    recipe = books_recipe(data_dir=data_dir)
    return lstm_pretrain_cmd(SimpleNamespace(runs_root=runs_root), recipe, "tiny", steps)


def last_step(run_dir: str) -> int:
    """The newest checkpoint's step of a run folder (0 when none)."""
    steps = [int(p.stem.split("-")[1]) for p in (Path(run_dir) / "checkpoints").glob("ckpt-*.index")]
    return max(steps, default=0)


def pretrain(ledger: Path, runs_root: str, data_dir: str, steps: int, minutes: float) -> bool:
    """One piece of pre-training; True once the run is complete."""
    if any(r["kind"] == "pretrain_done" for r in load_ledger(ledger)):
        print("pre-training already done (in the ledger)")
        return True
    run_dir, cmd = pretrain_cmd(runs_root, data_dir, steps)
    start_step, start = last_step(run_dir), time.time()
    print(f"piece from step {start_step}: {shown_command(cmd)}", flush=True)
    Path(runs_root).mkdir(parents=True, exist_ok=True)
    with open(Path(runs_root) / "pretrain.log", "a") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_child_env(), stdout=subprocess.PIPE, stderr=log, text=True)
        try:
            stdout, _ = proc.communicate(timeout=60 * minutes if minutes else None)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # the trainer checkpoints the step reached and exits 143
            stdout, _ = proc.communicate()
    seconds, reached = time.time() - start, last_step(run_dir)
    record = {"kind": "pretrain_piece", "run_dir": run_dir, "cmd": shown_command(cmd), "from_step": start_step,
              "to_step": reached, "seconds": round(seconds, 1), "returncode": proc.returncode, "cpu": cpu_name(),
              "finished": datetime.datetime.now().isoformat(timespec="seconds")}
    append_ledger(ledger, record)
    print(json.dumps(record), flush=True)
    if proc.returncode == 0:
        train = json.loads((Path(data_dir) / "manifest.json").read_text())["splits"]["train"]
        append_ledger(ledger, {**record, "kind": "pretrain_done", "result": json.loads(stdout.strip().splitlines()[-1]),
                               "tokens": steps * books_recipe()["batch_size"] * books_recipe()["n_ctx"],
                               "data": {"dir": data_dir, "books": train["num_books"], "tokens": train["stream_tokens"],
                                        "windows": train["sequences"]}})
        return True
    if proc.returncode != 143:
        sys.exit(f"lstm_table5: pre-training failed ({proc.returncode}); see {runs_root}/pretrain.log")
    return False


# What the GPU run shares with books_tiny's (its log's setting): the recipe, the update count, the held-out windows.
GPU_RECIPE = ("batch_size", "learning_rate", "warmup", "steps", "weight_decay", "clip_norm", "dropout", "seed",
              "eval_windows")


def gpu_recipe_problems(setting: dict, done: dict | None, books_log: Path = BOOKS_LOG) -> list[str]:
    """What keeps a bench.torch_pretrain.train run (its log's setting and ``done`` row) from being the LSTM row's
    pre-training: another model, an unfinished run, or a recipe / token count other than books_tiny's."""
    books = json.loads(Path(books_log).read_text().splitlines()[0])["setting"]
    problems = [] if setting.get("model") == "lstm_tiny" else [f"model is {setting.get('model')!r}, not 'lstm_tiny'"]
    if done is None or done.get("done") != setting.get("steps"):
        problems.append("the run is not finished (no 'done' row at its last update): run its pieces to the end")
    problems += [f"{k} is {setting.get(k)!r}, books_tiny's is {books[k]!r}" for k in GPU_RECIPE if setting.get(k) != books[k]]
    if setting.get("meta", {}).get("n_ctx") != books["meta"]["n_ctx"]:
        problems.append(f"n_ctx is {setting.get('meta', {}).get('n_ctx')}, books_tiny's is {books['meta']['n_ctx']}")
    return problems


def pretrain_log(ledger: Path) -> Path:
    """Where ``--stage=import`` keeps the GPU run's ``log.jsonl`` (its held-out curve): beside the ledger."""
    return Path(ledger).with_name(Path(ledger).stem + "_pretrain_log.jsonl")


def import_gpu_run(ledger: Path, runs_root: str, data_dir: str, weights_dir: str) -> None:
    """The GPU route's LSTM (see the module doc) as ``<runs_root>/lstm_tiny`` (``bench.torch_pretrain.convert
    import``) and the ledger's ``pretrain_done`` record, so that ``--stage=finetune`` starts from it."""
    from bench.torch_pretrain.convert import read_log

    if any(r["kind"] == "pretrain_done" for r in load_ledger(ledger)):
        sys.exit(f"lstm_table5: {ledger} already holds a pre-training; the GPU route takes its own --ledger and --runs_root")
    setting, rows = read_log(weights_dir)
    lines = [json.loads(line) for line in (Path(weights_dir) / "log.jsonl").read_text().splitlines() if line.strip()]
    done = next((r for r in reversed(lines) if "done" in r), None)
    problems = gpu_recipe_problems(setting, done)
    if problems:
        sys.exit(f"lstm_table5: {weights_dir} is not books_tiny's recipe on lstm_tiny: " + "; ".join(problems))
    run_dir = str(Path(runs_root) / "lstm_tiny")
    cmd = [sys.executable, "-m", "bench.torch_pretrain.convert", "--action=import", f"--weights_dir={weights_dir}",
           f"--data_dir={data_dir}", f"--run_dir={run_dir}", "--model=lstm_tiny"]
    subprocess.run(cmd, cwd=ROOT, env=_child_env(), check=True)
    shutil.copyfile(Path(weights_dir) / "log.jsonl", pretrain_log(ledger))  # the curve, kept beside the ledger
    train = json.loads((Path(data_dir) / "manifest.json").read_text())["splits"]["train"]
    steps, n_ctx = setting["steps"], setting["meta"]["n_ctx"]
    append_ledger(ledger, {
        "kind": "pretrain_done", "route": "gpu", "run_dir": run_dir, "cmd": shown_command(cmd), "to_step": steps,
        "tokens": steps * setting["batch_size"] * n_ctx, "seconds": round(done["seconds"], 1),
        "device": setting.get("device"), "torch": setting.get("torch"), "valid_ppl": rows[-1]["valid_ppl"] if rows else None,
        "recipe": {k: setting[k] for k in GPU_RECIPE},
        "data": {"dir": data_dir, "books": train["num_books"], "tokens": train["stream_tokens"], "windows": train["sequences"]},
        "finished": datetime.datetime.now().isoformat(timespec="seconds")})
    print(f"imported into {run_dir}; {ledger} has its pretrain_done", flush=True)


def held_out(ledger: Path, runs_root: str, data_dir: str, steps: int) -> None:
    """The LSTM's held-out perplexity on the whole held-out split (``--mode=eval``), once (not fatal)."""
    if any(r["kind"] == "heldout" for r in load_ledger(ledger)):
        return
    _, cmd = pretrain_cmd(runs_root, data_dir, steps)
    cmd += ["--mode=eval"]
    proc = subprocess.run(cmd, cwd=ROOT, env=_child_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"held-out evaluation failed ({proc.returncode}); going on:\n{proc.stderr[-1500:]}", flush=True)
        return
    append_ledger(ledger, {"kind": "heldout", "cmd": shown_command(cmd), "result": json.loads(proc.stdout.strip().splitlines()[-1])})


def cell_specs(runs_root: str, tasks_dir: str, tasks, seeds) -> list[dict]:
    run_dir = str(Path(runs_root) / "lstm_tiny")
    return [finetune_spec(task, "lstm", int(seed), runs_root=Path(runs_root) / "finetune", tasks_dir=tasks_dir,
                          precision="float32", init_checkpoint=run_dir, recipe="_tiny")
            for seed in seeds for task in tasks]


def finetune(ledger: Path, specs: list[dict]) -> None:
    done = {(r["task"], r["seed"]) for r in load_ledger(ledger) if r["kind"] == "finetune"}
    for spec in specs:
        if (spec["task"], spec["seed"]) in done:
            print(f"skip {spec['task']} seed {spec['seed']}: in the ledger")
            continue
        record = {"kind": "finetune", **run_one(spec), "cpu": cpu_name()}
        append_ledger(ledger, record)
        print(json.dumps({k: record[k] for k in ("task", "seed", "seconds")} | {"score": dev_score(record)}), flush=True)


def main(argv):
    del argv
    ledger = Path(FLAGS.ledger)
    if FLAGS.stage == "data":
        build_data(FLAGS.books_dir, FLAGS.books_every, FLAGS.valid_books, FLAGS.data_dir)
    elif FLAGS.stage == "pretrain":
        pretrain(ledger, FLAGS.runs_root, FLAGS.data_dir, FLAGS.steps, FLAGS.minutes)
    elif FLAGS.stage == "import":
        if not FLAGS.weights_dir:
            raise app.UsageError("--stage=import needs --weights_dir (the GPU run's folder)")
        import_gpu_run(ledger, FLAGS.runs_root, FLAGS.data_dir, FLAGS.weights_dir)
    elif FLAGS.stage == "finetune":
        if not any(r["kind"] == "pretrain_done" for r in load_ledger(ledger)):
            sys.exit("lstm_table5: pre-training is not done yet (run --stage=pretrain until it is)")
        done = next(r for r in load_ledger(ledger) if r["kind"] == "pretrain_done")
        if FLAGS.heldout:
            held_out(ledger, FLAGS.runs_root, FLAGS.data_dir, done["to_step"])
        finetune(ledger, cell_specs(FLAGS.runs_root, FLAGS.tasks_dir, FLAGS.tasks, FLAGS.seeds))
    else:
        shown = Path(FLAGS.ledger).resolve()
        shown = shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown
        from bench.experiments.lstm_table5_report import write_report

        write_report(Path(FLAGS.results_md), load_ledger(ledger), ledger=str(shown), figure=FLAGS.figure)


if __name__ == "__main__":
    define_flags()
    app.run(main)
