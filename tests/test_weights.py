"""Weight import/export: parity with transformers' PyTorch OpenAIGPT, and the GPT-1 release format."""

import json
import math

import keras
import numpy as np
import pytest

from gpt_tf.convert import release, state_dicts
from gpt_tf.config import GPTConfig, get_size
from gpt_tf.gpt1.backbone import token_inputs
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.nn.layers import gelu

SMALL = GPTConfig(vocab_size=500, n_ctx=32, n_embd=64, n_layer=2, n_head=4, d_ff=256)
# Our logits against transformers': two frameworks' kernels, compared within a tolerance. Measured on an AMD Zen 4,
# oneDNN's rewrites on and off: at most 1.9e-6 (init_std 0.2, logits std 1.65) and 3.4e-6 at GPT-1's size.
TOL = 2e-5
# Weights themselves are compared bit for bit (assert_array_equal): loading and saving copy float32 values, with no
# arithmetic, so they are exact on every CPU.
# Per-block release layout, written out independently of gpt_tf.convert:
# (release array shape given d/f, function from a block to the Keras variable).
BLOCK_LAYOUT = [
    (lambda d, f: [1, d, 3 * d], lambda b: b.attn.c_attn.w),
    (lambda d, f: [3 * d], lambda b: b.attn.c_attn.b),
    (lambda d, f: [1, d, d], lambda b: b.attn.c_proj.w),
    (lambda d, f: [d], lambda b: b.attn.c_proj.b),
    (lambda d, f: [d], lambda b: b.ln_1.gamma),
    (lambda d, f: [d], lambda b: b.ln_1.beta),
    (lambda d, f: [1, d, f], lambda b: b.mlp.c_fc.w),
    (lambda d, f: [f], lambda b: b.mlp.c_fc.b),
    (lambda d, f: [1, f, d], lambda b: b.mlp.c_proj.w),
    (lambda d, f: [d], lambda b: b.mlp.c_proj.b),
    (lambda d, f: [d], lambda b: b.ln_2.gamma),
    (lambda d, f: [d], lambda b: b.ln_2.beta),
]


def _np(x):
    return np.asarray(x.numpy() if hasattr(x, "numpy") else keras.ops.convert_to_numpy(x))


def _fresh(config=SMALL, seed=0):
    keras.utils.set_random_seed(seed)
    return causal_lm_for(config)


def _snapshot(model):
    return [_np(v).copy() for v in model.weights]


def _read_release(directory, shapes, n_shards=10):
    """The reference reader from openai/finetune-transformer-lm train.py."""
    params = [np.load(directory / f"params_{n}.npy") for n in range(n_shards)]
    offsets = np.cumsum([np.prod(shape) for shape in shapes])
    params = np.split(np.concatenate(params, 0), offsets)[:-1]
    return [p.reshape(s) for p, s in zip(params, shapes)]


def _write_release(directory, arrays, n_shards=10):
    """Writes arrays in the release layout, independently of gpt_tf.convert."""
    directory.mkdir(parents=True, exist_ok=True)
    flat = np.concatenate([a.reshape(-1) for a in arrays], 0).astype(np.float32)
    for n, shard in enumerate(np.array_split(flat, n_shards)):
        np.save(directory / f"params_{n}.npy", shard)
    (directory / "params_shapes.json").write_text(json.dumps([list(a.shape) for a in arrays]))


def _random_release(config, n_ctx_release, seed=1):
    rng = np.random.default_rng(seed)
    d, f = config.n_embd, config.d_ff
    shapes = [[n_ctx_release, d], [config.vocab_size, d]]
    shapes += [shape(d, f) for _ in range(config.n_layer) for shape, _ in BLOCK_LAYOUT]
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gpt1_model():
    """The paper-sized model (~117M parameters), built once."""
    return _fresh(get_size("gpt1"))


@pytest.fixture(scope="module")
def hf():
    """transformers' PyTorch OpenAIGPT, the reference implementation."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(2)
    return torch, transformers


def _hf_model(hf, config, init_std, seed=0):
    torch, transformers = hf
    torch.manual_seed(seed)
    hf_config = transformers.OpenAIGPTConfig(
        vocab_size=config.vocab_size, n_positions=config.n_ctx, n_embd=config.n_embd, n_layer=config.n_layer,
        n_head=config.n_head, afn="gelu", layer_norm_epsilon=config.layer_norm_epsilon, initializer_range=init_std,
    )
    model = transformers.OpenAIGPTLMHeadModel(hf_config).float().eval()
    with torch.no_grad():  # make biases and LN gains/shifts non-trivial
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model


def _hf_logits(hf, model, ids):
    torch, _ = hf
    with torch.no_grad():
        return model(torch.from_numpy(ids)).logits.numpy()


# ----------------------------------------------------------------------------- parity with transformers


def test_hf_gelu_is_the_tanh_approximation(hf):
    torch, transformers = hf
    from transformers.models.openai import modeling_openai

    x = np.linspace(-6, 6, 2001, dtype=np.float32)
    theirs = modeling_openai.ACT_FNS["gelu"](torch.from_numpy(x)).numpy()
    exact = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(theirs, _np(gelu(x)), atol=1e-6)
    assert np.abs(theirs - exact).max() > 1e-4  # i.e. it is not the erf GELU


@pytest.mark.parametrize("init_std", [0.02, 0.2])
def test_logits_match_transformers(hf, init_std):
    reference = _hf_model(hf, SMALL, init_std)
    ours = _fresh()
    state_dicts.load_hf_state_dict(ours, reference.state_dict())
    ids = np.random.default_rng(0).integers(0, SMALL.vocab_size, (3, SMALL.n_ctx))
    expected = _hf_logits(hf, reference, ids)
    got = _np(ours(token_inputs(ids), training=False))
    assert got.shape == (3, SMALL.n_ctx, SMALL.total_vocab)
    diff = np.abs(got[..., : SMALL.vocab_size] - expected).max()
    print(f"parity init_std={init_std}: max |diff| = {diff:.3g}, logits std = {expected.std():.3g}")
    assert diff <= TOL
    assert expected.std() > 100 * TOL  # the comparison is not trivially small


def test_parity_check_detects_swapped_query_key(hf):
    """A loader that mixed up the fused Q/K/V order would fail the parity test."""
    torch, _ = hf
    reference = _hf_model(hf, SMALL, 0.2)
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    d = SMALL.n_embd
    for i in range(SMALL.n_layer):
        w = state[f"transformer.h.{i}.attn.c_attn.weight"]
        state[f"transformer.h.{i}.attn.c_attn.weight"] = torch.cat([w[:, d : 2 * d], w[:, :d], w[:, 2 * d :]], 1)
    ours = _fresh()
    state_dicts.load_hf_state_dict(ours, state)
    ids = np.random.default_rng(1).integers(0, SMALL.vocab_size, (2, SMALL.n_ctx))
    diff = np.abs(_np(ours(token_inputs(ids)))[..., : SMALL.vocab_size] - _hf_logits(hf, reference, ids)).max()
    assert diff > 10 * TOL


def test_gpt1_size_exports_to_transformers(hf, gpt1_model):
    """Full paper size, other direction: our weights → to_hf_state_dict → HF model, same logits."""
    torch, transformers = hf
    reference = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig(afn="gelu")).float().eval()
    state = {k: torch.from_numpy(v) for k, v in state_dicts.to_hf_state_dict(gpt1_model).items()}
    reference.load_state_dict(state, strict=True)
    config = gpt1_model.backbone.config
    ids = np.random.default_rng(2).integers(0, config.vocab_size, (2, 16))
    diff = np.abs(_np(gpt1_model(token_inputs(ids)))[..., : config.vocab_size] - _hf_logits(hf, reference, ids)).max()
    print(f"parity gpt1 size: max |diff| = {diff:.3g}")
    assert diff <= TOL


# ----------------------------------------------------------------------------- Hugging Face state dicts


def test_hf_round_trip_without_prefix_keeps_special_rows():
    source, target = _fresh(seed=0), _fresh(seed=1)
    special_before = _np(target.backbone.embed.tokens_embed)[SMALL.vocab_size :].copy()
    state = state_dicts.to_hf_state_dict(source, prefix="", lm_head=False)
    assert "tokens_embed.weight" in state and "lm_head.weight" not in state
    assert state["h.1.attn.c_attn.weight"].shape == (SMALL.n_embd, 3 * SMALL.n_embd)
    state_dicts.load_hf_state_dict(target, state)
    tokens = _np(target.backbone.embed.tokens_embed)
    np.testing.assert_array_equal(tokens[SMALL.vocab_size :], special_before)
    np.testing.assert_array_equal(tokens[: SMALL.vocab_size], state["tokens_embed.weight"])
    np.testing.assert_array_equal(_np(target.backbone.blocks[1].ln_2.beta), state["h.1.ln_2.bias"])


def test_hf_round_trip_with_special_rows():
    source, target = _fresh(seed=0), _fresh(seed=1)
    state_dicts.load_hf_state_dict(target, state_dicts.to_hf_state_dict(source, include_special=True))
    for a, b in zip(_snapshot(source), _snapshot(target)):
        np.testing.assert_array_equal(a, b)


def test_hf_missing_and_unexpected_keys_are_named():
    model = _fresh()
    state = state_dicts.to_hf_state_dict(model)
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.0.attn.bias"] = np.ones((1, 1, 32, 32), np.float32)  # causal-mask buffer: ignored
    state["multiple_choice_head.summary.weight"] = np.zeros((1, 64), np.float32)
    with pytest.raises(KeyError) as err:
        state_dicts.load_hf_state_dict(model, state)
    assert "h.1.mlp.c_fc.bias" in str(err.value) and "missing" in str(err.value)
    assert "multiple_choice_head.summary.weight" in str(err.value) and "unexpected" in str(err.value)
    assert "h.0.attn.bias" not in str(err.value)


def test_hf_shape_mismatch_and_untied_head_are_rejected():
    model = _fresh()
    before = _snapshot(model)
    state = state_dicts.to_hf_state_dict(_fresh(seed=3))
    bad = dict(state, **{"transformer.h.0.attn.c_proj.weight": np.zeros((64, 65), np.float32)})
    with pytest.raises(ValueError, match=r"h\.0\.attn\.c_proj\.weight has shape \[64, 65\]; expected \[64, 64\]"):
        state_dicts.load_hf_state_dict(model, bad)
    untied = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match="lm_head.weight differs from tokens_embed.weight"):
        state_dicts.load_hf_state_dict(model, untied)
    short = dict(state, **{"transformer.positions_embed.weight": np.zeros((16, 64), np.float32)})
    with pytest.raises(ValueError, match=r"positions_embed.weight has shape \[16, 64\]"):
        state_dicts.load_hf_state_dict(model, short)
    for a, b in zip(before, _snapshot(model)):  # failed loads leave the model untouched
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- release format


def test_gpt1_preset_writes_the_released_layout(gpt1_model, shared_data, tmp_path):
    released = json.loads((shared_data / "gpt1_bpe" / "params_shapes.json").read_text())
    paths = release.save_gpt1_release(gpt1_model, tmp_path)
    assert [p.name for p in paths] == [f"params_{n}.npy" for n in range(10)] + ["params_shapes.json"]
    assert json.loads((tmp_path / "params_shapes.json").read_text()) == released
    assert release.release_shapes(gpt1_model.backbone.config) == released
    arrays = _read_release(tmp_path, released)
    blocks = gpt1_model.backbone.blocks
    np.testing.assert_array_equal(arrays[0], _np(gpt1_model.backbone.embed.positions_embed))
    np.testing.assert_array_equal(arrays[1], _np(gpt1_model.backbone.embed.tokens_embed)[:40478])
    np.testing.assert_array_equal(arrays[2 + 5 * 12][0], _np(blocks[5].attn.c_attn.w))
    np.testing.assert_array_equal(arrays[-2], _np(blocks[11].ln_2.gamma))


def test_release_round_trip_into_a_fresh_model(tmp_path):
    source, target = _fresh(seed=0), _fresh(seed=1)
    special_before = _np(target.backbone.embed.tokens_embed)[SMALL.vocab_size :].copy()
    release.save_gpt1_release(source, tmp_path, n_shards=3)
    release.load_gpt1_release(target, tmp_path, n_shards=3)
    for variable, a, b in zip(source.weights, _snapshot(source), _snapshot(target)):
        if variable is source.backbone.embed.tokens_embed:
            np.testing.assert_array_equal(a[: SMALL.vocab_size], b[: SMALL.vocab_size])
            np.testing.assert_array_equal(b[SMALL.vocab_size :], special_before)  # specials keep their init
        else:
            np.testing.assert_array_equal(a, b, err_msg=variable.path)


def test_independently_written_shards_land_in_place(tmp_path):
    arrays = _random_release(SMALL, n_ctx_release=48)  # longer position table than the model
    _write_release(tmp_path / "shards", arrays)
    shapes_dir = tmp_path / "elsewhere"
    shapes_dir.mkdir()
    (tmp_path / "shards" / "params_shapes.json").rename(shapes_dir / "shapes.json")
    model = _fresh()
    release.load_gpt1_release(model, tmp_path / "shards", shapes_path=shapes_dir / "shapes.json")
    embed = model.backbone.embed
    np.testing.assert_array_equal(_np(embed.positions_embed), arrays[0][: SMALL.n_ctx])
    np.testing.assert_array_equal(_np(embed.tokens_embed)[: SMALL.vocab_size], arrays[1])
    for i, block in enumerate(model.backbone.blocks):
        for j, (_, variable_of) in enumerate(BLOCK_LAYOUT):
            expected = arrays[2 + 12 * i + j]
            np.testing.assert_array_equal(_np(variable_of(block)), expected[0] if expected.ndim == 3 else expected)
    np.testing.assert_array_equal(_np(model.backbone.blocks[1].ln_2.gamma), arrays[2 + 12 + 10])


def test_release_shape_errors_name_index_shapes_and_file(tmp_path):
    arrays = _random_release(SMALL, n_ctx_release=SMALL.n_ctx)
    arrays[5] = np.zeros((63,), np.float32)  # layer 0 attn c_proj bias
    _write_release(tmp_path, arrays)
    model = _fresh()
    before = _snapshot(model)
    with pytest.raises(ValueError) as err:
        release.load_gpt1_release(model, tmp_path)
    message = str(err.value)
    assert "array 5" in message and "[63]" in message and "[64]" in message and "params_shapes.json" in message
    for a, b in zip(before, _snapshot(model)):
        np.testing.assert_array_equal(a, b)


def test_release_count_size_and_context_errors(tmp_path):
    model = _fresh()
    arrays = _random_release(SMALL, n_ctx_release=SMALL.n_ctx)
    _write_release(tmp_path / "few", arrays[:-12])
    with pytest.raises(ValueError, match=r"lists 14 arrays, but a model with n_layer=2 needs 26"):
        release.load_gpt1_release(model, tmp_path / "few")
    _write_release(tmp_path / "short_ctx", _random_release(SMALL, n_ctx_release=16))
    with pytest.raises(ValueError, match=r"array 0 .* has shape \[16, 64\]; expected \[>= n_ctx=32, 64\]"):
        release.load_gpt1_release(model, tmp_path / "short_ctx")
    _write_release(tmp_path / "truncated", arrays)
    np.save(tmp_path / "truncated" / "params_9.npy", np.load(tmp_path / "truncated" / "params_9.npy")[:-1])
    with pytest.raises(ValueError, match=r"hold \d+ values in all"):
        release.load_gpt1_release(model, tmp_path / "truncated")


def test_missing_shard_and_shapes_file_are_named(tmp_path):
    _write_release(tmp_path, _random_release(SMALL, n_ctx_release=SMALL.n_ctx))
    (tmp_path / "params_3.npy").unlink()
    model = _fresh()
    with pytest.raises(FileNotFoundError, match=r"params_3\.npy"):
        release.load_gpt1_release(model, tmp_path)
    (tmp_path / "params_shapes.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"params_shapes\.json"):
        release.load_gpt1_release(model, tmp_path)
