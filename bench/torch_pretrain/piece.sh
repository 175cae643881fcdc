#!/usr/bin/env bash
# One piece of a bench.torch_pretrain.train run on a lent GPU machine (no TensorFlow there): one device call of at
# most 10 minutes. The run folder keeps the state between calls; the same call again resumes where the last
# stopped (exit 75: more pieces to go; 0: the run is finished). What comes back under $OUT: the log and the
# weights (and, with KEEP_STATE=1, the resume state, to carry to another machine; docs/scaling.md says when
# that fits the carry limit).
#
#   bash bench/torch_pretrain/piece.sh TOKENS.npz RUN_DIR PIECE_MINUTES [bench.torch_pretrain.train flags ...]
#   e.g. bash bench/torch_pretrain/piece.sh .gpu/books_small.npz.xz .gpu/books_small_run 7 \
#            --model=small --batch_size=128 --learning_rate=5e-4 --epochs=7
#
# PIECE_MINUTES counts updates only: leave 2-3 minutes of the call for start-up, compilation and evaluation.
set -uo pipefail
tokens=$1 run=$2 minutes=$3
shift 3
python3 -m bench.torch_pretrain.train --tokens="$tokens" --out_dir="$run" --piece_minutes="$minutes" "$@"
status=$?
if [ -n "${OUT:-}" ] && [ -d "$run" ]; then
  back="$OUT/$(basename "$run")"
  mkdir -p "$back"
  cp "$run"/log.jsonl "$back"/ 2>/dev/null || true
  cp "$run"/weights-*.npz "$back"/ 2>/dev/null || true
  if [ "${KEEP_STATE:-0}" = 1 ]; then cp "$run"/state.json "$run"/state-*.part* "$back"/ 2>/dev/null || true; fi
fi
case $status in
  0) echo "piece.sh: the run is finished" ;;
  75) echo "piece.sh: piece done; the same call resumes" ;;
  *) echo "piece.sh: failed ($status)"; exit $status ;;
esac
