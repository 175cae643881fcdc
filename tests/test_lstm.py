"""The LSTM baseline (Table 5) in the transformer's framework: config, LM, task heads, layer transfer, fine-tuning.

Pre-training the LSTM through ``python -m gpt_tf.train --model=lstm_test`` is exercised end to end in
``tests/test_zero_shot.py``; here the pieces run in process, and ``Finetuner`` fine-tunes an LSTM LM
checkpoint on real SST-2 rows tokenized with GPT-1's BPE.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from gpt_tf.config import GPTConfig, get_size
from gpt_tf.training.task_objective import FinetuneConfig, Finetuner
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.gpt1.build import backbone_for, causal_lm_for
from gpt_tf.gpt1.lstm import LSTMBackbone
from gpt_tf.gpt1.text_classifier import task_for_spec
from gpt_tf.nn.transfer import transfer_layers
from gpt_tf.tasks import get_task
from gpt_tf.runs.checkpoints import variables_by_key
from gpt_tf.data.transforms import load_task_spec

CONFIG = get_size("lstm_test")


def _lm(config=CONFIG, seed=0):
    keras.utils.set_random_seed(seed)
    return causal_lm_for(config)


def test_config_type_and_parameter_count():
    lm = _lm()
    assert isinstance(lm.backbone, LSTMBackbone) and len(lm.backbone.blocks) == 1
    assert sum(int(np.prod(v.shape)) for v in lm.trainable_variables) == CONFIG.n_params
    assert GPTConfig(**json.loads(json.dumps(CONFIG.to_dict()))) == CONFIG
    old = {k: v for k, v in get_size("test").to_dict().items() if k != "model_type"}  # a run from before the field
    assert GPTConfig(**old).model_type == "gpt"
    with pytest.raises(ValueError, match="model_type='rnn' is not one of"):
        CONFIG.replace(model_type="rnn")
    for name in ("lstm_tiny", "lstm_small"):  # sized to the transformer size's blocks (within 2%)
        lstm, gpt = get_size(name), get_size(name[len("lstm_"):])
        embeddings = lambda c: c.total_vocab * c.n_embd + c.n_ctx * c.n_embd
        assert lstm.n_embd == gpt.n_embd
        assert abs((lstm.n_params - embeddings(lstm)) / (gpt.n_params - embeddings(gpt)) - 1) < 0.02


def test_lm_is_causal_and_tied():
    lm = _lm()
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 20))
    logits = np.asarray(lm(token_inputs(ids)))
    changed = ids.copy()
    changed[:, 12:] = 3
    np.testing.assert_allclose(np.asarray(lm(token_inputs(changed)))[:, :12], logits[:, :12], atol=1e-6)
    states = lm.backbone(token_inputs(ids))
    np.testing.assert_allclose(np.asarray(lm.backbone.embed.logits(states)), logits, atol=1e-5)
    assert logits.shape == (2, 20, CONFIG.total_vocab)


@pytest.mark.parametrize("task, views", [("sst2", 1), ("story_cloze", 2), ("stsb", 2)])
def test_task_heads_run_on_the_lstm(task, views):
    """The task graph on the LSTM: outside training the last block's output is taken at the extract tokens; in
    training (λ > 0) the block runs at every position for L1, the tied LM head's per-view mean cross-entropy of the
    real next tokens: the same outputs, and L1 as computed from the backbone's states."""
    quiet = CONFIG.replace(embd_pdrop=0.0, resid_pdrop=0.0, attn_pdrop=0.0)  # a training call without dropout
    backbone = backbone_for(quiet)
    model = task_for_spec(backbone, get_task(task), dropout=0.0, lm_coef=0.5)
    ids = np.random.default_rng(1).integers(0, CONFIG.vocab_size, (3, views, 16)).astype("int32")
    weights = np.zeros((3, views, 16), "float32")
    weights[..., :9] = 1.0  # targets 1..9 real; the extract token at 9
    weights[0, -1, 5:] = 0.0  # a shorter view
    feats = {"input_ids": ids, "extract_index": np.full((3, views), 9, "int32"), "lm_weights": weights}
    out = np.asarray(model(feats))
    expected = {"sst2": (3, 2), "story_cloze": (3, 2), "stsb": (3,)}[task]
    assert out.shape == expected
    np.testing.assert_allclose(np.asarray(model(feats, training=True)), out, atol=1e-5)
    assert len(model.losses) == 1
    rows = ids.reshape(-1, 16)
    logits = np.asarray(backbone.embed.logits(backbone(token_inputs(rows))), np.float64)[:, :-1]
    assert logits.shape[-1] == CONFIG.total_vocab
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ce = logz - np.take_along_axis(logits, rows[:, 1:, None], -1)[..., 0]
    w = weights.reshape(-1, 16)[:, :-1]
    np.testing.assert_allclose(float(model.losses[0]), 0.5 * ((ce * w).sum(-1) / w.sum(-1)).mean(), rtol=1e-5)


def test_layer_transfer_between_lstms_and_only_embeddings_from_a_transformer():
    src, dst = _lm(seed=1), backbone_for(CONFIG.replace(n_ctx=16))
    transfer_layers(src, dst, 1)  # copies: bit for bit on every CPU
    for a, b in zip(src.backbone.blocks[0].weights, dst.blocks[0].weights):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    gpt = _lm(get_size("test"))
    transfer_layers(gpt, dst, 0)  # embeddings only: same vocabulary and width
    np.testing.assert_array_equal(np.asarray(gpt.backbone.embed.tokens_embed), np.asarray(dst.embed.tokens_embed))
    with pytest.raises(ValueError, match="block 0: source and destination weight shapes differ"):
        transfer_layers(gpt, dst, 1)


def test_finetuner_fine_tunes_an_lstm_checkpoint(shared_data, tmp_path):
    from pipelines.finetune_data import build_task_data

    bpe = shared_data / "gpt1_bpe"
    data = tmp_path / "sst2"
    build_task_data("sst2", shared_data / "glue" / "SST-2", bpe, data, max_examples=16, show_progress=False)
    config = get_size("lstm_test", vocab_size=40478)
    lm, run = _lm(config, seed=2), tmp_path / "lm"
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=variables_by_key(lm.variables)), run / "checkpoints", 1)
    manager.save(checkpoint_number=1)
    (run / "model_config.json").write_text(json.dumps(config.to_dict()))
    messages = []
    tuner = Finetuner(load_task_spec(data), config, FinetuneConfig(data_dir=str(data), run_dir=str(tmp_path / "ft"),
                      init_checkpoint=str(run), batch_size=8, epochs=1), tf.distribute.get_strategy(), log=messages.append)
    assert "embeddings + 1 of 1 blocks" in messages[0]
    # a copy: bit for bit on every CPU
    np.testing.assert_array_equal(np.asarray(tuner.model.backbone.blocks[0].lstm.weights[0]),
                                  np.asarray(lm.backbone.blocks[0].lstm.weights[0]))
    results = tuner.train(progress=False)
    assert results["dev"]["examples"] == 16 and 0.0 <= results["dev"]["accuracy"] <= 1.0
