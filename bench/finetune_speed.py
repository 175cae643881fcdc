"""Fine-tuning speed on SST-2: gpt_tf padded to n_ctx, gpt_tf length-bucketed, and HF Trainer, interleaved.

    python -m bench.finetune_speed                       # ~15 min on 2 cores -> bench/results/finetune_speed.{json,md}
    python -m bench.finetune_speed --mode=padding        # tokens per example after padding, ours and HF's
    python -m bench.finetune_speed --mode=ab --base=REV  # this checkout against commit REV, same stack, same batches
    python -m bench.finetune_speed --mode=profile        # where the time goes, ours against HF (bench/_profiles.py)
    python -m bench.finetune_speed --mode=zero_shot      # §5 zero-shot scoring, LMScorer before vs after buckets

Modes: ``speed`` (below); ``padding``; ``ab``: two workers of ``--stack`` (default ``ours_bucketed_bf16``), one
running this checkout, one ``--base`` from a temporary `git worktree`, from the same seed (round r of each trains
on the same batches), alternating; the figure is the ratio of the mean examples/s over the counted rounds
(differences under ~2% are noise on a quiet 2-core machine; training only). ``profile``: each stack (ours at
λ = 0, HF Trainer) in its own process records ``--train_steps`` training steps after ``--profile_warmup_steps``
and one evaluation pass with its framework's profiler, every op's self time sorted into kinds (matmul,
optimizer, dropout, other ops, outside ops; see ``bench/_profiles.py``). ``zero_shot``: the evaluation of §5's
zero-shot heuristics (``gpt_tf/analysis/lm_scorer.py``), the scorer before length buckets (each batch padded to
its longest sequence, the LM head at every position) against ``LMScorer`` now (batches padded to a length bucket,
the LM head at the scored positions only), in one process, alternating round by round, on the §5 requests of the
real dev sets of SST-2, CoLA and Story Cloze (its 30% hold-out of val) with this bench's 8k BPE and the ``tiny``
preset's random weights; tokens/s counts the real model-input tokens, and the two scorers' sums of
log-probabilities are compared (``--rounds`` 4 unless given; ``bench/results/zero_shot_speed.{json,md}``).
What GPT-1 itself costs to fine-tune on this CPU: ``bench/costs.py --mode=gpt1``.

Stacks (`bench/_finetune_stacks.py`), each in its own worker process, all the `tiny` shape
(4 layers, 256 dims, 4 heads, 1024 FFN, 8k BPE + 4 special tokens) with n_ctx 64, batch 32, on the
same SST-2 training texts tokenized with the project's tokenizer, from random weights:

    ours_padded          this checkout with --nolength_buckets, λ = 0.5: every batch padded to n_ctx, as
                         before length buckets (a stack that ran the commit before them, ef438ba, through
                         `git archive`, stopped working when the training loop moved to gpt_tf/training/)
    ours_bucketed        this checkout's default: batches padded to length buckets, λ = 0.5
    ours_bucketed_lm0    the same with λ = 0: the objective HF's classifier trains (no auxiliary LM head)
    ours_bucketed_bf16, ours_bucketed_lm0_bf16
                         the same two in mixed_bfloat16
    ours_every_length_lm0_bf16
                         not a default stack: ours_bucketed_lm0_bf16 with one bucket per length (1 ... n_ctx,
                         a shape per length): what the finest grid would buy over the default buckets
                         (evaluated too, in bf16)
    keras_fit            the Python API: GPT1TextClassifier.fit (λ = 0.5, fp32) on the same token ids, each batch
                         padded to its bucket by the preprocessor, one fit call paused between chunks as
                         HF's Trainer is (bench/_finetune_stacks.py KerasFit)
    keras_fit_lm0        the same with λ = 0 (not a default stack): the Python API against HF's objective
    hf_float32           transformers.Trainer, OpenAIGPTForSequenceClassification, dynamic padding,
                         train_sampling_strategy="group_by_length", fp32
    hf_bfloat16          the same with bf16=True (torch.autocast bfloat16)

Each round runs ``--train_steps`` training steps on every worker in turn (50: one of HF's
length-grouped "megabatches", which are sorted longest first, so a chunk has the average length),
then one evaluation pass
(a forward pass and the task outputs, over the 6% of the training texts held out as ``dev``) on
every worker in turn; the order of the workers rotates from round to round. Round 0 is warm-up
(graph tracing, first allocations) and is not counted. examples/s is the median over the counted
rounds. Each measurement also records the share of the machine's CPU time other processes used
meanwhile ("others' CPU"): the machine may be shared, and load changes hit every stack alike only
on average; examples per CPU second (the worker's own CPU time) is the steadier figure on a busy
machine. ``--threads`` applies to every stack (TF intra- and inter-op, torch intra-op): 1 on a
shared 2-core machine, where 2-thread torch collapses under contention. Both stacks are
measured in float32 and bfloat16 (the ``_bf16`` stacks; the other stacks of ours take ``--precision``,
float32 by default). The ratios to HF take HF's faster precision for each phase, and ours in the
precision ``--precision=auto`` would pick: the one whose λ = 0 training step is faster (bf16 is slower
than float32 for this size on AVX512_BF16 Xeons, faster on AMD Zen 5; see README).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from statistics import mean, median

from absl import app, flags

from bench import _profiles
from bench._finetune_stacks import define_data_flags, lengths_summary, padding_summary, prepare_data, train_bpe
from bench.harness import Worker, apply_settings, base_checkout, busy_seconds, header, new_report, save_report, timed
from bench.harness import wait_until_quiet

FLAGS = flags.FLAGS
STACKS = {
    "ours_padded": {"stack": "ours", "buckets": False, "lm_coef": 0.5},
    "ours_bucketed": {"stack": "ours", "buckets": True, "lm_coef": 0.5},
    "ours_bucketed_lm0": {"stack": "ours", "buckets": True, "lm_coef": 0.0},
    "ours_bucketed_bf16": {"stack": "ours", "buckets": True, "lm_coef": 0.5, "precision": "mixed_bfloat16"},
    "ours_bucketed_lm0_bf16": {"stack": "ours", "buckets": True, "lm_coef": 0.0, "precision": "mixed_bfloat16"},
    "ours_every_length_lm0_bf16": {"stack": "ours", "buckets": True, "lm_coef": 0.0, "precision": "mixed_bfloat16",
                                   "every_length": True},
    "keras_fit": {"stack": "keras_fit", "buckets": True, "lm_coef": 0.5},
    "keras_fit_lm0": {"stack": "keras_fit", "buckets": True, "lm_coef": 0.0},
    "hf_float32": {"stack": "hf", "precision": "float32"},
    "hf_bfloat16": {"stack": "hf", "precision": "bfloat16"},
}
DEFAULT_STACKS = ("ours_padded", "ours_bucketed", "keras_fit", "ours_bucketed_bf16", "ours_bucketed_lm0",
                  "ours_bucketed_lm0_bf16",
                  "hf_float32", "hf_bfloat16")


def eval_stacks(names) -> list:
    """The stacks evaluated in a run of ``names`` (of ``STACKS``, or ``{name: spec}`` as ``run`` gets them):
    λ changes nothing in evaluation, so of the stacks that differ only in λ the first one named is evaluated
    (ours_bucketed in the default set; ours_bucketed_lm0 where it runs without ours_bucketed, as in
    bench.speed_table; one of --mode=ab's two workers, which run one spec)."""
    seen, out = set(), []
    for name in names:
        spec = names[name] if isinstance(names, dict) else STACKS[name]
        key = (spec["stack"], spec.get("buckets"), spec.get("precision"), spec.get("every_length", False))
        if key not in seen:
            seen.add(key)
            out.append(name)
    return out


def define_flags():
    flags.DEFINE_enum("mode", "speed", ["speed", "padding", "ab", "profile", "zero_shot"],
                      "what to measure (see the module doc)")
    flags.DEFINE_string("stacks", ",".join(DEFAULT_STACKS), "comma-separated subset of " + ",".join(STACKS))
    flags.DEFINE_integer("rounds", 3, "counted rounds (after one warm-up round)")
    flags.DEFINE_integer("train_steps", 50, "training steps per worker per round")
    flags.DEFINE_integer("batch_size", 32, "batch size of every stack")
    flags.DEFINE_integer("n_ctx", 64, "context of the fine-tuned model (the README's SST-2 runs: 64)")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16", "bfloat16"], "ours (bfloat16 = "
                      "mixed_bfloat16); --mode=profile: both stacks (HF Trainer bf16=True)")
    flags.DEFINE_integer("books", 20, "Gutenberg books the 8k BPE is trained on")
    flags.DEFINE_integer("threads", 1, "threads of every stack: TF intra- and inter-op, torch intra-op")
    flags.DEFINE_float("wait_quiet", 0.0, "before each measurement, wait up to this many "
                       "seconds for other processes to use at most 10% of the CPUs")
    define_data_flags("bench/results/finetune_speed.json")
    flags.DEFINE_string("base", None, "--mode=ab: the commit to compare this checkout against")
    flags.DEFINE_enum("stack", "ours_bucketed_bf16", [s for s, v in STACKS.items() if v["stack"] == "ours"],
                      "--mode=ab: the stack both workers run")
    flags.DEFINE_integer("profile_warmup_steps", 50, "--mode=profile: steps before recording (50 = one of HF's "
                         "length-grouped megabatches, so the recorded --train_steps=50 are one whole megabatch)")
    flags.DEFINE_string("worker", None, "internal: run as a worker with this JSON spec")


def measure(worker: Worker, command: str, wait_quiet_s: float = 0.0) -> dict:
    """One ``train`` chunk or ``eval`` pass on ``worker``, with the others' share of the CPU meanwhile."""
    waited = wait_until_quiet(0.1, wait_quiet_s) if wait_quiet_s else 0.0
    busy = busy_seconds()
    out = worker.ask(command, "DONE")
    others = max(0.0, busy_seconds() - busy - out["cpu_s"]) / ((os.cpu_count() or 1) * out["s"])
    return {**out, "examples_per_s": out["examples"] / out["s"], "examples_per_cpu_s": out["examples"] / out["cpu_s"],
            "others_cpu_share": min(others, 1.0), "waited_s": round(waited, 1)}


def run(args, specs: dict, log, code_roots: dict | None = None) -> dict:
    """Starts every worker, then the interleaved rounds; returns ``{stack: {"train": [...], "eval": [...]}}``.
    ``code_roots``: stack name -> a checkout that stack's worker runs from (`Worker`'s ``code_root``)."""
    workers, logs = {}, {name: {"train": [], "eval": []} for name in specs}
    try:
        for name, spec in specs.items():
            workers[name] = Worker(spec, "bench.finetune_speed", tag="@@finetune_speed ",
                                   code_root=(code_roots or {}).get(name))
            logs[name]["info"] = workers[name].read("READY")
            log(f"  {name} ready: {logs[name]['info']}")
        names, evaluated = list(specs), eval_stacks(specs)
        for r in range(args.rounds + 1):
            order = names[r % len(names):] + names[: r % len(names)]
            for phase in ("train", "eval"):
                for name in order:
                    if phase == "eval" and name not in evaluated:
                        continue
                    result = measure(workers[name], phase, args.wait_quiet if r else 0.0)
                    if r:
                        logs[name][phase].append(result)
                    log(f"  round {r}{' (warm-up)' if not r else ''} {phase} {name}: {result['examples_per_s']:.0f} "
                        f"examples/s ({result['examples_per_cpu_s']:.0f} per CPU s), "
                        f"{100 * result['others_cpu_share']:.0f}% others' CPU")
    finally:
        for worker in workers.values():
            worker.close()
    return logs


def summarise(logs: dict) -> dict:
    rows = {}
    for name, phases in logs.items():
        rows[name] = {}
        for phase in ("train", "eval"):
            if phases[phase]:
                rows[name][phase] = round(median([m["examples_per_s"] for m in phases[phase]]), 1)
                rows[name][f"{phase}_per_cpu_s"] = round(median([m["examples_per_cpu_s"] for m in phases[phase]]), 1)
        rows[name]["others_cpu_share"] = round(median([m["others_cpu_share"] for m in phases["train"]]), 3)
    ratio = lambda a, b, phase: round(rows[a][phase] / rows[b][phase], 2) if (  # noqa: E731
        phase in rows.get(a, {}) and phase in rows.get(b, {})) else None
    best = lambda names, phase: max((n for n in names if phase in rows.get(n, {})),  # noqa: E731
                                    key=lambda n: rows[n][phase], default=None)
    hf, hf_eval = best(("hf_float32", "hf_bfloat16"), "train"), best(("hf_float32", "hf_bfloat16"), "eval")
    # Ours in the precision `--precision=auto` would pick: the faster training step (then used for evaluation too).
    lm0 = best(("ours_bucketed_lm0", "ours_bucketed_lm0_bf16"), "train")
    ours = {"ours_bucketed_lm0_bf16": "ours_bucketed_bf16"}.get(lm0, "ours_bucketed")
    # Evaluated: the λ = 0.5 stack of that precision where it ran, else its λ = 0 twin (eval_stacks).
    ours_eval = next((n for n in (ours, lm0) if n and "eval" in rows.get(n, {})), None)
    goals = {
        "train bucketed / padded (goal >= 3)": ratio("ours_bucketed", "ours_padded", "train"),
        "eval bucketed / padded (goal >= 3)": ratio("ours_bucketed", "ours_padded", "eval"),
        "train keras fit / CLI loop (λ=0.5, fp32)": ratio("keras_fit", "ours_bucketed", "train"),
        "eval keras predict / CLI predict (fp32)": ratio("keras_fit", "ours_bucketed", "eval"),
        f"train keras fit λ=0 (keras_fit_lm0) / best HF ({hf}) (goal >= 1.5)": ratio("keras_fit_lm0", hf, "train")
        if hf else None,
        f"eval keras predict / best HF ({hf_eval}) (goal >= 1.5)": ratio(
            next((n for n in ("keras_fit", "keras_fit_lm0") if "eval" in rows.get(n, {})), "keras_fit"), hf_eval,
            "eval") if hf_eval else None,
        f"train {lm0} / best HF ({hf}) (goal >= 1.5)": ratio(lm0, hf, "train") if hf and lm0 else None,
        f"train {ours} (λ=0.5) / best HF ({hf})": ratio(ours, hf, "train") if hf else None,
        f"eval {ours_eval} / best HF ({hf_eval}) (goal >= 1.5)": ratio(ours_eval, hf_eval, "eval")
        if hf_eval and ours_eval else None,
    }
    if "ours_every_length_lm0_bf16" in rows and hf:
        goals[f"train ours_every_length_lm0_bf16 / best HF ({hf})"] = ratio("ours_every_length_lm0_bf16", hf, "train")
        goals[f"eval ours_every_length_lm0_bf16 / best HF ({hf_eval})"] = ratio("ours_every_length_lm0_bf16", hf_eval,
                                                                                 "eval")
    return {"rows": rows, "ratios": goals}


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [f"`{report['command']}`", "",
             f"{m['cpu']}, {m['cores']} cores, {report['date']}; tensorflow {m['versions']['tensorflow']}, "
             f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}. Settings: "
             + ", ".join(f"{k} {v}" for k, v in s.items()) + ".", "",
             "| stack | training examples/s | evaluation examples/s | training examples per CPU s "
             "| evaluation examples per CPU s | others' CPU (median, training) |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in report["summary"]["rows"].items():
        cells = [row.get(k, "–") for k in ("train", "eval", "train_per_cpu_s", "eval_per_cpu_s")]
        lines.append(f"| {name} | " + " | ".join(map(str, cells)) + f" | {100 * row['others_cpu_share']:.0f}% |")
    lines += ["", "| ratio | value |", "|---|---:|"]
    lines += [f"| {k} | {v if v is not None else '–'} |" for k, v in report["summary"]["ratios"].items()]
    return "\n".join(lines) + "\n"


def run_ab(args, task_dir: Path, log) -> tuple[dict, str]:
    """``--mode=ab``: this checkout against ``--base``, the same stack from the same seed, alternating."""
    if not args.base:
        raise app.UsageError("--mode=ab needs --base=REV")
    spec = {"task_dir": str(task_dir), "batch_size": args.batch_size, "n_ctx": args.n_ctx, "threads": args.threads,
            "train_steps": args.train_steps, "precision": "float32", **STACKS[args.stack]}
    with base_checkout(args.base, "finetune_ab_") as (tree, revs):
        logs = run(args, {"base": spec, "this": spec}, log, code_roots={"base": tree})
    base_rev, this_rev = revs["base"], revs["this"]
    rates = {name: [m["examples_per_s"] for m in logs[name]["train"]] for name in ("base", "this")}
    means = {name: mean(v) for name, v in rates.items()}
    report = {**new_report("bench.finetune_speed"),
              "settings": {"this": this_rev, "base": base_rev, "stack": args.stack, "train_steps": args.train_steps,
                           "rounds": args.rounds},
              "result": {**rates, "base_mean": means["base"], "this_mean": means["this"],
                         "ratio": means["this"] / means["base"]}}
    s, r = report["settings"], report["result"]
    lines = [f"`{report['command']}`", "",
             f"{report['machine']['cpu']}, {report['date']}: this checkout ({s['this']}) against {s['base']}, stack "
             f"{s['stack']}, {s['train_steps']} steps per round, {s['rounds']} counted rounds.", "",
             "| round | base examples/s | this examples/s |", "|---:|---:|---:|"]
    lines += [f"| {i + 1} | {a:.1f} | {b:.1f} |" for i, (a, b) in enumerate(zip(r["base"], r["this"]))]
    lines += ["", f"Mean: base {r['base_mean']:.1f}, this {r['this_mean']:.1f} examples/s: **{r['ratio']:.3f}×**."]
    return report, "\n".join(lines) + "\n"


def speed_report(args, task_dir: Path, stacks: list, log, padding=None, base=None) -> dict:
    """``--mode=speed``: the interleaved rounds of ``stacks``, summarised (``bench.speed_table`` runs it too).
    ``base``: ``(checkout, {stack: name})``: each of those stacks once more from that checkout (another commit's),
    under the name given, interleaved with the rest."""
    common = {"task_dir": str(task_dir), "batch_size": args.batch_size, "n_ctx": args.n_ctx,
              "train_steps": args.train_steps, "threads": args.threads}
    precision = "mixed_bfloat16" if args.precision == "bfloat16" else args.precision
    specs = {name: {"precision": precision, **common, **STACKS[name]} for name in stacks}
    tree, renamed = base or (None, {})
    specs.update({renamed[name]: specs[name] for name in renamed})
    report = {**new_report("bench.finetune_speed"),
              "settings": {"model": "tiny (4 x 256, 4 heads, FFN 1024, 8k BPE)", "n_ctx": args.n_ctx,
                           "batch": args.batch_size, "train steps per round": args.train_steps,
                           "rounds": f"{args.rounds} (+1 warm-up)", "ours precision": precision,
                           "threads per stack": args.threads, "BPE books": args.books, "wait_quiet_s": args.wait_quiet,
                           "texts": lengths_summary(task_dir),
                           "training tokens per example after padding": padding},
              "stacks": specs}
    log(f"{header(report['machine'])}; texts: {report['settings']['texts']}")
    report["logs"] = run(args, specs, log, code_roots={name: tree for name in renamed.values()})
    report["summary"] = summarise(report["logs"])
    return report


def before_scorer(lm, bos_id, batch_size):
    """The LMScorer of the previous commit: batch padded to its longest sequence, the LM head at every position."""
    import tensorflow as tf

    from gpt_tf.analysis.lm_scorer import LMScorer
    from gpt_tf.gpt1.backbone import token_inputs

    class Before(LMScorer):
        def _batch_scores(self, tokens, mask):  # the model takes keras-hub's inputs, as LMScorer gives them
            logits = tf.cast(self.lm(token_inputs(tokens[:, :-1]), training=False), tf.float32)
            logp = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tokens[:, 1:], logits=logits)
            return tf.reduce_sum(logp * mask[:, 1:], axis=1)

    scorer = Before(lm, bos_id=bos_id, batch_size=batch_size)
    scorer.buckets = tuple(range(1, lm.backbone.config.n_ctx + 1))  # every length is a bucket: pad to the longest
    return scorer


def run_zero_shot(args) -> tuple[dict, str]:
    """``--mode=zero_shot``: (the report, its markdown) of ``--rounds`` interleaved rounds of the two scorers."""
    import numpy as np

    from gpt_tf.config import get_size
    from gpt_tf.analysis.heuristics import HEURISTICS, load_examples, requests
    from gpt_tf.analysis.lm_scorer import LMScorer
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.text.tokenizer import GPTTokenizer

    tokenizer = GPTTokenizer.from_dir(train_bpe(Path(args.data_root), Path(args.shared_data), args.books, print))
    reqs = []
    for task, folder in {"sst2": "glue/SST-2", "cola": "glue/CoLA", "story_cloze": "story_cloze"}.items():
        h = HEURISTICS[task]
        reqs += requests(h, load_examples(task, str(Path(args.shared_data) / folder), h.eval_split), tokenizer.encode)
    lm = causal_lm_for(get_size("tiny", vocab_size=tokenizer.vocab_size))
    bos = tokenizer.vocab_size - 1
    scorers = {"before": before_scorer(lm, bos, args.batch_size), "after": LMScorer(lm, bos, args.batch_size)}
    tokens = sum(len(scorers["after"].sequence(p, c)[0]) - 1 for p, c in reqs)
    log, sums = {name: [] for name in scorers}, {}
    for r in range(args.rounds + 1):
        for name, scorer in scorers.items():
            (sums[name], _), times = timed(lambda: scorer.score(reqs))
            wall, others = times["s"], times["others_cpu_share"]
            print(f"  round {r}{' (warm-up)' if not r else ''} {name}: {tokens / wall:.0f} tokens/s, "
                  f"{100 * others:.0f}% others' CPU", flush=True)
            if r:
                log[name].append({"s": wall, "others_cpu_share": others})
    rows = {name: {"tokens_per_s": round(tokens / median([m["s"] for m in ms])),
                   "others_cpu_share": round(median([m["others_cpu_share"] for m in ms]), 3)}
            for name, ms in log.items()}
    report = {**new_report("bench.finetune_speed"), "requests": len(reqs), "model_input_tokens": tokens,
              "batch_size": args.batch_size, "rows": rows,
              "speed_up": round(rows["after"]["tokens_per_s"] / rows["before"]["tokens_per_s"], 2),
              "max_abs_diff_logprob_sums": float(np.max(np.abs(sums["after"] - sums["before"]))), "log": log}
    text = (f"`{report['command']}`\n\n{report['machine']['cpu']}, {report['machine']['cores']} cores, "
            f"{report['date']}: {len(reqs)} requests (SST-2, CoLA, Story Cloze dev), {tokens} model-input tokens, "
            f"tiny preset, batch {args.batch_size}.\n\n| scorer | tokens/s | others' CPU |\n|---|---:|---:|\n"
            + "".join(f"| {n} | {r['tokens_per_s']} | {100 * r['others_cpu_share']:.0f}% |\n" for n, r in rows.items())
            + f"\nafter / before: {report['speed_up']}×; largest difference of a log-probability sum: "
              f"{report['max_abs_diff_logprob_sums']:.2e}\n")
    return report, text


def main(argv):
    del argv  # everything is a flag
    args = FLAGS
    if args.worker:
        spec = json.loads(args.worker)
        if spec.get("profile"):
            return _profiles.finetune_worker(spec)
        from bench._finetune_stacks import worker_main

        return worker_main(spec)
    mode = args.mode
    unknown = [s for s in args.stacks.split(",") if s not in STACKS]
    if unknown:
        raise app.UsageError(f"--stacks: unknown {unknown}; choose from {list(STACKS)}")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    if mode in ("speed", "profile", "ab"):
        # Before any worker starts: they inherit the settings the project picks on this machine (oneDNN
        # rewrites, fused kernels, thread pools; gpt_tf/speed/autotune.py), as the CLI runs with them.
        tuned = apply_settings()
        log(tuned)
    if mode == "zero_shot":
        if not args["rounds"].present:
            args.rounds = 4
        out = Path(args.out if args["out"].present else "bench/results/zero_shot_speed.json")
        return save_report(*run_zero_shot(args), out, log)
    task_dir = prepare_data(Path(args.data_root), Path(args.shared_data), args.books, args.n_ctx, log).resolve()
    out = Path(args.out)
    if mode != "speed" and not args["out"].present:
        out = out.with_name(f"finetune_{mode}.json")
    if mode == "ab":
        for name, value in (("train_steps", 100), ("rounds", 6)):  # an A/B needs more rounds to resolve ~2%
            if not args[name].present:
                setattr(args, name, value)
        report, text = run_ab(args, task_dir, log)
        report["project's"] = tuned
        return save_report(report, text, out, log)
    if mode == "profile":
        report = _profiles.finetune_profile(args, task_dir, log)
        report["settings"]["project's"] = tuned
        return save_report(report, _profiles.finetune_markdown(report), out, log)
    padding = padding_summary(task_dir, args.batch_size, args.n_ctx)
    if mode == "padding":
        return log(f"training tokens per example after padding (batch {args.batch_size}, one epoch): {padding}")
    report = speed_report(args, task_dir, args.stacks.split(","), log, padding)
    report["settings"]["project's"] = tuned
    save_report(report, markdown(report), out, log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
