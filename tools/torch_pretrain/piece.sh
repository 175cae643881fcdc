#!/usr/bin/env bash
# One piece of a tools.torch_pretrain.train run on a GPU machine (no TensorFlow there), for a session of limited
# length. The run folder keeps the state between sessions; the same command again resumes where the last
# stopped (exit 75: more pieces to go; 0: the run is finished). With OUT set, the log and the weights are copied
# to $OUT/<run folder's name> (and, with KEEP_STATE=1, the resume state, to carry to another machine).
#
#   bash tools/torch_pretrain/piece.sh TOKENS.npz RUN_DIR PIECE_MINUTES [tools.torch_pretrain.train flags ...]
#   e.g. bash tools/torch_pretrain/piece.sh .gpu/books_small.npz.xz .gpu/books_small_run 7 \
#            --model=small --batch_size=128 --learning_rate=5e-4 --epochs=7
#
# PIECE_MINUTES counts updates only: leave 2-3 minutes of the call for start-up, compilation and evaluation.
set -uo pipefail
tokens=$1 run=$2 minutes=$3
shift 3
python3 -m tools.torch_pretrain.train --tokens="$tokens" --out_dir="$run" --piece_minutes="$minutes" "$@"
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
