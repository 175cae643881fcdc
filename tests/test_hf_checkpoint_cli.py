"""GPT-1 as ``transformers`` publishes it, through the command lines, offline: ``python -m gpt_tf.convert --hf=hf://...``
(a Hugging Face cache filled here, ``HF_HUB_OFFLINE=1``) writes a preset with a model card and the checkpoint's
logits, ``python -m gpt_tf.train --init_checkpoint=hf://...`` fine-tunes from the checkpoint (SST-2 tokenized with
GPT-1's BPE), ``python -m serving.export`` exports the classifier, and a broken checkpoint is one line.

The checkpoint: a seeded random ``OpenAIGPTLMHeadModel`` of a small shape (2 blocks of 32 dims, 64 positions) with
GPT-1's 40,478 BPE rows (``tests/offline_hubs.py``'s ``write_checkpoint``; the library's tests:
``tests/test_hf_checkpoint.py``).
"""

from __future__ import annotations

import json
import shutil
import urllib.request

import numpy as np
import pytest

from tests.offline_hubs import GPT1_BPE, GPT1_BPE_TOKENS as V, HF_REPO, backbone_weights, cached_checkpoint, hub_env
from tests.offline_hubs import transformers_logits
from tests.small_runs import run_cli, run_clis, start_server, stop_servers

HANDLE = f"hf://{HF_REPO}"
TEXT = "the man walked into the room and sat down ."


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """The small checkpoint, and an HF_HOME whose cache holds it as ``hf://{HF_REPO}``."""
    return cached_checkpoint(tmp_path_factory.mktemp("hf_cli"))


def test_the_command_lines_convert_fine_tune_from_and_export_the_hf_checkpoint(small, shared_data, tmp_path):
    """``gpt_tf.convert --hf=hf://...`` (the cache, offline) writes a preset with a model card and the checkpoint's
    logits; ``gpt_tf.train --init_checkpoint=hf://...`` fine-tunes from it (SST-2 tokenized with GPT-1's BPE; updates
    of learning rate 0 keep its weights); ``serving.export`` exports the classifier."""
    import keras_hub
    from pipelines import finetune_data as fd

    import gpt_tf
    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    fd.build_task_data("sst2", shared_data / "glue" / "SST-2", GPT1_BPE, tmp_path / "sst2", max_examples=16,
                       show_progress=False)
    env = hub_env(small["hf_home"])
    flags = ["--task=sst2", f"--data_dir={tmp_path / 'sst2'}", f"--init_checkpoint={HANDLE}", "--n_ctx=32",
             "--batch_size=8", "--epochs=1", "--seed=1", "--progress=false", "--learning_rate=0", "--weight_decay=0",
             f"--run_dir={tmp_path / 'ft'}"]
    convert, train = run_clis(("gpt_tf.convert", f"--hf={HANDLE}", f"--preset_dir={tmp_path / 'preset'}"),
                              ("gpt_tf.train", *flags), env=env)
    assert f"initialised from {HANDLE}" in train.stderr, train.stderr[-2000:]
    card = (tmp_path / "preset" / "README.md").read_text()
    assert "license: mit" in card and f"--hf={HANDLE}" in card and "| 40,478 | 4 |" in card, card
    ids = np.random.default_rng(0).integers(0, V, (2, 16)).astype("int32")
    preset_lm = gpt_tf.GPT1CausalLM.from_preset(str(tmp_path / "preset"))
    assert type(keras_hub.models.CausalLM.from_preset(str(tmp_path / "preset"))) is gpt_tf.GPT1CausalLM
    np.testing.assert_allclose(np.asarray(preset_lm(token_inputs(ids)))[..., :V],
                               transformers_logits(small["safetensors"], ids), rtol=0, atol=1e-5)
    ids_of = lambda tokenizer: np.asarray(tokenizer(TEXT)).tolist()  # noqa: E731
    assert ids_of(preset_lm.preprocessor.tokenizer) == ids_of(gpt_tf.GPT1Tokenizer(str(GPT1_BPE)))
    model, _ = load_task_model(RunFolder.open(str(tmp_path / "ft")))
    tuned, start = backbone_weights(model), backbone_weights(preset_lm)
    np.testing.assert_array_equal(tuned[0][:V], start[0][:V])  # the special rows: drawn again from --seed
    np.testing.assert_array_equal(tuned[1], start[1][:32])  # --n_ctx=32: the first position rows
    for a, b in zip(tuned[2:], start[2:]):
        np.testing.assert_array_equal(a, b)
    run_cli("serving.export", f"--run_dir={tmp_path / 'ft'}", f"--export_base={tmp_path / 'exported'}", timeout=600)
    assert (tmp_path / "exported" / "sst2" / "1" / "saved_model.pb").is_file()
    # The server answers it, over TF Serving's REST API.
    server = start_server(tmp_path / "server.log", "--model_name=sst2",
                          f"--model_base_path={tmp_path / 'exported' / 'sst2'}")
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{server.ports[1]}/v1/models/sst2:predict",
                                         data=json.dumps({"instances": [{"sentence": TEXT}]}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as answer:
            prediction, = json.loads(answer.read())["predictions"]
    finally:
        stop_servers(server)
    assert abs(sum(prediction["probabilities"]) - 1) < 1e-5, prediction


def test_the_convert_command_says_what_is_wrong_in_one_line(small, tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(small["safetensors"], folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    proc = run_cli("gpt_tf.convert", f"--hf={folder}", f"--preset_dir={tmp_path / 'preset'}", check=False)
    assert proc.returncode != 0 and not (tmp_path / "preset").exists()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"gpt_tf.convert: {folder / 'config.json'}: model_type is 'gpt2'"), proc.stderr[-2000:]
