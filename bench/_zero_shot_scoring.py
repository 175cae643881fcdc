"""``bench.finetune_speed --mode=zero_shot``: zero-shot scoring speed (`gpt_tf/analysis/lm_scorer.py`), the scorer
before and after length buckets, interleaved.

    python -m bench.finetune_speed --mode=zero_shot     # ~5 min on 2 cores -> bench/results/zero_shot_speed.{json,md}

The requests are those of the §5 heuristics (`gpt_tf/analysis/heuristics.py`) on the real dev sets of
SST-2 (sentence + "very" -> "positive" / "negative"), CoLA (the sentence) and Story Cloze (the
30% hold-out of val: story -> each ending), tokenized with the 8k BPE of `bench/finetune_speed.py` (its ``--books``, ``--data_root``);
the model is the `tiny` preset with random weights (speed does not depend on the weights).

    before   the scorer as it was: each batch padded to its longest sequence, the LM head at every position
    after    `LMScorer` now: each batch padded to a length bucket, the LM head at the scored positions only

Both score the same requests in the same process, alternating round by round; tokens/s counts
the real (unpadded) model-input tokens. The sums of log-probabilities of the two are compared. ``--rounds``
counted rounds (4 unless given), ``--batch_size`` sequences per scoring batch.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np

from bench.harness import machine_info, median, timed

TASKS = {"sst2": "glue/SST-2", "cola": "glue/CoLA", "story_cloze": "story_cloze"}


def before_scorer(lm, bos_id, batch_size):
    """The LMScorer of the previous commit: batch padded to its longest sequence, the LM head at every position."""
    import tensorflow as tf

    from gpt_tf.analysis.lm_scorer import LMScorer

    class Before(LMScorer):
        def _batch_scores(self, tokens, mask):
            logits = tf.cast(self.lm(tokens[:, :-1], training=False), tf.float32)
            logp = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tokens[:, 1:], logits=logits)
            return tf.reduce_sum(logp * mask[:, 1:], axis=1)

    scorer = Before(lm, bos_id=bos_id, batch_size=batch_size)
    scorer.buckets = tuple(range(1, lm.backbone.config.n_ctx + 1))  # every length is a bucket: pad to the longest
    return scorer


def run_zero_shot(args) -> tuple[dict, str]:
    """(the report, its markdown) of ``--rounds`` interleaved rounds of the two scorers."""
    from bench._finetune_stacks import train_bpe
    from gpt_tf.config import get_size
    from gpt_tf.analysis.heuristics import HEURISTICS, load_examples, requests
    from gpt_tf.analysis.lm_scorer import LMScorer
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.text.tokenizer import GPTTokenizer

    tokenizer = GPTTokenizer.from_dir(train_bpe(Path(args.data_root), Path(args.shared_data), args.books, print))
    reqs = []
    for task, folder in TASKS.items():
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
                   "others_cpu_share": round(median([m["others_cpu_share"] for m in ms]), 3)} for name, ms in log.items()}
    report = {"command": " ".join(["python -m bench.finetune_speed", *sys.argv[1:]]),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine_info(),
              "requests": len(reqs), "model_input_tokens": tokens, "batch_size": args.batch_size, "rows": rows,
              "speed_up": round(rows["after"]["tokens_per_s"] / rows["before"]["tokens_per_s"], 2),
              "max_abs_diff_logprob_sums": float(np.max(np.abs(sums["after"] - sums["before"]))), "log": log}
    text = (f"`{report['command']}`\n\n{report['machine']['cpu']}, {report['machine']['cores']} cores, "
            f"{report['date']}: {len(reqs)} requests (SST-2, CoLA, Story Cloze dev), {tokens} model-input tokens, "
            f"tiny preset, batch {args.batch_size}.\n\n| scorer | tokens/s | others' CPU |\n|---|---:|---:|\n"
            + "".join(f"| {n} | {r['tokens_per_s']} | {100 * r['others_cpu_share']:.0f}% |\n" for n, r in rows.items())
            + f"\nafter / before: {report['speed_up']}×; largest difference of a log-probability sum: "
              f"{report['max_abs_diff_logprob_sums']:.2e}\n")
    return report, text
