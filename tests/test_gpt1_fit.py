"""GPT-1's keras-hub tasks train like the project's loop: ``fit`` from the same weights on the same batches
(dropout off) ends at the loop's weights, on one device and under ``MirroredStrategy`` (2 logical CPUs). Both run the
model's own ``train_step``; ``compile(train_steps=...)`` gives ``fit`` the loop's schedule over its updates.

Data: 32 SST-2 training sentences tokenized with books_tiny's BPE; model: the ``test`` shape on that vocabulary.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.small_runs import ENV, ROOT

BOOKS_BPE = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en" / "assets" / "tokenizer"
STEPS, BATCH, N_CTX = 4, 8, 32
INPUTS = ("input_ids", "extract_index", "lm_weights")  # the task model's inputs among a batch's features
TOL = 2e-5


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    from pipelines import finetune_data as fd

    out = tmp_path_factory.mktemp("gpt1_fit") / "sst2"
    fd.build_task_data("sst2", shared_data / "glue" / "SST-2", BOOKS_BPE, out, max_examples=STEPS * BATCH,
                       show_progress=False)
    return out


def _config():
    from gpt_tf.config import get_size

    return get_size("test", vocab_size=8000, n_ctx=N_CTX, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)


@pytest.fixture(scope="module")
def loop_run(data, tmp_path_factory):
    """The loop's run (4 updates, dropout off) from a keras-hub preset (``--init_checkpoint=<preset>``): its
    initial and final weights, and the batches it trained on."""
    import tensorflow as tf

    import gpt_tf

    from gpt_tf.training.task_objective import Finetuner, FinetuneConfig
    from gpt_tf.data.transforms import load_task_spec, special_ids_from_config, task_dataset

    task, config = load_task_spec(str(data)), _config()
    preset = tmp_path_factory.mktemp("preset")
    pretrained = gpt_tf.GPT1Backbone.from_gpt_config(config)
    pretrained.save_to_preset(str(preset))
    run = FinetuneConfig(data_dir=str(data), run_dir=str(tmp_path_factory.mktemp("loop")), batch_size=BATCH, epochs=1,
                         learning_rate=1e-3, warmup_fraction=0.25, lm_coef=0.5, clf_pdrop=0.0, seed=3,
                         init_checkpoint=str(preset))
    finetuner = Finetuner(task, config, run, tf.distribute.get_strategy(), log=lambda *_: None)
    start = [v.numpy() for v in finetuner.model.weights]
    # copies of the preset's float32 values, no arithmetic: bit for bit on every CPU
    np.testing.assert_array_equal(start[1], pretrained.weights[1].numpy())  # the preset's weights, read by the loop
    np.testing.assert_array_equal(start[0][:8000], pretrained.weights[0].numpy()[:8000])  # (special rows re-drawn)
    batches = list(task_dataset(task, str(data), "train", BATCH, N_CTX, special_ids_from_config(config), training=True,
                                seed=run.seed, buckets=finetuner.buckets).take(STEPS))
    finetuner.train(progress=False)
    return start, [v.numpy() for v in finetuner.model.weights], batches, run.run_dir


def _classifier(start):
    import gpt_tf

    backbone = gpt_tf.GPT1Backbone.from_gpt_config(_config())
    classifier = gpt_tf.GPT1TextClassifier(backbone, num_classes=2, preprocessor=None, dropout=0.0, lm_coef=0.5)
    for variable, value in zip(classifier.weights, start):
        variable.assign(value)
    classifier.compile(learning_rate=1e-3, warmup_fraction=0.25, train_steps=STEPS)
    return classifier


def _dataset(batches):
    import tensorflow as tf

    return tf.data.Dataset.from_generator(lambda: iter([({k: x[k] for k in INPUTS}, y) for x, y in batches]),
                                          output_signature=(
        {k: tf.TensorSpec([None] * len(batches[0][0][k].shape), batches[0][0][k].dtype) for k in INPUTS},
        tf.TensorSpec([None], batches[0][1].dtype)))


def test_fit_on_the_loops_batches_ends_at_the_loops_weights(loop_run):
    start, end, batches, _ = loop_run
    classifier = _classifier(start)
    history = classifier.fit(_dataset(batches), steps_per_epoch=STEPS, epochs=1, verbose=0)
    assert int(classifier.optimizer.iterations.numpy()) == STEPS and np.isfinite(history.history["loss"][0])
    assert float(classifier.optimizer.learning_rate) == 0.0  # the loop's schedule: decayed to 0 at its last update
    got = [v.numpy() for v in classifier.weights]
    assert max(float(np.abs(a - b).max()) for a, b in zip(start, end)) > 1e-4  # the loop did move them
    for variable, a, b in zip(classifier.weights, got, end):
        np.testing.assert_allclose(a, b, atol=TOL, err_msg=variable.path)


def test_fit_under_mirrored_strategy_on_two_cpus_matches_one_device(loop_run, tmp_path):
    start, end, batches, _ = loop_run
    np.savez(tmp_path / "start.npz", *start)
    with open(tmp_path / "batches.npz", "wb") as f:
        np.savez(f, **{f"{i}_{k}": v.numpy() for i, (x, y) in enumerate(batches) for k, v in {**x, "y": y}.items()})
    script = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        from gpt_tf.strategy import split_cpu
        split_cpu(2)
        import gpt_tf
        from gpt_tf.config import get_size
        start = list(np.load("{tmp_path}/start.npz").values())
        raw = np.load("{tmp_path}/batches.npz")
        batches = [({{k: tf.constant(raw[f"{{i}}_{{k}}"]) for k in ("input_ids", "extract_index", "lm_weights")}},
                    tf.constant(raw[f"{{i}}_y"])) for i in range({STEPS})]
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            config = get_size("test", vocab_size=8000, n_ctx={N_CTX}, embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0)
            classifier = gpt_tf.GPT1TextClassifier(gpt_tf.GPT1Backbone.from_gpt_config(config), num_classes=2,
                                                   preprocessor=None, dropout=0.0, lm_coef=0.5)
            for variable, value in zip(classifier.weights, start):
                variable.assign(value)
            classifier.compile(learning_rate=1e-3, warmup_fraction=0.25, train_steps={STEPS})
        spec = ({{k: tf.TensorSpec([None] * len(v.shape), v.dtype) for k, v in batches[0][0].items()}},
                tf.TensorSpec([None], batches[0][1].dtype))
        dataset = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=spec)
        classifier.fit(dataset, steps_per_epoch={STEPS}, epochs=1, verbose=0)
        assert classifier.distribute_strategy.num_replicas_in_sync == 2
        np.savez("{tmp_path}/end.npz", *[v.numpy() for v in classifier.weights])
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = list(np.load(tmp_path / "end.npz").values())
    for a, b in zip(got, end):
        np.testing.assert_allclose(a, b, atol=TOL)


def test_a_finetuning_run_converts_to_a_task_preset_with_the_runs_logits(loop_run, data, tmp_path):
    import keras_hub

    from gpt_tf.gpt1.backbone import GPT1Backbone
    from gpt_tf.convert.presets import preset_from_run
    from gpt_tf.data.transforms import load_task_spec
    from gpt_tf.gpt1.text_classifier import task_for_spec, task_spec_of

    _, end, batches, run_dir = loop_run
    # what the CLI writes beside the checkpoints (the Finetuner, used directly here, does not)
    (Path(run_dir) / "model_config.json").write_text(json.dumps(_config().to_dict()))
    (Path(run_dir) / "finetune_config.json").write_text(json.dumps({"data_dir": str(data),
                                                                    "clf_pdrop": 0.0}))
    preset_from_run(run_dir, str(tmp_path / "preset"))
    task = keras_hub.models.TextClassifier.from_preset(str(tmp_path / "preset"))
    spec = load_task_spec(str(data))
    got = task_spec_of(task, spec.name)  # the preset's task answers as the run's: its input type, head and labels
    assert (got.input_type, got.head, got.label_names) == (spec.input_type, spec.head, spec.label_names)
    reference = task_for_spec(GPT1Backbone.from_gpt_config(_config()), spec, dropout=0.0)
    for variable, value in zip(reference.weights, end):
        variable.assign(value)
    features = {k: batches[0][0][k] for k in INPUTS}
    # bit for bit on every CPU: the preset holds the run's weights exactly, and the task's call runs the reference's
    # eager ops on the same shapes
    np.testing.assert_array_equal(task(features).numpy(), reference(features).numpy())
