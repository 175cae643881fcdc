"""Pre-trains the project's GPT on an accelerator that has PyTorch but no TensorFlow, with the reference model.

    python -m tools.torch_pretrain.train --tokens=<export>.npz.xz --out_dir=/tmp/run \\
        --model=tiny --batch_size=128 --learning_rate=1e-3 --epochs=8

Why it exists: a GPU machine may offer PyTorch and `transformers` but no TensorFlow (a fixed image, no
package registry, too little room to carry TensorFlow's wheel there): ``tools/torch_pretrain/README.md``. The model trained here is `transformers`' ``OpenAIGPTLMHeadModel`` with
the preset's sizes: the reference implementation that ``tests/test_weights.py`` proves equal to
``gpt_tf.gpt1.causal_lm.GPT1CausalLM`` (logits to 1e-5 on the same weights). The recipe is the project's
pre-training recipe (``gpt_tf.nn.optim``): AdamW with decoupled weight decay 0.01 on rank >= 2 weights only,
global-norm clipping 1.0, linear warm-up then cosine decay to 0, dropout 0.1, N(0, 0.02) init, the LM
loss over (n_ctx + 1)-token windows at stride n_ctx of the token stream, exactly the records that
``pipelines.pretrain_data`` writes (``tools.torch_pretrain.convert export`` turns those records back into the
stream). Each epoch visits every window once in a seeded order; ``--updates=N`` runs exactly N updates
(another run's token count) instead of ``--epochs``' worth.

``--model=lstm_<preset>`` trains Table 5's LSTM baseline instead (``lstm_model.py``: the network of
``gpt_tf.gpt1.lstm.LSTMBackbone`` with the tied head, Keras's initialisation; ``tests/test_torch_lstm.py``) by the
same code path: the same recipe, windows, order, evaluations, pieces and files; float32 and eager (no bf16
autocast, no ``torch.compile``; PyTorch's default ``torch.backends.cudnn.allow_tf32`` lets cuDNN's LSTM use TF32),
and ``transformers`` is not needed.

Writes into ``--out_dir``: ``log.jsonl`` (train loss, and held-out loss / perplexity against tokens seen at
every evaluation), and ``weights-<step>.part<k>.npz`` (the model's state dict, ``OpenAIGPTLMHeadModel``'s or the
LSTM's, in files of at most 15 MiB, ``pieces.py``; float16 for the
intermediate checkpoints kept for the zero-shot curve, float32 for the last). ``tools.torch_pretrain.convert
import`` turns them into a gpt_tf run folder.

In pieces (``--piece_minutes`` / ``--piece_updates``, or SIGTERM): a piece stops at an update boundary, writes
``state-<step>.part<k>`` + ``state.json`` (weights, Adam moments, the RNG states, the data order and position,
the schedule: one ``torch.save`` in files of at most 15 MiB) and exits with status 75; the same command
resumes from them bit-exactly (``tests/test_torch_pretrain.py``) and appends to ``log.jsonl``; the finished
run removes them.
A session of limited length on the GPU machine is then one piece (``tools/torch_pretrain/piece.sh``).

Only numpy, absl, torch and transformers (and this package's ``pieces`` and ``lstm_model``) are imported: no
TensorFlow, no gpt_tf.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time

import numpy as np
from absl import app, flags

from tools.torch_pretrain.pieces import PIECE_EXIT, load_state, remove_state, save_state, save_weights
from tools.torch_pretrain.streams import load_streams

# The model sizes of gpt_tf/config.py that this script can build (GPT-1's d_ff is always 4 * n_embd,
# which is also what transformers' OpenAIGPT hard-codes). Kept equal by tests/test_torch_pretrain.py.
SIZES = {
    "gpt1": dict(n_ctx=512, n_embd=768, n_layer=12, n_head=12),
    "small": dict(n_ctx=256, n_embd=384, n_layer=6, n_head=6),
    "tiny": dict(n_ctx=128, n_embd=256, n_layer=4, n_head=4),
    "test": dict(n_ctx=32, n_embd=32, n_layer=2, n_head=4),
    # Table 5's LSTM baseline (tools/torch_pretrain/lstm_model.py): d_ff is the LSTM's units.
    "lstm_small": dict(n_ctx=256, n_embd=384, n_layer=1, d_ff=1408),
    "lstm_tiny": dict(n_ctx=128, n_embd=256, n_layer=1, d_ff=744),
    "lstm_test": dict(n_ctx=32, n_embd=32, n_layer=1, d_ff=64),
}

FLAGS = flags.FLAGS


OWN_FLAGS = ("tokens", "out_dir", "model", "batch_size", "learning_rate", "warmup_fraction", "epochs", "weight_decay",
             "clip_norm", "dropout", "evals", "eval_windows", "keep", "seed", "budget_minutes", "compile",
             "probe_after", "updates")
# What a resumed piece must share, with the data (the export's meta: its config hash and tokenizer; the npz
# itself may sit at another path on another machine).
RESUMABLE = ("model", "batch_size", "learning_rate", "warmup_fraction", "epochs", "weight_decay",
             "clip_norm", "dropout", "evals", "eval_windows", "keep", "seed", "updates")


def define_flags():
    flags.DEFINE_string("tokens", None, "npz of tools.torch_pretrain.convert export (train / valid streams + meta).")
    flags.DEFINE_string("out_dir", None, "Where log.jsonl and weights-<step>.part<k>.npz go.")
    flags.DEFINE_enum("model", "tiny", sorted(SIZES), "Model size (gpt_tf/config.py).")
    flags.DEFINE_integer("batch_size", 128, "Sequences per update.")
    flags.DEFINE_float("learning_rate", 1e-3, "Peak learning rate.")
    flags.DEFINE_float("warmup_fraction", 0.02, "Warm-up updates as a fraction of all updates.")
    flags.DEFINE_float("epochs", 1.0, "Passes over the training windows (fractions allowed).")
    flags.DEFINE_integer("updates", 0, "Exactly this many updates (another run's token count, e.g. books_tiny's 7,158 "
                         "of 256 x 128), instead of --epochs' worth; 0: --epochs.")
    flags.DEFINE_float("weight_decay", 0.01, "Decoupled weight decay on rank >= 2 weights.")
    flags.DEFINE_float("clip_norm", 1.0, "Global gradient-norm clip.")
    flags.DEFINE_float("dropout", 0.1, "Residual, attention and embedding dropout.")
    flags.DEFINE_integer("evals", 24, "Held-out evaluations, evenly spaced in updates (the curve's points).")
    flags.DEFINE_integer("eval_windows", 4096, "Held-out windows per evaluation (0: all).")
    flags.DEFINE_integer("keep", 3, "Intermediate checkpoints kept (float16), evenly spaced; the last is float32.")
    flags.DEFINE_integer("seed", 0, "Init, dropout and data-order seed.")
    flags.DEFINE_float("budget_minutes", 0.0, "Fit the schedule into this wall time (a timed probe picks the "
                       "number of updates, at most --epochs' worth); 0: run --epochs.")
    flags.DEFINE_bool("compile", True, "torch.compile the model (CUDA only).")
    flags.DEFINE_float("probe_after", 0.0, "With --budget_minutes: start timing this many seconds after start-up "
                       "(runs started side by side: once all of them have compiled).")
    flags.DEFINE_float("piece_minutes", 0.0, "Stop after this many minutes of updates with the state saved "
                       f"(exit {PIECE_EXIT}); the same command resumes. 0: no limit.")
    flags.DEFINE_integer("piece_updates", 0, f"Stop after this many updates of this piece (exit {PIECE_EXIT}). "
                         "0: no limit.")


def windows(stream: np.ndarray, n_ctx: int) -> np.ndarray:
    """All (n_ctx + 1)-token windows at stride n_ctx, as pipelines.pretrain_data writes them."""
    n = max(0, (len(stream) - 1) // n_ctx)
    index = np.arange(n)[:, None] * n_ctx + np.arange(n_ctx + 1)[None, :]
    return stream[index]


def lr_at(step: int, peak: float, warmup: int, total: int) -> float:
    """gpt_tf.nn.optim.WarmupDecay (cosine): linear warm-up from 0, then cosine to 0 at ``total``."""
    if warmup and step < warmup:
        return peak * step / warmup
    frac = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    return peak * 0.5 * (1.0 + math.cos(math.pi * frac))


def is_lstm(preset: str) -> bool:
    return preset.startswith("lstm_")


def build_model(torch, transformers, preset: str, vocab_size: int, dropout: float):
    """The preset's model: ``transformers``' ``OpenAIGPTLMHeadModel``, or for ``lstm_*`` the LSTM baseline
    (``lstm_model.LSTMLanguageModel``; ``transformers`` may then be None)."""
    sizes = SIZES[preset]
    if is_lstm(preset):
        from tools.torch_pretrain.lstm_model import LSTMLanguageModel

        return LSTMLanguageModel(vocab_size, dropout=dropout, **sizes)
    config = transformers.OpenAIGPTConfig(
        vocab_size=vocab_size, n_positions=sizes["n_ctx"], n_embd=sizes["n_embd"], n_layer=sizes["n_layer"],
        n_head=sizes["n_head"], afn="gelu", resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        layer_norm_epsilon=1e-5, initializer_range=0.02)
    return transformers.OpenAIGPTLMHeadModel(config)


def param_groups(model, weight_decay: float):
    """Decay on rank >= 2 weights only (the release's rule; gpt_tf.nn.optim.make_optimizer); frozen ones left out
    (the LSTM's second bias, ``lstm_model``)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.ndim >= 2]
    rest = [p for p in trained if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


class Run:
    """Model, optimizer, data and the update step of one pre-training run."""

    def __init__(self, torch, transformers):
        self.torch = torch
        torch.manual_seed(FLAGS.seed)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.meta, data = load_streams(FLAGS.tokens)
        self.n_ctx = SIZES[FLAGS.model]["n_ctx"]
        self.train = windows(data["train"].astype(np.int64), self.n_ctx)
        valid = windows(data["valid"].astype(np.int64), self.n_ctx)
        if FLAGS.eval_windows:
            valid = valid[np.random.default_rng(1234).permutation(len(valid))[: FLAGS.eval_windows]]
        self.valid = valid
        self.steps_per_epoch = len(self.train) // FLAGS.batch_size
        self.model = build_model(torch, transformers, FLAGS.model, self.meta["vocab_size"], FLAGS.dropout).to(self.device)
        self.initial_state = {k: v.clone() for k, v in self.model.state_dict().items()}
        # The transformer: compiled, bf16 autocast on CUDA. The LSTM: eager float32 (cuDNN's fused LSTM; the
        # Keras recipe it stands for runs in float32), so nothing there for the compiler or bf16 to win.
        fast = self.device == "cuda" and not is_lstm(FLAGS.model)
        self.forward = torch.compile(self.model) if FLAGS.compile and fast else self.model
        self.autocast = torch.autocast(self.device, dtype=torch.bfloat16, enabled=fast)
        self.reset()

    def reset(self):
        """Initial weights, fresh Adam moments and the seeded data order (after a timing probe)."""
        self.model.load_state_dict(self.initial_state)
        self.torch.manual_seed(FLAGS.seed)
        self.optimizer = self.torch.optim.AdamW(param_groups(self.model, FLAGS.weight_decay), lr=FLAGS.learning_rate,
                                                betas=(0.9, 0.999), eps=1e-8, fused=self.device == "cuda")
        self.rng, self.order = np.random.default_rng(FLAGS.seed), np.zeros([0], np.int64)

    def state(self, **extra) -> dict:
        """Everything the next piece needs to go on bit-exactly: weights, moments, RNG states, data position."""
        torch = self.torch
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if self.device == "cuda" else None,
                "numpy_rng": self.rng.bit_generator.state, "order": self.order, **extra}

    def restore(self, state: dict) -> None:
        torch = self.torch
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"].cpu())
        if state["cuda_rng"] is not None and self.device == "cuda":
            torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
        self.rng.bit_generator.state = state["numpy_rng"]
        self.order = state["order"]

    def loss_of(self, batch):
        x = self.torch.from_numpy(batch).to(self.device, non_blocking=True)
        with self.autocast:
            try:
                out = self.forward(x[:, :-1])
            except Exception as error:  # noqa: BLE001 - torch.compile fails lazily, at the first call
                if self.forward is self.model:
                    raise
                print(f"torch.compile failed ({type(error).__name__}: {error}); running eagerly", flush=True)
                self.forward = self.model
                out = self.forward(x[:, :-1])
        logits = getattr(out, "logits", out)  # transformers' output object, or the LSTM's logits
        return self.torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))

    def next_batch(self):
        if len(self.order) < FLAGS.batch_size:  # a new epoch: every window once, in a seeded order
            self.order = np.concatenate([self.order, self.rng.permutation(len(self.train))])
        batch, self.order = self.train[self.order[: FLAGS.batch_size]], self.order[FLAGS.batch_size:]
        return batch

    def update(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss = self.loss_of(self.next_batch())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), FLAGS.clip_norm)
        self.optimizer.step()
        return loss.detach()

    def evaluate(self):
        self.model.eval()
        total = 0.0
        with self.torch.no_grad():
            for i in range(0, len(self.valid), 256):
                chunk = self.valid[i:i + 256]
                total += float(self.loss_of(chunk)) * len(chunk)
        self.model.train()
        return total / len(self.valid)

    def seconds_per_update(self, wall, warm=20, timed=100):
        """A timing probe, started ``--probe_after`` seconds after ``wall`` (so that runs started side by side
        are all compiled and stepping when they time themselves); the run is reset afterwards."""
        for _ in range(warm):
            self.update(FLAGS.learning_rate * 0.01)
        self.evaluate()  # compiles the evaluation graph too
        time.sleep(max(0.0, FLAGS.probe_after - (time.time() - wall)))
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        start = time.time()
        for _ in range(timed):
            self.update(FLAGS.learning_rate * 0.01)
        if self.device == "cuda":
            self.torch.cuda.synchronize()
        seconds = (time.time() - start) / timed
        self.reset()
        return seconds


def main(argv):
    del argv
    import torch

    transformers = None
    if not is_lstm(FLAGS.model):  # the LSTM needs torch alone
        import transformers
    wall = time.time()
    run = Run(torch, transformers)
    setting = {name: getattr(FLAGS, name) for name in OWN_FLAGS}
    resumed = load_state(torch, FLAGS.out_dir, run.device) if FLAGS.out_dir and os.path.isdir(FLAGS.out_dir) else None
    if resumed is not None:  # a later piece: the schedule and position that the first piece fixed
        saved = {k: resumed["setting"].get(k, FLAGS[k].default) for k in RESUMABLE}  # a flag newer than the state
        differ = {k: (saved[k], setting[k]) for k in RESUMABLE if saved[k] != setting[k]}
        if resumed["meta"] != run.meta:
            differ["tokens"] = (resumed["meta"].get("config_hash"), run.meta.get("config_hash"))
        if differ:
            sys.exit(f"tools.torch_pretrain.train: {FLAGS.out_dir} holds a run with other settings {differ} (saved, now); "
                     "use another --out_dir")
        run.restore(resumed)
        total, warmup, probe, step = resumed["total"], resumed["warmup"], resumed["probe"], resumed["step"]
        running, spent = resumed["running"], resumed["seconds"]
        print(f"resuming at update {step} of {total}", flush=True)
    else:
        total = FLAGS.updates or max(1, int(FLAGS.epochs * run.steps_per_epoch))
        probe = None
        if FLAGS.budget_minutes:  # fit the whole schedule (so that it anneals to 0) into the budget
            probe = run.seconds_per_update(wall)
            left = 60 * FLAGS.budget_minutes - (time.time() - wall)
            total = max(1, min(total, int(0.85 * left / probe)))  # 15% for evaluations and checkpoints
        warmup = int(FLAGS.warmup_fraction * total)
        running, step, spent = [], 0, 0.0
    pieces = bool(FLAGS.piece_minutes or FLAGS.piece_updates)
    deadline = wall + 60 * FLAGS.budget_minutes * 1.1 if FLAGS.budget_minutes and not pieces else float("inf")
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    log = open(os.path.join(FLAGS.out_dir, "log.jsonl"), "a" if resumed is not None else "w")
    if resumed is None:
        setting.update(windows=len(run.train), steps=total, warmup=warmup, meta=run.meta, seconds_per_update=probe,
                       torch=torch.__version__, transformers=transformers and transformers.__version__,
                       device=torch.cuda.get_device_name() if run.device == "cuda" else "cpu")
        log.write(json.dumps({"setting": setting}) + "\n")

    def record(step, train_loss, held, start):
        row = {"step": step, "tokens": step * FLAGS.batch_size * run.n_ctx, "epoch": step / run.steps_per_epoch,
               "train_loss": train_loss, "valid_loss": held, "valid_ppl": math.exp(held),
               "lr": lr_at(step, FLAGS.learning_rate, warmup, total), "seconds": spent + time.time() - start}
        log.write(json.dumps(row) + "\n")
        log.flush()
        print(json.dumps(row), flush=True)

    stop = []  # SIGTERM (a session's time limit): stop at the next update boundary, state saved
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    start = time.time()
    if resumed is None:
        first = run.evaluate()  # the untrained model: the curve's first point
        record(0, first, first, start)
    eval_at = {round(total * k / FLAGS.evals) for k in range(1, FLAGS.evals + 1)}
    keep_at = {round(total * k / (FLAGS.keep + 1)) for k in range(1, FLAGS.keep + 1)} - {total}
    piece_start, piece_end = step, time.time() + 60 * FLAGS.piece_minutes if FLAGS.piece_minutes else float("inf")
    while step < total:
        step += 1
        running.append(run.update(lr_at(step - 1, FLAGS.learning_rate, warmup, total)))
        late = time.time() > deadline  # the probe misjudged the speed: stop, before the schedule's end
        if step in eval_at or step == total or late:
            record(step, float(torch.stack(running).mean()), run.evaluate(), start)
            running = []
        if step in keep_at and not late:
            save_weights(torch, run.model, FLAGS.out_dir, step, np.float16)
        if late:
            print(f"stopped at update {step} of {total}: over 110% of --budget_minutes", flush=True)
            break
        piece_over = (FLAGS.piece_updates and step - piece_start >= FLAGS.piece_updates) or time.time() > piece_end
        if step < total and (stop or piece_over):
            own = {k: setting[k] for k in OWN_FLAGS}
            state = run.state(setting=own, meta=run.meta, total=total, warmup=warmup, probe=probe, step=step,
                              running=running, seconds=spent + time.time() - start)
            save_state(torch, FLAGS.out_dir, state)
            log.write(json.dumps({"piece": step, "of": total, "seconds": spent + time.time() - start}) + "\n")
            log.close()
            print(f"piece stopped at update {step} of {total}, state saved; run the same command to go on", flush=True)
            sys.exit(PIECE_EXIT)
    save_weights(torch, run.model, FLAGS.out_dir, step, np.float32)
    remove_state(FLAGS.out_dir)
    log.write(json.dumps({"done": step, "of": total, "seconds": spent + time.time() - start,
                          "wall_seconds": time.time() - wall}) + "\n")
    log.close()


if __name__ == "__main__":
    define_flags()
    flags.mark_flags_as_required(["tokens", "out_dir"])
    app.run(main)
