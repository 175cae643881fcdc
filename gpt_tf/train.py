r"""Command line: pre-train, evaluate or sample a GPT language model; fine-tune it on a task.

    python -m gpt_tf.train --flagfile=configs/gpt1_pretrain.flags
    python -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=eval
    python -m gpt_tf.train --flagfile=configs/shakespeare_tiny.flags --mode=generate --prompt="to be"
    python -m gpt_tf.train --flagfile=configs/finetune_rte.flags --init_checkpoint=runs/books_tiny
    python -m gpt_tf.train --flagfile=configs/finetune_sst2.flags --mode=eval     # run_dir/metrics.json
    python -m gpt_tf.train --flagfile=configs/finetune_sst2.flags --mode=predict --predict_split=test  # submission

(``gpt-tf-train`` is the same command.) The flagfiles named here are in the sources' ``configs/`` (the repository and
the source distribution), run from the folder holding it; an installed wheel has no flagfiles: give the flags, or a
flagfile of your own (``--helpfull`` lists every flag with its default).

With ``--task`` the run fine-tunes (§3.2) and the paper's fine-tuning recipe is the default for
any flag the command line leaves unset (lr 6.25e-5, batch 32, 3 epochs, 0.2% warm-up, λ 0.5).
Both run the one training loop (``gpt_tf/training``); a flag of the other kind of run is an error
(``flag_checks.MODE_ONLY``). Pre-training under ``KERAS_BACKEND=jax`` runs Keras's ``fit`` on JAX instead
(``gpt_tf/training/keras_fit.py``; ``--distribution``: one device, ``DataParallel`` or ``ModelParallel``; several
processes with ``--coordinator_address``, ``--num_processes``, ``--process_id``), from the same flags and data; a
flag of TensorFlow's loop is an error there (``flag_checks.route_problems``).

TensorFlow's loop runs under the run's speed choices (``--speed``: by default ``auto``, this machine's fastest CPU
settings, timed once per machine and cached, then the model shapes' choices, the same; ``gpt_tf/speed/resolve.py``):
found before TensorFlow starts (the command starts again where TensorFlow must start otherwise, as under another
oneDNN setting: ``gpt_tf/restart.py``) and before any model is built, printed in one line and written to the run folder's
``speed_choices.json`` (the machine's: a resume elsewhere takes its own).

Flags are read here and in ``gpt_tf/train_flags.py`` (their definitions, defaults and combined checks) only;
everything below takes dataclasses. Re-running the same command
resumes from the run directory's latest checkpoint. Each mode ends with a one-line summary of its
result (``--json``: the result as one JSON line instead, for scripts).

Faults of the machine end a command with one line and a non-zero status, never a traceback: SIGTERM (143,
the step reached saved); a write the storage refuses (1: a full disk, a read-only or removed run folder,
``gpt_tf.write_errors``; nothing half-written is left and the checkpoints before it stay); a worker of a
``--strategy=multi_worker`` cluster lost (1: TensorFlow's coordination service stops hearing its heartbeats,
or its address stops answering, and aborts the collectives of the others within seconds). The same
command resumes from the newest checkpoint after each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Optional

from absl import app, flags, logging

from gpt_tf import flag_checks, train_flags, train_setup

from gpt_tf.speed import kernels
from gpt_tf.runs.faults import resume_hint, worker_lost
from gpt_tf.runs.files import DATA_FILE, MODEL_CONFIG, RUN_CONFIGS, SPEED_CHOICES, data_identity, resume_problems, \
    write_json_atomic
from gpt_tf.runs.lock import LOCK_FILE, RunDirLocked, chief_task, lock_run_dir
from gpt_tf.train_flags import define_flags
from gpt_tf.write_errors import WriteError, as_write_error, writing

FLAGS = flags.FLAGS  # defined by train_flags.define_flags() when run() starts
_RUN_LOCK = []  # the run folder's lock file, held open until the process ends


def _strategy_and_precision(keras, model_config, seq, speed):
    """The --strategy, the precision (--precision, ``auto`` resolved for ``model_config`` at batch x ``seq``) and the
    run's speed choices (``speed``, its per-shape fields decided for the model in that precision, made the process's
    and printed in one line); the global Keras dtype policy is set to that precision."""
    from gpt_tf.speed import choices, resolve
    from gpt_tf.speed.precision import resolve_precision
    from gpt_tf.strategy import make_strategy

    strategy = make_strategy(FLAGS.strategy, FLAGS.num_cpu_devices, FLAGS.tpu, FLAGS.tpu_zone, FLAGS.gcp_project,
                             workers=FLAGS.workers, worker_index=FLAGS.worker_index)
    precision, reason = resolve_precision(FLAGS.precision, model_config, FLAGS.batch_size, seq)
    if FLAGS.precision == "auto":
        _say(reason)
    compute = "float32" if precision == "float32" else "bfloat16"
    speed = resolve.for_model(speed, model_config, compute)  # before any model is built or traced
    choices.set_current(speed.choices)
    _say(resolve.line(speed, kernels.status()))  # builds the fused CPU kernels on a machine's first run (~10 s)
    if precision != "float32":
        keras.mixed_precision.set_dtype_policy(precision)
    return strategy, precision, speed.choices


def _record_speed(speed_choices) -> None:
    """The choices this run trains under, in its folder (the machine's: rewritten at each start, never compared)."""
    write_json_atomic(os.path.join(FLAGS.run_dir, SPEED_CHOICES), speed_choices.to_dict())


def _budget_steps(model_config, precision: str) -> int:
    """--train_steps, or fewer where they would take more than --train_budget_minutes at the step time measured
    now (at least --min_train_steps and --warmup_steps)."""
    from gpt_tf.speed.precision import step_seconds

    seconds = step_seconds(model_config, precision, FLAGS.batch_size, model_config.n_ctx)
    fit = int(60 * FLAGS.train_budget_minutes / seconds)
    steps = min(FLAGS.train_steps, max(FLAGS.min_train_steps, FLAGS.warmup_steps, fit))
    _say(f"train budget {FLAGS.train_budget_minutes:g} min: {1e3 * seconds:.0f} ms per {FLAGS.batch_size}x"
         f"{model_config.n_ctx} update measured now, {fit} fit -> {steps} updates (--min_train_steps="
         f"{FLAGS.min_train_steps}, --train_steps={FLAGS.train_steps})")
    return steps


def _lock_run_dir() -> None:
    """The chief takes the run folder's lock for the run (``gpt_tf.runs.lock.lock_run_dir``); a second trainer
    on the folder stops here, exit status 2, before it writes anything."""
    if not chief_task(FLAGS.workers, FLAGS.worker_index) or FLAGS.process_id:
        return
    try:
        with writing(os.path.join(FLAGS.run_dir, LOCK_FILE)):
            _RUN_LOCK.append(lock_run_dir(FLAGS.run_dir))
    except (RunDirLocked, WriteError) as err:
        flag_checks.fail("gpt_tf.train", [str(err)], "cannot start, nothing was written")


def _say(message: str) -> None:
    """Run-level messages (resume, transfer) to stderr; TensorFlow's INFO chatter stays off."""
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class Summary:
    """A mode's result: its JSON (None: the line only, as ``--mode=generate`` prints) and its one-line summary."""
    result: Optional[dict]
    line: str


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if FLAGS.task:
        train_flags.apply_finetune_defaults()
    problems = flag_checks.problems(FLAGS) + train_flags.combination_problems()  # value rules (one table), then combinations
    if problems:
        flag_checks.fail("gpt_tf.train", problems)
    setup = train_setup.setup()
    if setup.problems:
        flag_checks.fail("gpt_tf.train", list(setup.problems), "cannot start, nothing was written")
    if not train_flags.on_keras_fit():  # the speed choices (this machine's, cached); started again where they need it
        from gpt_tf.console import start_command
        from gpt_tf.speed import resolve

        setup = dataclasses.replace(setup, speed=start_command(resolve.for_command(FLAGS.speed)))
    if FLAGS.mode == "train" and not FLAGS.task:
        _lock_run_dir()
    if train_flags.on_keras_fit():  # Keras's fit on JAX: TensorFlow is not this process's backend
        _print(_guarded_keras_fit(setup))
        return

    # Imported late: flag errors must show in a second, not after TensorFlow's start-up.
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow(setup.speed)  # its start-up lines off the console (GPT_TF_VERBOSE=1 keeps them)
    import keras

    from gpt_tf.training.preemption import PREEMPTED_EXIT_CODE, Preempted
    from gpt_tf.runs.checkpoints import CheckpointError
    from gpt_tf.strategy import split_cpu
    from gpt_tf.training.loop import DataError

    if FLAGS.deterministic:
        tf.config.experimental.enable_op_determinism()
    split_cpu(FLAGS.num_cpu_devices)
    try:
        summary = (_finetune if FLAGS.task else _pretrain)(setup, keras)
    except Preempted as stopped:  # the step reached is saved; re-running the command resumes
        _say(str(stopped))
        sys.exit(PREEMPTED_EXIT_CODE)
    except (DataError, CheckpointError) as err:
        sys.exit(f"gpt_tf.train: {err}")
    except tf.errors.UnavailableError as err:
        if FLAGS.strategy != "multi_worker":
            raise
        sys.exit(f"gpt_tf.train: {worker_lost(err, FLAGS.run_dir, FLAGS.workers, FLAGS.worker_index)}")
    except (OSError, tf.errors.OpError) as err:
        fault = as_write_error(err)
        if fault is None:
            raise
        sys.exit(f"gpt_tf.train: {fault}; {resume_hint(fault, FLAGS.run_dir, FLAGS.mode == 'train')}")
    _print(summary)


def _print(summary: Summary) -> None:
    print(json.dumps(summary.result) if FLAGS.json and summary.result is not None else summary.line, flush=True)


def _guarded_keras_fit(setup: train_setup.Setup) -> Summary:
    """``_pretrain_keras_fit`` with the machine's faults as one line: devices that do not fit --distribution (1),
    SIGTERM (143, saved), a refused write (1)."""
    from gpt_tf.training.placement import PlacementError
    from gpt_tf.training.preemption import PREEMPTED_EXIT_CODE, Preempted

    try:
        return _pretrain_keras_fit(setup)
    except PlacementError as err:
        sys.exit(f"gpt_tf.train: {err}")
    except Preempted as stopped:
        _say(str(stopped))
        sys.exit(PREEMPTED_EXIT_CODE)
    except OSError as err:
        fault = as_write_error(err)
        if fault is None:
            raise
        sys.exit(f"gpt_tf.train: {fault}; fix the storage and run the same command to resume from the last save")


def _pretrain_keras_fit(setup: train_setup.Setup) -> Summary:
    """Pre-training by Keras's fit on JAX (``gpt_tf/training/keras_fit.py``), on --distribution's devices."""
    from gpt_tf.training.keras_fit import KerasFitPretrainer
    from gpt_tf.training.lm_objective import TrainConfig
    from gpt_tf.training.placement import describe

    placement = train_flags.placement()
    trainer = KerasFitPretrainer(setup.model_config, TrainConfig(**setup.train_kwargs), placement,
                                 FLAGS.tokenizer_dir or setup.manifest["tokenizer"]["dir"], setup.manifest, log=_say)
    print(f"model {FLAGS.model}: {setup.model_config.n_params / 1e6:.2f}M parameters, Keras's fit on JAX, "
          f"{describe(placement)}, {FLAGS.precision}, run dir {FLAGS.run_dir}", flush=True)
    result = trainer.train()
    return Summary(result, f"trained to step {result['step']}, loss {result['loss']:.4f}, held-out loss "
                           f"{result['held_out_loss']:.4f} ({result['held_out_bits_per_char']:.4f} bits per character)"
                           f"; the run is in {FLAGS.run_dir} (its language model: {result['preset']})")


def _pretrain(setup: train_setup.Setup, keras) -> Summary:
    """Pre-training's --mode: train, eval (held-out perplexity) or generate."""
    from gpt_tf.analysis.baselines import unigram_perplexity
    from gpt_tf.gpt1.generate import Sampler
    from gpt_tf.training.lm_objective import Pretrainer, TrainConfig
    from gpt_tf.training.monitor import TrainCallbacks

    model_config, tokenizer, manifest = setup.model_config, setup.tokenizer, setup.manifest
    strategy, precision, speed_choices = _strategy_and_precision(keras, model_config, model_config.n_ctx, setup.speed)
    train_kwargs = setup.train_kwargs
    if FLAGS.mode == "train" and FLAGS.train_budget_minutes > 0:
        train_kwargs = {**train_kwargs, "train_steps": _budget_steps(model_config, precision)}
    if FLAGS.mode != "train":  # the run's own checkpoint is what eval and generate read
        train_kwargs = {**train_kwargs, "init_checkpoint": ""}
    config = TrainConfig(**{**train_kwargs, "precision": precision})
    trainer = Pretrainer(model_config, config, strategy, log=_say)
    print(f"model {FLAGS.init_checkpoint or FLAGS.model}: {model_config.n_params / 1e6:.2f}M parameters, {strategy.num_replicas_in_sync} replica(s), "
          f"{precision}, run dir {FLAGS.run_dir}", flush=True)

    if FLAGS.mode == "train":
        trainer.save_model_config(data_identity(data=manifest))
        if trainer.chief:
            _record_speed(speed_choices)
        zero_shot = None
        if FLAGS.zero_shot_tasks:
            from gpt_tf.analysis.heuristics import ZeroShotSuite

            zero_shot = ZeroShotSuite(train_flags.zero_shot_config(), tokenizer, bos_id=manifest.get("separator", {}).get("id"))
        callbacks = TrainCallbacks(trainer, tokenizer, progress=FLAGS.progress, zero_shot=zero_shot)
        try:
            result = trainer.train(callbacks)
        except BaseException:  # also when preempted: the bar ends and TensorBoard is flushed, if the disk lets it
            try:
                callbacks.close()
            except Exception:  # noqa: BLE001 -- the error in flight is the one to report
                pass
            raise
        callbacks.close()
        loss = "" if result["loss"] is None else f", loss {result['loss']:.4f}"
        return Summary(result, f"trained to step {result['step']}{loss}; the run is in {FLAGS.run_dir} "
                               f"(checkpoints/, TensorBoard logs in tb/)")
    step = trainer.restore(resuming=False)
    if FLAGS.mode == "eval":
        held_out = trainer.evaluate(tokenizer=tokenizer)
        result = {"step": step, **held_out, **unigram_perplexity(FLAGS.data_dir, model_config.n_ctx, tokenizer.vocab_size)}
        path = os.path.join(FLAGS.run_dir, f"eval_step{step}.json")
        if trainer.chief:
            write_json_atomic(path, result)
        return Summary(result, f"held-out perplexity {result['perplexity']:.2f} at step {step} over {result['tokens']:,} "
                               f"tokens (the unigram baseline: {result['unigram_perplexity']:.1f}), "
                               f"{result['bits_per_char']:.4f} bits per character, {result['bits_per_byte']:.4f} per "
                               f"byte; saved in {path}")
    lm = trainer.model
    if FLAGS.weights != "float32":
        from gpt_tf.gpt1.weight_formats import with_weights

        lm = with_weights(lm, FLAGS.weights)
    sampler = Sampler(lm)
    ids = sampler.sample(tokenizer.encode(FLAGS.prompt), FLAGS.sample_length, FLAGS.temperature, FLAGS.top_k, FLAGS.seed)
    return Summary(None, FLAGS.prompt + " " + tokenizer.decode(ids))


def _finetune_model_config(tokenizer_vocab):
    """The backbone's config: the run's own (eval, predict, resume), the pre-trained run's, GPT-1's for
    release shards, else --model's."""
    from gpt_tf.config import get_size
    from gpt_tf.convert.pretrained import pretrained_model_config

    if FLAGS.mode in ("eval", "predict") or os.path.isfile(os.path.join(FLAGS.run_dir, MODEL_CONFIG)):
        config = pretrained_model_config(FLAGS.run_dir)
    elif FLAGS.init_checkpoint:
        config = pretrained_model_config(FLAGS.init_checkpoint)
        if FLAGS.n_ctx > config.n_ctx:
            sys.exit(f"gpt_tf.train: --n_ctx={FLAGS.n_ctx} exceeds the pre-trained model's {config.n_ctx} positions")
        if FLAGS.n_ctx:  # a shorter context for short-text tasks: the first n_ctx position rows are kept
            config = config.replace(n_ctx=FLAGS.n_ctx)
    else:
        config = get_size(FLAGS.model, vocab_size=tokenizer_vocab, **({"n_ctx": FLAGS.n_ctx} if FLAGS.n_ctx else {}))
    config = config.replace(**train_flags.model_overrides())
    if config.vocab_size != tokenizer_vocab:
        sys.exit(f"gpt_tf.train: the model has {config.vocab_size} BPE tokens but {FLAGS.data_dir} was tokenized "
                 f"with {tokenizer_vocab}: rebuild it with the pre-trained model's tokenizer")
    return config


def _finetune(setup: train_setup.Setup, keras) -> Summary:
    """Fine-tuning's --mode: train (then every eval split), eval (metrics.json) or predict (a submission file)."""
    from gpt_tf.console import format_metrics
    from gpt_tf.runs.checkpoints import CheckpointError
    from gpt_tf.runs.files import save_run_configs
    from gpt_tf.runs.submissions import write_submission
    from gpt_tf.tasks import TaskSpec
    from gpt_tf.training.task_objective import FinetuneConfig, Finetuner

    manifest = setup.manifest
    task = TaskSpec.from_dict(manifest["task_spec"])
    if task.name != FLAGS.task:
        sys.exit(f"gpt_tf.train: --task={FLAGS.task} but {FLAGS.data_dir} holds task {task.name!r}")
    if FLAGS.mode == "predict" and FLAGS.predict_split and FLAGS.predict_split not in manifest["splits"]:
        sys.exit(f"gpt_tf.train: --predict_split={FLAGS.predict_split}, but {FLAGS.data_dir} holds the splits "
                 f"{', '.join(manifest['splits'])}")
    model_config = _finetune_model_config(int(manifest["tokenizer"]["vocab_size"]))
    aux = {f"aux_{i}": aux_manifest for i, aux_manifest in enumerate(setup.aux_manifests)}
    for path, aux_manifest in zip(FLAGS.aux_data_dirs, aux.values()):
        vocab = int(aux_manifest["tokenizer"]["vocab_size"])
        if vocab != model_config.vocab_size:
            sys.exit(f"gpt_tf.train: {path} was tokenized with {vocab} BPE tokens but the model has "
                     f"{model_config.vocab_size}: rebuild it with the same tokenizer as --data_dir")
    strategy, precision, speed_choices = _strategy_and_precision(keras, model_config, min(32, model_config.n_ctx),
                                                                 setup.speed)  # short views
    same = ("data_dir", "run_dir", "init_checkpoint", "transfer_layers", "batch_size", "epochs", "learning_rate",
            "warmup_fraction", "lm_coef", "clf_pdrop", "weight_decay", "clip_norm", "seed", "log_every",
            "length_buckets", "buckets_per_octave", "grad_accum_steps", "jit_compile")
    given = {n: FLAGS[n].value for n in ("train_steps", "checkpoint_every") if FLAGS[n].present}  # else: none / epochs
    config = FinetuneConfig(**{n: FLAGS[n].value for n in same}, **given, precision=precision,
                            aux_data_dirs=tuple(FLAGS.aux_data_dirs), mixture=tuple(float(w) for w in FLAGS.task_mixture))
    data = data_identity(data=manifest, **aux)
    if FLAGS.mode == "train":
        problems = resume_problems(FLAGS.run_dir, {MODEL_CONFIG: dataclasses.asdict(model_config),
                                                   RUN_CONFIGS["finetune"]: dataclasses.asdict(config), DATA_FILE: data})
        if problems:
            flag_checks.fail("gpt_tf.train", problems, "cannot start, nothing was written")
        _lock_run_dir()
    tuner = Finetuner(task, model_config, config, strategy, log=_say)
    if FLAGS.mode == "train":
        if tuner.chief:
            save_run_configs(FLAGS.run_dir, "finetune", model_config, config, data)
            _record_speed(speed_choices)
        results = tuner.train(progress=FLAGS.progress)
    else:
        try:
            step = tuner.restore(resuming=False)
        except CheckpointError as err:
            sys.exit(f"gpt_tf.train: {err}")
        if FLAGS.mode == "predict":
            split = FLAGS.predict_split or task.eval_splits[0]
            path = write_submission(tuner, split, FLAGS.run_dir, write=tuner.chief)
            return Summary({"split": split, "path": path}, f"{task.name} predictions for the {split} split: {path} "
                                                           "(index<TAB>prediction, GLUE's submission layout)")
        results = {"step": step, **tuner.evaluate_all()}
    path = os.path.join(FLAGS.run_dir, "metrics.json")
    if tuner.chief:  # every worker computed the results; one writes them
        write_json_atomic(path, {"task": task.name, **results})
    at_step = f"step {results['step']}: " if "step" in results else ""
    return Summary(results, f"{at_step}{format_metrics(results)}; saved in {path}")


def run():
    """``python -m gpt_tf.train`` and the ``gpt-tf-train`` console script."""
    define_flags()
    flags.adopt_module_key_flags(train_flags)  # --help lists them
    app.run(main, flags_parser=flag_checks.lenient_parser("gpt_tf.train"))


if __name__ == "__main__":
    run()
