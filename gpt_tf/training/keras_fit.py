"""Pre-training by Keras's ``fit`` on JAX: what ``python -m gpt_tf.train`` runs under ``KERAS_BACKEND=jax``.

Why a second route: the command line's loop (``Pretrainer`` on ``TrainLoop``) is TensorFlow's ``tf.distribute``;
on JAX the family trains by its own ``fit`` (``jit``-compiled steps), laid over one device or many by
``keras.distribution`` (``placement.py``). What a run is stays the loop's: the same ``TrainConfig`` from the same
flags and flagfiles, the same model (``causal_lm_for``), the paper's optimizer (``make_optimizer``: AdamW with decay
on matrices only, clipping at the global norm, warm-up then decay over ``train_steps``), the same seeded batches of
the data folder (``pretraining_dataset``) and the same loss (keras-hub's ``CausalLM`` loss: the mean token
cross-entropy of the global batch, Eq. 1).

The run folder: ``model_config.json``, ``train_config.json`` and ``data.json`` as the loop writes them (a resume
compares them), and in ``keras_fit/`` (``gpt_tf.runs.files.KERAS_FIT``) ``latest.weights.h5`` (the model's and the
optimizer's variables, so the schedule's step too), ``state.json`` (the updates done and dropout's random state,
which the weights file does not hold; at the end the held-out loss and its bits per character and per byte,
``gpt_tf/training/text_counts.py``) and ``log.jsonl`` (the mean training loss of
every ``log_every`` updates); at the end ``preset/``, the language model with the data's tokenizer (``from_preset``
on any backend; fine-tuning's ``--init_checkpoint``). It saves every ``checkpoint_every`` updates, at the end, and
at SIGTERM after the update in flight (then ``Preempted``: exit status 143). The same command resumes from the
last save: the weights, the optimizer, dropout's state and the batches skipped to the update reached, so the
updates are those of one run in a go (on the CPU to the bit). A save holds whole arrays: a run may resume on another
``--distribution`` or device count. Only process 0 writes; SIGTERM must reach every process, as a scheduler sends it.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile

import keras

from gpt_tf.config import GPTConfig
from gpt_tf.data.reader import as_model_inputs, batches_per_pipeline, pretraining_dataset
from gpt_tf.gpt1 import GPT1CausalLM, GPT1CausalLMPreprocessor, GPT1Tokenizer
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.nn.optim import WarmupDecay, make_optimizer
from gpt_tf.runs.files import KERAS_FIT, data_identity, save_run_configs, write_json_atomic
from gpt_tf.text.tokenizer import GPTTokenizer
from gpt_tf.training import placement as placing
from gpt_tf.training.lm_objective import TrainConfig, compile_lm
from gpt_tf.training.preemption import Preempted, StopRequest
from gpt_tf.training.text_counts import TextCounter

WEIGHTS, STATE, LOG, PRESET = "latest.weights.h5", "state.json", "log.jsonl", "preset"


class _Saves(keras.callbacks.Callback):
    """At the end of each of ``fit``'s epochs (``gcd(log_every, checkpoint_every)`` updates): the mean loss at
    every ``log_every`` updates, a save at every ``checkpoint_every``, at ``total`` and at a stop request."""

    def __init__(self, run, stop: StopRequest, start: int):
        super().__init__()
        self.run, self.stop, self.done = run, stop, start
        self.pending = []  # (updates, mean loss) of the epochs since the last log line

    def on_train_begin(self, logs=None):
        self.model.stop_training = self.stop.requested  # one that came before fit (fit clears the flag)

    def on_epoch_end(self, epoch, logs=None):
        run, updates = self.run, int(self.model.optimizer.iterations.numpy())
        self.pending.append((updates - self.done, float(logs["loss"])))
        self.done = updates
        stopping = self.stop.requested
        self.model.stop_training = self.model.stop_training or stopping
        if updates % run.config.log_every == 0 or updates == run.total or stopping:
            steps = sum(n for n, _ in self.pending)
            run.log_line({"step": updates, "loss": sum(n * loss for n, loss in self.pending) / steps,
                          "lr": float(run.schedule(updates))})
            self.pending = []
        if updates % run.config.checkpoint_every == 0 or updates == run.total or stopping:
            run.save(updates)


class KerasFitPretrainer:
    """The model, optimizer and data of ``config`` on ``placement``; ``train()`` runs (or resumes) the run."""

    def __init__(self, model_config: GPTConfig, config: TrainConfig, placement: placing.Placement, tokenizer_dir: str,
                 manifest: dict, log=print):
        placing.start(placement)  # before anything touches a device
        self.model_config, self.config, self.placement, self.log = model_config, config, placement, log
        self.tokenizer_dir, self.manifest, self.total = tokenizer_dir, manifest, config.train_steps
        self.folder = os.path.join(config.run_dir, KERAS_FIT)
        # the saves gather every weight in collectives, so every process saves: the others into a folder of their own
        self.scratch = None if placement.chief else tempfile.mkdtemp(prefix="keras_fit-")
        self.distribution = placing.distribution(placement, config.batch_size)
        keras.distribution.set_distribution(self.distribution)
        keras.utils.set_random_seed(config.seed)
        self.model = causal_lm_for(model_config, dtype=config.precision)
        self.schedule = WarmupDecay(config.learning_rate, config.warmup_steps, config.train_steps, config.lr_decay)
        optimizer = make_optimizer(self.schedule, weight_decay=config.weight_decay, clip_norm=config.clip_norm,
                                   beta_1=config.adam_beta_1, beta_2=config.adam_beta_2, epsilon=config.adam_epsilon,
                                   variables=self.model.trainable_variables)
        compile_lm(self.model, optimizer, jit_compile=True)
        # dropout's random state: variables of the model that its weights file leaves out
        self.seeds = [v for v in self.model.variables if v.path.endswith("seed_generator_state")]
        self.last_loss = None  # the last log line's

    # ------------------------------------------------------------------ the run folder
    def _path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def log_line(self, row: dict) -> None:
        """A ``log.jsonl`` line (process 0) and the same on the console."""
        self.last_loss = row["loss"]
        self.log(f"step {row['step']}: loss {row['loss']:.4f}, lr {row['lr']:.3g}")
        if self.placement.chief:
            with open(self._path(LOG), "a") as f:
                f.write(json.dumps(row) + "\n")

    def save(self, updates: int) -> None:
        """The weights and the optimizer beside ``latest.weights.h5``, renamed over it, then ``state.json``
        (process 0; the others save into their scratch folder, which is removed)."""
        if self.scratch:
            self.model.save_weights(os.path.join(self.scratch, WEIGHTS))
            return
        tmp = self._path(f".{WEIGHTS}")
        self.model.save_weights(tmp)
        os.replace(tmp, self._path(WEIGHTS))
        self._write_state(updates)

    def _write_state(self, updates: int, **extra) -> None:
        seeds = [[int(x) for x in keras.ops.convert_to_numpy(v.value)] for v in self.seeds]
        write_json_atomic(self._path(STATE), {"updates": updates, "dropout_seeds": seeds, **extra})

    def _resume(self) -> int:
        """The updates a previous command saved (0 for a new run), their weights, optimizer and dropout state
        loaded; ``log.jsonl`` cut back to them (a killed command's later lines)."""
        if not os.path.isfile(self._path(STATE)):
            if self.placement.chief:
                os.makedirs(self.folder, exist_ok=True)
                save_run_configs(self.config.run_dir, "pretrain", self.model_config, self.config,
                                 data_identity(data=self.manifest))
                with open(self._path(LOG), "w"):
                    pass
            return 0
        with open(self._path(STATE)) as f:
            state = json.load(f)
        self.model.load_weights(self._path(WEIGHTS))
        for variable, value in zip(self.seeds, state["dropout_seeds"]):
            variable.assign(keras.ops.convert_to_tensor(value, dtype=variable.dtype))
        start = int(self.model.optimizer.iterations.numpy())
        if self.placement.chief:
            with open(self._path(LOG)) as f:
                kept = [line for line in f if json.loads(line)["step"] <= start]
            with open(self._path(LOG), "w") as f:
                f.writelines(kept)
        self.log(f"resumed at update {start} of {self.total} from {self._path(WEIGHTS)}")
        return start

    # ------------------------------------------------------------------ training
    def _dataset(self, split: str):
        c = self.config
        train = split == "train"
        return as_model_inputs(pretraining_dataset(c.data_dir, split, c.batch_size, self.model_config.n_ctx,
                                                   shuffle=train, seed=c.seed, repeat=train))

    def train(self) -> dict:
        """Runs the updates not yet done, evaluates the held-out split, writes the preset; the run's figures."""
        try:
            return self._train(self._resume())
        finally:
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)

    def _train(self, start: int) -> dict:
        c = self.config
        every = math.gcd(c.log_every, c.checkpoint_every)  # fit's epoch: a log line or a save ends at its end
        whole = self.total // every * every
        with StopRequest() as stop:
            saves = _Saves(self, stop, start)
            if start < self.total:
                self.log(f"fit from update {start}")
            if start < whole:
                self.model.fit(self._dataset("train").skip(start), steps_per_epoch=every, epochs=whole // every,
                               initial_epoch=start // every, verbose=0, shuffle=False, callbacks=[saves])
            done = int(self.model.optimizer.iterations.numpy())
            if whole <= done < self.total and not self.model.stop_training:  # the updates after the last whole epoch
                self.model.fit(self._dataset("train").skip(done), steps_per_epoch=self.total - done, epochs=1,
                               verbose=0, shuffle=False, callbacks=[saves])
            done = int(self.model.optimizer.iterations.numpy())
            if done < self.total:
                raise Preempted(done, self._path(WEIGHTS))
        return self._finish(done)

    def _finish(self, done: int) -> dict:
        """The held-out loss (``eval_batches`` batches, 0: the whole split) with its bits per character and per byte
        and, on process 0, the preset."""
        c = self.config
        steps = batches_per_pipeline(c.data_dir, "valid", c.batch_size)  # given: the records' count is unknown
        steps = min(steps, c.eval_batches or steps)
        held_out = float(self.model.evaluate(self._dataset("valid"), steps=steps, verbose=0, return_dict=True)["loss"])
        text = TextCounter(GPTTokenizer.from_dir(self.tokenizer_dir))  # the same batches' targets, as numpy
        for _, targets in self._dataset("valid").take(steps).as_numpy_iterator():
            text.add(targets)
        nats = held_out * steps * c.batch_size * self.model_config.n_ctx  # the mean over equal batches, summed
        bits = {f"held_out_{k}": v for k, v in text.bits(nats).items()}
        preset = os.path.join(c.run_dir, PRESET)
        preprocessor = GPT1CausalLMPreprocessor(GPT1Tokenizer(self.tokenizer_dir))
        GPT1CausalLM(self.model.backbone, preprocessor).save_to_preset(os.path.join(self.scratch or c.run_dir, PRESET))
        if self.placement.chief:
            self._write_state(done, held_out_loss=held_out, **bits)
        return {"step": done, "loss": self.last_loss, "held_out_loss": held_out, **bits,
                "perplexity": math.exp(held_out), "preset": preset, "sharded": self.sharded()}

    def sharded(self) -> dict:
        """``{path: partition spec}`` of the weights split over devices (none but under ``model_parallel``), as
        the backend placed them (JAX's ``sharding.spec``)."""
        out = {}
        for variable in self.model.weights:
            spec = getattr(getattr(variable.value, "sharding", None), "spec", None)
            if spec is not None and any(axis is not None for axis in spec):
                out[variable.path] = [axis for axis in spec]
        return out
