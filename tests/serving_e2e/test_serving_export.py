"""Export: a fine-tuning run and random models as SavedModels; in-graph preprocessing == training's;
the SavedModels run where only tensorflow is imported (the set-up: conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.text_classifier import task_for_spec
from gpt_tf.tasks import get_task
from serving.task_module import TaskServingModule, input_specs
from tests.serving_e2e.helpers import ENV, ROOT, TOL, glue_examples, offline_features
from tests.small_runs import CHILD_SITE, TF_ONLY


# ---------------------------------------------------------------------------------------------- export
def test_export_of_a_finetuning_run_matches_the_in_process_model(base, loaded, sst2_dev):
    """Text -> SavedModel (in process) == offline pipeline -> Keras model; float32 out of a bf16 run."""
    texts, expected = sst2_dev
    served = loaded("sst2").signatures["serving_default"]
    out = served(sentence=tf.constant(texts))
    assert out["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=TOL)
    assert out["label_ids"].numpy().tolist() == expected.argmax(1).tolist()
    names = [n.decode() for n in out["label_names"].numpy()]
    assert names == [("negative", "positive")[i] for i in expected.argmax(1)]
    assert sorted(os.listdir(base / "sst2" / "1" / "assets.extra")) == ["tf_serving_warmup_requests"]


def test_bfloat16_export_answers_float32(sst2_run, shared_data, tokenizer, preprocessor_for, config, sst2_dev):
    """Computing in the run's mixed_bfloat16 still answers float32, close to the float32 export."""
    from serving.export import load_finetuned

    model, task, _ = load_finetuned(sst2_run, "mixed_bfloat16")
    examples = glue_examples(shared_data, "sst2", "glue/SST-2", "dev", 12)
    ids, extract = offline_features(task, examples, tokenizer, config)
    module = TaskServingModule(model, task, preprocessor_for(task))
    out = module.predict_tokens(tf.constant(ids), tf.constant(extract))
    assert out["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(out["probabilities"].numpy(), sst2_dev[1], atol=0.05)


@pytest.mark.parametrize("task_name, folder, split, n, truncates", [
    ("sst2", "glue/SST-2", "dev", 40, True), ("stsb", "glue/STS-B", "dev", 40, False),
    ("rte", "glue/RTE", "dev", 40, True), ("story_cloze", "story_cloze", "val", 20, True),
])
def test_in_graph_preprocessing_equals_the_offline_pipeline(loaded, exported, shared_data, tokenizer, preprocessor_for,
                                                            config, task_name, folder, split, n, truncates):
    """Real rows: the served features (cleaning, BPE, §3.3 views, truncation at n_ctx) == training's.

    SST-2 and STS-B through the exported ``features`` signature, RTE and Story Cloze (pair and
    multiple choice) through the same graph traced in process.
    """
    task = get_task(task_name)
    examples = glue_examples(shared_data, task_name, folder, split, n)
    ids, extract = offline_features(task, examples, tokenizer, config)
    assert (extract == config.n_ctx - 1).any() == truncates
    columns = {"sentence": "text_a", "premise": "text_a", "hypothesis": "text_b", "sentence1": "text_a",
               "sentence2": "text_b", "context": "text_a", "choices": "choices"}
    texts = {name: tf.constant([getattr(e, columns[name]) for e in examples]) for name in input_specs(task)}
    if task_name in exported:
        got = loaded(task_name).signatures["features"](**texts)
        got_ids, got_extract = got["input_ids"], got["extract_index"]
    else:
        backbone = GPT1Backbone.from_gpt_config(config, name="backbone")
        module = TaskServingModule(task_for_spec(backbone, task), task, preprocessor_for(task))
        got_ids, got_extract = tf.function(module.features)(texts)
    np.testing.assert_array_equal(got_extract.numpy(), extract)
    pad = config.special_id("pad")
    padded = np.pad(got_ids.numpy(), [(0, 0), (0, 0), (0, config.n_ctx - got_ids.shape[2])], constant_values=pad)
    np.testing.assert_array_equal(padded, ids)


def test_saved_models_run_in_a_process_that_imports_only_tensorflow(base, exported, sst2_dev, tokenizer):
    """A fresh process with only tensorflow (no keras, tensorflow_text or project code) runs every signature."""
    texts, expected = sst2_dev
    # `import tensorflow` itself imports keras when it is installed: unload it and block any import
    # of it (and of the project, TF Text, keras-hub) before the SavedModels are loaded and run.
    script = TF_ONLY + textwrap.dedent("""
        base, texts = sys.argv[1], json.loads(sys.argv[2])
        sst2 = tf.saved_model.load(base + "/sst2/1").signatures
        example = tf.train.Example(features=tf.train.Features(feature={"sentence": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[texts[0].encode()]))})).SerializeToString()
        lm = tf.saved_model.load(base + "/lm/1").signatures
        out = {
            "probabilities": sst2["serving_default"](sentence=tf.constant(texts))["probabilities"].numpy().tolist(),
            "classify": sst2["classify"](inputs=tf.constant([example]))["scores"].numpy().tolist(),
            "lm_ids": lm["serving_default"](text=tf.constant([texts[0]]))["token_ids"].numpy().tolist(),
            "modules": sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED)),
        }
        print(json.dumps(out))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": CHILD_SITE}  # no project code on the path
    proc = subprocess.run([sys.executable, "-c", script, str(base), json.dumps(texts)], capture_output=True,
                          text=True, env=env, cwd=str(base), timeout=900, check=False)  # a hang, not a timing
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == []
    np.testing.assert_allclose(got["probabilities"], expected, atol=TOL)
    np.testing.assert_allclose(got["classify"][0], expected[0], atol=TOL)
    assert got["lm_ids"][0] == tokenizer.encode(texts[0])


def test_export_cli_errors_name_the_problem(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={tmp_path}",
                           f"--export_base={tmp_path / 'out'}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "not a fine-tuning run" in proc.stderr


def test_versions_are_immutable(base, exported):
    from serving.saved_model_io import save_version

    with pytest.raises(FileExistsError, match="immutable"):
        save_version(tf.Module(), {}, str(base), "sst2", version=1)
