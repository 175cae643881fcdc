"""The side-by-side speed table of this machine: pre-training steps and fine-tuning against the peers, one command.

    python -m bench.speed_table             # ~15 min on 2 cores -> bench/results/speed_table_<cpu>.{json,md}
    python -m bench.speed_table --presets=tiny --steps=3 --finetune_rounds=1 --finetune_train_steps=10   # quick look
    python -m bench.speed_table --base=main       # ours at another commit too, interleaved: this / base per row

Prints the CPU model and features first, then the settings this project picks by itself on this machine
(``gpt_tf/speed/autotune.py``: oneDNN rewrites, fused kernels, thread pools; the probe runs here if this machine
has no cached pick yet). Then, every stack in its own worker process, interleaved (they take turns step by
step, so a load change hits all alike):

* **Pre-training step** (``bench/train_throughput.py``'s workers: forward, LM loss, backward, global-norm
  clipping, AdamW, dropout on, one fixed random batch) at the ``tiny``, ``small`` and GPT-1 sizes: ours, a
  keras-hub ``TransformerDecoder(normalize_first=False)`` stack of the same shape (same TensorFlow, so the same
  oneDNN and thread settings as ours), and PyTorch ``transformers.OpenAIGPTLMHeadModel`` (fused AdamW, all
  cores). float32, plus bfloat16 on CPUs with bf16 instructions (each stack's best precision is compared).
* **Fine-tuning** on SST-2 (``bench/finetune_speed.py``'s workers: the ``tiny`` shape, n_ctx 64, batch 32, one
  thread per stack): ours with length buckets at λ = 0 (the objective HF trains) against ``transformers.Trainer``,
  examples/s in training and in evaluation.

The goals are checked as ratios within this one run: pre-training ≥ 1.25× keras-hub and ≥ 1.5×
PyTorch at ``tiny``/``small``, ≥ 1.5× both at GPT-1 size; fine-tuning ≥ 1.5× HF Trainer in training and
evaluation. Where one is missed, ``python -m bench.finetune_speed --mode=profile`` says where the time goes.

Generation speed has its own command: ``python -m bench.generation``.

``--jax``: ours on JAX too (``KERAS_BACKEND=jax``, compiled as pre-training on JAX compiles it) as one more stack of
every pre-training group, its own column; the goals stay TensorFlow's.

``--attn_pdrop=0``: the pre-training steps without attention dropout, every stack alike (the paper's 0.1 by
default), so the fused attention runs where a backend has it. ``--pad_vocab_to=128``: ours' LM head padded in
training (``GPTConfig.pad_vocab_to``).

``--base=REV``: ours as of commit ``REV`` as one more stack of every pre-training and fine-tuning group (its own
temporary ``git worktree``, interleaved with the others), and a table of this checkout's ours against it.
"""

from __future__ import annotations

import contextlib
import os
import types
from pathlib import Path
from statistics import median

from absl import app, flags

from bench._train_stacks import PRESET_DEFAULTS
from bench.harness import ROOT, apply_settings, base_checkout, cpu_slug, header, new_report, save_report

FLAGS = flags.FLAGS
SIZES = {preset: {"batch": d["batch"], "seq": d["seq"]} for preset, d in PRESET_DEFAULTS.items()}
GOALS = {"tiny": (1.25, 1.5), "small": (1.25, 1.5), "gpt1": (1.5, 1.5), "test": (1.25, 1.5)}  # vs keras-hub, PyTorch
STACKS = ("ours", "keras_hub", "torch")


def define_flags():
    flags.DEFINE_string("presets", "tiny,small,gpt1", "model sizes of the pre-training step (gpt1: GPT-1's 12 x 768)")
    flags.DEFINE_integer("warmup", 2, "untimed pre-training steps per stack (tracing)")
    flags.DEFINE_integer("steps", 5, "timed pre-training steps per stack (gpt1: at most 3)")
    flags.DEFINE_string("precisions", "auto", "float32, bfloat16, or auto: bfloat16 too where the CPU has bf16 "
                        "instructions (avx512_bf16 / amx_bf16)")
    flags.DEFINE_integer("finetune_rounds", 3, "counted fine-tuning rounds (after one warm-up); 0: no fine-tuning")
    flags.DEFINE_integer("finetune_train_steps", 30, "fine-tuning steps per stack per round")
    flags.DEFINE_string("data_root", "data/bench_finetune_speed", "fine-tuning BPE and task records (cached; "
                        "shared with bench.finetune_speed)")
    flags.DEFINE_string("shared_data", str(ROOT.parent / "shared" / "data"), "the shared data folder (books, GLUE)")
    flags.DEFINE_string("out", None, "the JSON report (default bench/results/speed_table_<cpu>.json; .md beside it)")
    flags.DEFINE_bool("jax", False, "also time ours on JAX (KERAS_BACKEND=jax) in every pre-training group")
    flags.DEFINE_float("attn_pdrop", -1.0, "the pre-training steps' attention dropout, every stack alike (-1: the "
                       "paper's 0.1; 0: the fused attention where the backend has it)")
    flags.DEFINE_integer("pad_vocab_to", 1, "ours' LM head padded to a multiple of this in training (1: none)")
    flags.DEFINE_string("base", None, "also time ours as of this commit (a temporary git worktree), interleaved")


def precisions(info: dict, requested: str) -> list:
    if requested != "auto":
        return requested.split(",")
    return ["float32", "bfloat16"] if {"avx512_bf16", "amx_bf16"} & set(info["isa"]) else ["float32"]


def pretraining(info: dict, preset: str, log, base=None) -> list:
    """The interleaved pre-training rows of ``preset`` in each precision (``train_throughput``'s statistics);
    ``base``: ``(checkout, rev)`` of ours at another commit, one more stack (its rows carry ``rev``)."""
    from bench.train_throughput import run_group, summarise

    rows, steps = [], min(FLAGS.steps, 3) if preset == "gpt1" else FLAGS.steps
    ours = ["ours", "ours_jax"] if FLAGS.jax else ["ours"]
    stacks = [{"stack": s} for s in (*STACKS, *ours[1:])]
    stacks += [{"stack": s, "rev": base[1], "code_root": base[0]} for s in ours] if base else []
    for precision in precisions(info, FLAGS.precisions):
        specs = [{"kind": "train", **stack, "preset": preset, "precision": precision, "threads": os.cpu_count(),
                  "torch_adamw": "fused", "attn_pdrop": FLAGS.attn_pdrop, "pad_vocab_to": FLAGS.pad_vocab_to,
                  "warmup": FLAGS.warmup, "steps": steps, **SIZES[preset]} for stack in stacks]
        log(f"pre-training {preset} {precision}, batch {SIZES[preset]['batch']} x {SIZES[preset]['seq']}")
        rows += run_group(specs, 0.1, steps, log)
    summarise(rows, {p: float("nan") for p in ("float32", "bfloat16")}, 0.1)
    return rows


def finetuning(info: dict, log, base=None) -> dict:
    """``finetune_speed``'s interleaved rounds: ours (buckets, λ = 0) and HF Trainer, each precision the CPU has."""
    from bench._finetune_stacks import prepare_data
    from bench.finetune_speed import speed_report

    args = types.SimpleNamespace(batch_size=32, n_ctx=64, train_steps=FLAGS.finetune_train_steps, threads=1,
                                 precision="float32", books=20, wait_quiet=0.0, rounds=FLAGS.finetune_rounds)
    task_dir = prepare_data(Path(FLAGS.data_root), Path(FLAGS.shared_data), args.books, args.n_ctx, log).resolve()
    bf16 = "bfloat16" in precisions(info, FLAGS.precisions)
    stacks = ["ours_bucketed_lm0", "hf_float32"] + (["ours_bucketed_lm0_bf16", "hf_bfloat16"] if bf16 else [])
    ours = [name for name in stacks if name.startswith("ours")]
    return speed_report(args, task_dir, stacks, log,
                        base=(base[0], {name: f"{name}@{base[1]}" for name in ours}) if base else None)


def best(rows: list, preset: str, stack: str):
    """The row of ``stack`` (this checkout's) at ``preset`` in its faster precision."""
    return max((r for r in rows if r["preset"] == preset and r["stack"] == stack and "rev" not in r),
               key=lambda r: r["tokens_per_s"])


def base_lines(report: dict) -> list:
    """With ``--base``: this checkout's ours against ours at the base commit, per size × precision and fine-tuning."""
    from bench.train_throughput import base_pairs

    lines = [f"| pre-training {r['preset']} {r['precision']}{' (JAX)' if r['stack'] == 'ours_jax' else ''} | "
             f"{this['tokens_per_s']:,.0f} tokens/s | "
             f"{r['tokens_per_s']:,.0f} tokens/s | {this['tokens_per_s'] / r['tokens_per_s']:.3f}× |"
             for this, r in base_pairs(report.get("pretraining", []))]
    rows = (report.get("finetuning") or {}).get("summary", {}).get("rows", {})
    for name, r in rows.items():
        if "@" in name:
            this = rows[name.split("@")[0]]
            for phase in ("train", "eval"):
                if phase in r and phase in this:
                    lines.append(f"| fine-tuning {name.split('@')[0]} {phase} | {this[phase]} examples/s | "
                                 f"{r[phase]} examples/s | {this[phase] / r[phase]:.3f}× |")
    if not lines:
        return []
    return ["", f"Ours against ours at `{report['revs']['base']}` (same run, interleaved):", "",
            "| what | this checkout | base | this / base |", "|---|---:|---:|---:|", *lines]


def goals(report: dict) -> list:
    """``(what, ratio, goal)`` for every speed goal measured in this run."""
    out, rows = [], report.get("pretraining", [])
    for preset in dict.fromkeys(r["preset"] for r in rows):
        ours = best(rows, preset, "ours")
        for peer, goal in zip(("keras_hub", "torch"), GOALS[preset], strict=True):
            other = best(rows, preset, peer)
            out.append((f"pre-training {preset}: ours ({ours['precision']}) / {peer} ({other['precision']})",
                        ours["tokens_per_s"] / other["tokens_per_s"], goal))
    if report.get("finetuning"):
        r = report["finetuning"]["summary"]["rows"]
        for phase in ("train", "eval"):
            ours = max((n for n in r if n.startswith("ours") and "@" not in n and phase in r[n]),
                       key=lambda n: r[n][phase])
            hf = max((n for n in r if n.startswith("hf") and phase in r[n]), key=lambda n: r[n][phase])
            out.append((f"fine-tuning {phase}: {ours} / {hf}", r[ours][phase] / r[hf][phase], 1.5))
    return out


def markdown(report: dict) -> str:
    rows = report.get("pretraining", [])
    jax = any(r["stack"] == "ours_jax" for r in rows)
    lines = ["```bash", report["command"], "```", "", f"Measured {report['date']}: {report['header']}.", "",
             f"Settings picked by the project: {report['settings']}", "",
             "Pre-training step (tokens/s; each stack in its own process, interleaved; medians over the timed steps):",
             "", "| size | precision | batch × seq | ours | keras-hub stack | PyTorch HF | ours / keras-hub "
             "| ours / PyTorch | others' CPU |" + (" ours on JAX |" if jax else ""),
             "|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if jax else "")]
    for preset, precision in dict.fromkeys((r["preset"], r["precision"]) for r in rows):
        group = {r["stack"]: r for r in rows
                 if r["preset"] == preset and r["precision"] == precision and "rev" not in r}
        ours = group["ours"]
        others = median([r["others_cpu_share"] for r in group.values()])
        lines.append(f"| {preset} | {precision} | {ours['batch']} × {ours['seq']} | "
                     + " | ".join(f"{group[s]['tokens_per_s']:,.0f}" for s in STACKS)
                     + f" | {ours['vs_keras_hub']:.2f}× | {ours['vs_torch']:.2f}× | {100 * others:.0f}% |"
                     + (f" {group['ours_jax']['tokens_per_s']:,.0f} |" if jax else ""))
    if report.get("finetuning"):
        f = report["finetuning"]["summary"]["rows"]
        lines += ["", "Fine-tuning, SST-2, `tiny` shape, n_ctx 64, batch 32, one thread per stack (examples/s):", "",
                  "| stack | training | evaluation | others' CPU (training) |", "|---|---:|---:|---:|"]
        lines += [f"| {n} | {r['train']} | {r.get('eval', '–')} | {100 * r['others_cpu_share']:.0f}% |"
                  for n, r in f.items()]
    lines += base_lines(report)
    lines += ["", "| goal | ratio | goal | met |", "|---|---:|---:|---|"]
    lines += [f"| {what} | {ratio:.2f}× | ≥ {goal}× | {'yes' if ratio >= goal else 'no'} |"
              for what, ratio, goal in report["goals"]]
    return "\n".join(lines) + "\n"


def main(argv):
    del argv  # everything is a flag
    for preset in FLAGS.presets.split(","):
        if preset not in SIZES:
            raise app.UsageError(f"--presets: unknown {preset!r}; choose from {sorted(SIZES)}")
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    report = new_report("bench.speed_table", "minutes")
    info = report["machine"]
    report["header"] = header(info)
    log(report["header"])
    # Before any worker starts: they inherit the settings (the keras-hub stack runs the same TensorFlow as ours).
    report["settings"] = apply_settings()
    log(report["settings"])
    out = Path(FLAGS.out or f"bench/results/speed_table_{cpu_slug(info)}.json")
    report["pretraining"], report["finetuning"] = [], None
    parts = (["finetuning"] if FLAGS.finetune_rounds > 0 else []) + FLAGS.presets.split(",")
    with base_checkout(FLAGS.base) if FLAGS.base else contextlib.nullcontext((None, None)) as (tree, revs):
        base = (str(tree), revs["base"]) if tree else None
        if base:
            report["revs"] = revs
        for part in parts:  # the report is saved after each part: a long run cut short keeps what it measured
            if part == "finetuning":
                report["finetuning"] = finetuning(info, log, base)
            else:
                report["pretraining"] += pretraining(info, part, log, base)
            report["goals"] = goals(report)
            save_report(report, markdown(report), out, log)


if __name__ == "__main__":
    define_flags()
    app.run(main)
