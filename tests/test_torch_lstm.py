"""Table 5's LSTM in PyTorch (tools/torch_pretrain/lstm_model.py) is gpt_tf's LSTM baseline.

On the same (random) weights the converted Keras model (``gpt_tf.convert.state_dicts.load_torch_lstm``) gives the
torch model's logits; the torch model is initialised by the Keras model's rules; its second bias stays out of
training. Training, pieces and the import into a run folder: tests/test_torch_pretrain.py.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def token_inputs(ids):
    """keras-hub's model inputs of token ids (``gpt_tf.gpt1.backbone.token_inputs``)."""
    from gpt_tf.gpt1.backbone import token_inputs as inputs

    return inputs(ids)


def keras_lm(vocab_size, n_ctx, n_embd, d_ff, n_layer=1):
    from gpt_tf.config import get_size
    from gpt_tf.gpt1.build import causal_lm_for

    config = get_size("lstm_test", vocab_size=vocab_size, n_ctx=n_ctx, n_embd=n_embd, d_ff=d_ff, n_layer=n_layer,
                        embd_pdrop=0.0, resid_pdrop=0.0)
    return causal_lm_for(config)


@pytest.mark.parametrize("d_ff,n_layer", [(48, 2), (32, 1)])  # a projection back to n_embd; none (d_ff == n_embd)
def test_converted_keras_model_gives_the_torch_logits(d_ff, n_layer):
    from gpt_tf.convert.state_dicts import load_torch_lstm
    from tools.torch_pretrain.lstm_model import LSTMLanguageModel

    vocab, n_ctx, n_embd = 50, 16, 32
    torch.manual_seed(0)
    theirs = LSTMLanguageModel(vocab, n_ctx, n_embd, n_layer, d_ff, dropout=0.0).eval()
    with torch.no_grad():  # every weight random, both biases too: the gate order and the bias sum must be right
        for name, p in theirs.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "lstm" in name else 0.1))
    ours = keras_lm(vocab, n_ctx, n_embd, d_ff, n_layer)
    load_torch_lstm(ours, theirs.state_dict())
    ids = np.random.default_rng(0).integers(0, vocab, (3, n_ctx))
    with torch.no_grad():
        expected = theirs(torch.from_numpy(ids)).numpy()
    got = np.asarray(ours(token_inputs(ids.astype(np.int32))))
    assert got.shape == (3, n_ctx, ours.backbone.config.total_vocab)
    np.testing.assert_allclose(got[..., :vocab], expected, atol=1e-5, rtol=1e-5)
    # A shorter input (fine-tuning's views) and the converted weights' layout, spelled out.
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(ours(token_inputs(ids[:, :5].astype(np.int32))))[..., :vocab],
                                   theirs(torch.from_numpy(ids[:, :5])).numpy(), atol=1e-5, rtol=1e-5)
    cell, lstm = ours.backbone.blocks[0].lstm.cell, theirs.h[0].lstm
    np.testing.assert_array_equal(np.asarray(cell.kernel), lstm.weight_ih_l0.detach().numpy().T)  # a copy: exact
    np.testing.assert_allclose(np.asarray(cell.bias), (lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().numpy(), rtol=1e-6)


def test_a_wrong_state_dict_is_refused_before_anything_is_assigned():
    from gpt_tf.convert.state_dicts import load_torch_lstm
    from tools.torch_pretrain.lstm_model import LSTMLanguageModel

    ours = keras_lm(50, 16, 32, 48)
    before = np.asarray(ours.backbone.embed.tokens_embed).copy()
    state = LSTMLanguageModel(50, 16, 32, 1, 48).state_dict()
    with pytest.raises(ValueError, match="lacks"):
        load_torch_lstm(ours, {k: v for k, v in state.items() if "bias_hh" not in k})
    with pytest.raises(ValueError, match="does not"):
        load_torch_lstm(ours, {**state, "h.1.lstm.weight_ih_l0": state["h.0.lstm.weight_ih_l0"]})
    with pytest.raises(ValueError, match="weight_hh_l0 gives shape"):
        load_torch_lstm(ours, {**state, "h.0.lstm.weight_hh_l0": state["h.0.lstm.weight_hh_l0"][:, :-1]})
    np.testing.assert_array_equal(np.asarray(ours.backbone.embed.tokens_embed), before)


def test_init_follows_the_keras_models_rules():
    """Glorot-uniform kernel (over the whole [n_embd, 4 d_ff]), orthogonal recurrent kernel, forget-gate bias 1,
    N(0, 0.02) projection and embeddings: the torch model's statistics are the Keras model's."""
    from tools.torch_pretrain.lstm_model import LSTMLanguageModel
    from tools.torch_pretrain.train import param_groups

    vocab, n_embd, units = 500, 64, 96
    torch.manual_seed(0)
    theirs = LSTMLanguageModel(vocab, 32, n_embd, 1, units)
    ours = keras_lm(vocab, 32, n_embd, units)
    lstm, cell, proj = theirs.h[0].lstm, ours.backbone.blocks[0].lstm.cell, ours.backbone.blocks[0].proj
    limit = np.sqrt(6.0 / (n_embd + 4 * units))
    for kernel in (lstm.weight_ih_l0.detach().numpy().T, np.asarray(cell.kernel)):
        assert kernel.shape == (n_embd, 4 * units)
        # float32 draws of U(-limit, limit): the bound itself rounds to float32, a draw may land within an ulp of it
        assert np.abs(kernel).max() <= limit * (1 + 1e-6) and np.abs(kernel).max() > 0.99 * limit
        assert np.std(kernel) == pytest.approx(limit / np.sqrt(3), rel=0.03)
    for recurrent in (lstm.weight_hh_l0.detach().numpy().T, np.asarray(cell.recurrent_kernel)):
        assert recurrent.shape == (units, 4 * units)  # orthonormal rows, as Keras's Orthogonal makes them
        np.testing.assert_allclose(recurrent @ recurrent.T, np.eye(units), atol=1e-5)
    forget = np.zeros(4 * units, np.float32)
    forget[units:2 * units] = 1.0
    # initial values of exactly 0 and 1, and sums of such values: bit for bit on every CPU
    np.testing.assert_array_equal(np.asarray(cell.bias), forget)
    np.testing.assert_array_equal((lstm.bias_ih_l0 + lstm.bias_hh_l0).detach().numpy(), forget)
    for torch_table, keras_table in ((theirs.tokens_embed.weight, ours.backbone.embed.tokens_embed),
                                     (theirs.positions_embed.weight, ours.backbone.embed.positions_embed),
                                     (theirs.h[0].proj.weight, proj.w)):
        for table in (torch_table.detach().numpy(), np.asarray(keras_table)):
            assert np.std(table) == pytest.approx(0.02, rel=0.1) and abs(np.mean(table)) < 0.002
    assert not theirs.h[0].proj.bias.detach().numpy().any() and not np.asarray(proj.b).any()
    # One trained bias, as Keras's: bias_hh is frozen at 0 and out of the optimizer (and its decay).
    assert not lstm.bias_hh_l0.requires_grad
    groups = param_groups(theirs, 0.01)
    trained = {id(p) for g in groups for p in g["params"]}
    assert id(lstm.bias_hh_l0) not in trained and id(lstm.bias_ih_l0) in trained
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in theirs.parameters() if p.ndim >= 2}
