#!/usr/bin/env bash
# Runs on a GPU machine (no TensorFlow there): one tools.torch_pretrain.train run per learning rate, side by
# side on the one GPU, each fitted into the same wall-time budget; then the run with the lowest final
# held-out perplexity is copied to $OUT (default: $TMPDIR/torch_pretrain_sweep/out; its log and weights), with
# every run's log in $OUT/sweep.jsonl.
#
#   bash tools/torch_pretrain/sweep.sh TOKENS.npz BUDGET_MINUTES PRESET BATCH LR [LR ...]
#
# tools/torch_pretrain/README.md gives the exact call; docs/training.md what it measured.
set -euo pipefail
tokens=$1 budget=$2 preset=$3 batch=$4
shift 4
work=${TMPDIR:-/tmp}/torch_pretrain_sweep
rm -rf "$work" && mkdir -p "$work"
for lr in "$@"; do
  python3 -m tools.torch_pretrain.train --tokens="$tokens" --out_dir="$work/lr$lr" --model="$preset" --batch_size="$batch" \
    --learning_rate="$lr" --epochs=100 --budget_minutes="$budget" --probe_after=90 > "$work/lr$lr.out" 2>&1 &
done
status=0
wait || status=$?
for lr in "$@"; do echo "== lr $lr"; tail -n 3 "$work/lr$lr.out"; done
python3 - "$work" "${OUT:-$work/out}" <<'PY'
import glob, json, math, os, shutil, sys
work, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
final = {}
with open(os.path.join(out, "sweep.jsonl"), "w") as sweep:
    for log in sorted(glob.glob(os.path.join(work, "lr*", "log.jsonl"))):
        rows = [json.loads(line) for line in open(log)]
        run = os.path.basename(os.path.dirname(log))
        for row in rows:
            sweep.write(json.dumps({"run": run, **row}) + "\n")
        ppl = [r["valid_ppl"] for r in rows if "valid_ppl" in r]
        if any("done" in r for r in rows) and ppl:  # finished (a run that stopped late still counts)
            final[run] = ppl[-1]
print("final held-out perplexity:", json.dumps(final))
best = min(final, key=final.get)
print("best:", best)
for path in glob.glob(os.path.join(work, best, "*")):
    shutil.copy(path, out)
PY
exit $status
