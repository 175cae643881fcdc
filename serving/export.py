r"""Export trained models as TF Serving versions: ``<export_base>/<model_name>/<version>/``.

    python -m serving.export --run_dir=runs/finetune_sst2 --export_base=exported
    python -m serving.export --run_dir=runs/shakespeare_tiny --export_base=exported --model_name=plays_lm
    python -m serving.export --preset=gpt1_tiny_books_en --export_base=exported --model_name=lm

The run folder is read once, by ``gpt_tf.runs.folder.RunFolder``. A fine-tuning run dir
(``finetune_config.json``) gives a task model (``serving/task_module.py``: text -> probabilities,
label ids and names, or the score), restored by ``gpt_tf.runs.checkpoints.load_task_model`` (no
training code); its task and tokenizer come from the task data's ``manifest.json``. A
pre-training run dir (``train_config.json``) or a folder of GPT-1 release shards gives a language
model (``serving/lm_module.py``). A preset (``--preset``: a shipped preset's name or a preset folder) is
exported as a run would be: a task preset's task (its class named by its ``task.json``) as ``export_task``
writes a Python-API task, a backbone preset's language model with the preset's own tokenizer. The version is
one above the newest already there unless ``--version`` says otherwise; it appears atomically.

The SavedModels compute in ``--precision`` (default float32, whatever the run trained in: the
checkpoints hold float32 weights either way) and always answer in float32. ``--weights=bfloat16|int8|
int8_weight_only`` holds the weights in fewer bytes (``gpt_tf.gpt1.weight_formats``: a smaller SavedModel, core
TensorFlow ops only, as every export); ``--weights=bfloat16`` computes in bfloat16, so ``--precision`` stays float32.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags, logging

from gpt_tf import backend
from serving import extra

extra.require("serving.export", __name__)  # the warm-up records are TF Serving's protos: the serving extra

FLAGS = flags.FLAGS

WARMUP_TEXT = "a warm-up request."


def open_run(run_dir: str, tokenizer_dir: str = "", data_dir: str = ""):
    """The ``RunFolder`` of ``run_dir`` (``gpt_tf.runs.folder``), its tokenizer checked against the
    data it was built with; ValueError / FileNotFoundError naming the problem."""
    from gpt_tf.runs.folder import RunFolder

    run = RunFolder.open(run_dir, data_dir=data_dir, tokenizer_dir=tokenizer_dir)
    problems = run.tokenizer_problems()
    if problems:
        raise ValueError("; ".join(problems))
    return run


def load_finetuned(run_dir: str, precision: str = "float32", data_dir: str = ""):
    """(the keras-hub task, ``TaskSpec``, tokenizer dir) of a fine-tuning run's latest checkpoint.

    ``gpt_tf.runs.checkpoints.load_task_model`` builds the model the run implies (a multi-task run gets
    its shared backbone and every head; the primary task's is returned) and restores only its
    weights: no optimizer, no training data.
    """
    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    run = RunFolder.open(run_dir, data_dir=data_dir)
    return (*load_task_model(run, precision), run.tokenizer_dir)


def load_lm(model_config, path: str, precision: str = "float32"):
    """The ``GPT1CausalLM`` of ``model_config`` with the pre-trained weights at ``path``: a pre-training run (its
    latest checkpoint), GPT-1 release shards or a backbone preset (``gpt_tf.convert.pretrained``)."""
    from gpt_tf.convert.pretrained import restore_pretrained_lm
    from gpt_tf.gpt1.build import causal_lm_for

    lm = causal_lm_for(model_config, dtype=precision)
    restore_pretrained_lm(lm, path)
    return lm


def load_task_preset(folder: str, precision: str = "float32"):
    """The keras-hub task a task preset holds, computing in ``precision``: its ``task.json`` names the class, which
    GPT-1's family registers with Keras when ``gpt_tf.gpt1`` is imported."""
    import json

    import keras

    import gpt_tf.gpt1  # noqa: F401 -- importing it registers GPT-1's classes

    from gpt_tf.convert.preset_io import TASK_FILE

    path = os.path.join(folder, TASK_FILE)
    with open(path) as f:
        name = json.load(f).get("registered_name") or ""
    task_class = keras.saving.get_registered_object(name)
    if task_class is None or not hasattr(task_class, "from_preset"):
        raise ValueError(f"{path}: its class {name!r} is not one of GPT-1's tasks")
    return task_class.from_preset(folder, dtype=precision)


def task_warmup(model_name: str, task) -> list:
    """Warm-up records: the text signature at batch 1 and 8, and Classify / Regress once."""
    from serving.saved_model_io import examples_log, predict_log, text_example
    from serving.task_module import CHOICES, input_specs

    fields = {name: ([WARMUP_TEXT] * spec.shape[1] if name == CHOICES else WARMUP_TEXT)
              for name, spec in input_specs(task).items()}
    records = [predict_log(model_name, "serving_default", {k: [v] * n for k, v in fields.items()}) for n in (1, 8)]
    regress = task.head == "regression"
    records.append(examples_log(model_name, "regress" if regress else "classify", [text_example(fields)], regress))
    return records


def _offline_tokenizer(tokenizer):
    """A ``GPTTokenizer``: ``tokenizer`` itself, or the one in the folder it names."""
    from gpt_tf.text.tokenizer import GPTTokenizer

    return GPTTokenizer.from_dir(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer


def export_task_model(model, task, tokenizer, base_path: str, model_name: str, version: int = 0) -> str:
    """Writes a fine-tuning run's keras-hub task (``load_task_model``) as a servable version; returns its folder.
    ``tokenizer``: the folder of its BPE files."""
    from serving.saved_model_io import save_version, traced_signatures
    from serving.task_module import TaskServingModule

    module = TaskServingModule(model, task, task_preprocessor(task, tokenizer, model.backbone.max_sequence_length))
    return save_version(module, traced_signatures(module), base_path, model_name, version, task_warmup(model_name, task))


def export_task(task, base_path: str, model_name: str = "", version: int = 0) -> str:
    """Writes a fine-tuned task of the Python API (``gpt_tf.GPT1TextClassifier``, ``GPT1TextRegressor``,
    ``GPT1MultipleChoice``, with a ``GPT1TaskPreprocessor``) as a servable version: the same core-TF signatures as a fine-tuning run's (raw
    strings in; no TF-Text op, no custom op). Returns its folder."""
    from serving.saved_model_io import save_version, traced_signatures

    name = model_name or task.name
    module = _task_module(task)
    return save_version(module, traced_signatures(module), base_path, name, version, task_warmup(name, module.task))


def export_task_at(task, path: str) -> str:
    """``export_task``'s SavedModel written at ``path`` itself (no version folder; absent or empty), as Keras's
    ``Model.export(path)`` writes one: the tasks' ``export`` (``gpt_tf/gpt1/task.py``). Returns ``path``."""
    from serving.saved_model_io import free_target, save_at, traced_signatures

    path = free_target(path)  # before the (slow) tracing of the signatures
    module = _task_module(task)
    return save_at(module, traced_signatures(module), path, task_warmup(task.name, module.task))


def task_preprocessor(task, tokenizer, sequence_length: int):
    """The ``GPT1TaskPreprocessor`` of a registry ``TaskSpec`` (a fine-tuning run's) with the BPE files of the folder
    ``tokenizer``: what its SavedModel makes its features with."""
    from gpt_tf.gpt1 import GPT1TaskPreprocessor, GPT1Tokenizer

    return GPT1TaskPreprocessor(GPT1Tokenizer(os.fspath(tokenizer)), sequence_length, task.input_type,
                                task.num_choices)


def _task_module(task):
    """A Python-API task behind the text signatures (``serving/task_module.py``)."""
    from gpt_tf.gpt1.text_classifier import task_spec_of
    from serving.task_module import TaskServingModule

    backend.require_tensorflow(f"exporting {type(task).__name__} for TF Serving (a SavedModel taking raw strings)")
    if getattr(task, "preprocessor", None) is None:
        raise ValueError("the task has no preprocessor: its tokenizer is what the SavedModel tokenizes with")
    return TaskServingModule(task, task_spec_of(task), task.preprocessor)


def export_lm(lm, tokenizer, base_path: str, model_name: str, version: int = 0, top_k: int = 10) -> str:
    """Writes a ``GPT1CausalLM`` as a servable version; returns its folder. ``tokenizer``: a ``GPTTokenizer``
    or its folder."""
    from serving.lm_module import LMServingModule
    from serving.saved_model_io import predict_log, save_version, traced_signatures

    tokenizer = _offline_tokenizer(tokenizer)
    module = LMServingModule(lm, tokenizer.tf_tokenizer(), tokenizer, top_k=top_k)
    warmup = [predict_log(model_name, "serving_default", {"text": [WARMUP_TEXT] * n}) for n in (1, 8)]
    return save_version(module, traced_signatures(module), base_path, model_name, version, warmup)


def in_weights(model, weights: str):
    """``model`` holding its weights in ``weights`` (``gpt_tf.gpt1.weight_formats.WEIGHTS``; float32: itself)."""
    from gpt_tf.gpt1.weight_formats import check_weights, with_weights

    return model if check_weights(weights) == "float32" else with_weights(model, weights)


def export_run(run_dir: str, base_path: str, model_name: str = "", version: int = 0, precision: str = "float32",
               tokenizer_dir: str = "", data_dir: str = "", top_k: int = 10, weights: str = "float32") -> str:
    """Exports a fine-tuning run, a pre-training run or GPT-1 release shards; returns the version folder."""
    from gpt_tf.runs.checkpoints import load_task_model

    run = open_run(run_dir, tokenizer_dir, data_dir)
    if run.kind == "finetune":
        model, task = load_task_model(run, precision)
        return export_task_model(in_weights(model, weights), task, run.tokenizer_dir, base_path,
                                 model_name or task.name, version)
    lm = in_weights(load_lm(run.model_config, run.path, precision), weights)
    return export_lm(lm, run.tokenizer, base_path, model_name or "lm", version, top_k)


def export_preset(preset: str, base_path: str, model_name: str = "", version: int = 0, precision: str = "float32",
                  top_k: int = 10, weights: str = "float32") -> str:
    """Exports a preset (a shipped preset's name or a preset folder): a task preset's task as ``export_task`` does,
    a backbone preset's language model (``export_lm``, with the preset's tokenizer); returns the version folder."""
    from gpt_tf.convert import preset_io

    folder = preset_io.locate(preset)
    if not preset_io.is_preset(folder):
        raise FileNotFoundError(f"{folder} is not a preset folder: it holds no {preset_io.CONFIG_FILE} and "
                                f"{preset_io.WEIGHTS_FILE}")
    if preset_io.is_task_preset(folder):
        return export_task(in_weights(load_task_preset(folder, precision), weights), base_path, model_name, version)
    lm = in_weights(load_lm(preset_io.preset_config(folder), folder, precision), weights)
    tokenizer = os.path.join(folder, preset_io.TOKENIZER_ASSETS)
    return export_lm(lm, tokenizer, base_path, model_name or "lm", version, top_k)


def define_flags() -> None:
    """The command line's flags (defined only when run as a command, so the module imports cleanly)."""
    flags.DEFINE_string("run_dir", None, "Fine-tuning or pre-training run dir, or a folder of GPT-1 release shards.")
    flags.DEFINE_string("preset", None, "Or a preset: a shipped preset's name (gpt1_tiny_books_en) or a preset folder "
                        "(a task preset gives its task model, a backbone preset the language model).")
    flags.DEFINE_string("export_base", None, "Base path: the version goes to <export_base>/<model_name>/<version>.")
    flags.DEFINE_string("model_name", "", "Servable name (default: the task's name, or 'lm' for a language model).")
    flags.DEFINE_integer("version", 0, "Version number (0: one above the newest in the base path).")
    flags.DEFINE_enum("precision", "float32", ["float32", "mixed_bfloat16"], "Compute precision of the export.")
    flags.DEFINE_string("tokenizer_dir", "", "--run_dir: BPE files (default: the folder the run's data manifest "
                        "names).")
    flags.DEFINE_string("data_dir", "", "--run_dir of a fine-tuning run: task data folder (default: the one the run "
                        "used).")
    flags.DEFINE_integer("lm_top_k", 10, "Language models: next-token guesses returned per text.")
    flags.DEFINE_enum("weights", "float32", ["float32", "bfloat16", "int8", "int8_weight_only"],
                      "The weights' format in the SavedModel (gpt_tf.gpt1.weight_formats): bfloat16 or int8 are "
                      "smaller on disk; the graph stays core TensorFlow ops (docs/serving.md).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter off unless asked for
    if not FLAGS.export_base:
        sys.exit("serving.export: --export_base required")
    if bool(FLAGS.run_dir) == bool(FLAGS.preset):
        sys.exit("serving.export: give one of --run_dir and --preset")
    if FLAGS.preset and (FLAGS.tokenizer_dir or FLAGS.data_dir):
        sys.exit("serving.export: --tokenizer_dir and --data_dir are a run's; a preset holds its own tokenizer")
    if FLAGS.version < 0:
        sys.exit("serving.export: --version must be >= 0")
    if FLAGS.weights != "float32" and FLAGS.precision != "float32":
        sys.exit("serving.export: --weights sets the weights' bytes, --precision the compute; give one of them")
    if FLAGS.preset:
        from gpt_tf.convert.preset_io import locate

        try:
            locate(FLAGS.preset)  # before TensorFlow starts
        except ValueError as err:
            sys.exit(f"serving.export: --preset={err}")
    from gpt_tf.console import import_tensorflow, start_command

    start_command(serving=True)  # the serving settings
    import_tensorflow()  # its start-up lines off the console
    try:
        if FLAGS.preset:
            path = export_preset(FLAGS.preset, FLAGS.export_base, FLAGS.model_name, FLAGS.version, FLAGS.precision,
                                 FLAGS.lm_top_k, FLAGS.weights)
        else:
            path = export_run(FLAGS.run_dir, FLAGS.export_base, FLAGS.model_name, FLAGS.version, FLAGS.precision,
                              FLAGS.tokenizer_dir, FLAGS.data_dir, FLAGS.lm_top_k, FLAGS.weights)
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        sys.exit(f"serving.export: {err}")
    except OSError as err:
        from gpt_tf.write_errors import as_write_error

        fault = as_write_error(err)
        if fault is None:
            raise
        sys.exit(f"serving.export: {fault}; no version was added, those already in {os.path.dirname(fault.path)} "
                 "are untouched: fix the storage and run the same command")
    print(path, flush=True)


def run():
    """The console script's entry point (pyproject's [project.scripts])."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
