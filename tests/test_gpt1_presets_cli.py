"""GPT-1 presets through the command lines, end to end: a pre-training run and a fine-tuning run convert to
presets with ``python -m gpt_tf.convert`` (a subprocess, as a user runs it) whose models give the runs'
logits, ``python -m gpt_tf.train --init_checkpoint=<preset>`` (a folder, or a shipped preset's name) continues
pre-training and fine-tunes from one, starting from the preset's weights, and ``python -m serving.export
--preset`` exports one as it exports the run it was written from.

Runs: the ``test`` shape on books_tiny's 8k BPE, n_ctx 32, a few updates on slices of two real books and of SST-2.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.small_runs import BASE_FLAGS, ROOT, TWO_PATHS, build_data, run_clis

BPE = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en" / "assets" / "tokenizer"
TEXTS = ["a gripping , beautifully acted film .", "a dull mess", "it is what it is , no more and no less ."]
PRETRAIN = [f for f in BASE_FLAGS if not f.startswith("--model=")]  # the model: --model's or --init_checkpoint's
FINETUNE = ["--task=sst2", "--batch_size=8", "--epochs=1", "--seed=1", "--progress=false", "--json", "--deterministic"]
FROZEN = ["--learning_rate=0", "--weight_decay=0"]  # updates that leave every weight where it started


@pytest.fixture(scope="module")
def runs(shared_data, tmp_path_factory):
    """A 3-update pre-training run and a 2-update fine-tuning run (from scratch), each converted to a preset by
    the CLI: ``<root>/{lm,ft}`` and ``<root>/{lm,ft}_preset``; their data in ``<root>/{data,sst2}``."""
    from pipelines import finetune_data as fd

    root = tmp_path_factory.mktemp("gpt1_cli")
    data = build_data(shared_data, root, tokenizer=BPE)
    fd.build_task_data("sst2", shared_data / "glue" / "SST-2", BPE, root / "sst2", max_examples=16, show_progress=False)
    run_clis(("gpt_tf.train", *PRETRAIN, "--model=test", f"--data_dir={data}", "--train_steps=3",
              "--checkpoint_every=3", f"--run_dir={root / 'lm'}"),
             ("gpt_tf.train", *FINETUNE, "--model=test", "--n_ctx=32", f"--data_dir={root / 'sst2'}",
              f"--run_dir={root / 'ft'}"))
    run_clis(("gpt_tf.convert", f"--run_dir={root / 'lm'}", f"--preset_dir={root / 'lm_preset'}"),
             ("gpt_tf.convert", f"--run_dir={root / 'ft'}", f"--preset_dir={root / 'ft_preset'}"))
    return root


def _lm(path):
    """The ``GPT1CausalLM`` of a run, a checkpoint or a preset, restored by the core (no keras-hub)."""
    from gpt_tf.convert.pretrained import pretrained_model_config, restore_pretrained_lm
    from gpt_tf.gpt1.build import causal_lm_for

    lm = causal_lm_for(pretrained_model_config(str(path)))
    restore_pretrained_lm(lm, str(path))
    return lm


def test_a_pretraining_run_converts_by_the_cli_to_a_preset_with_the_runs_logits(runs):
    import keras_hub

    from gpt_tf.gpt1.backbone import token_inputs

    preset = str(runs / "lm_preset")
    x = np.array([[5, 6, 7, 8, 9, 10]])
    want = _lm(runs / "lm")(token_inputs(x)).numpy()
    backbone = keras_hub.models.Backbone.from_preset(preset)
    # Bit for bit on every CPU: the preset stores the run's float32 weights exactly, and each model below runs the same
    # eager ops on the same shapes as the reference.
    np.testing.assert_array_equal(backbone.embed.logits(backbone(token_inputs(x))), want)
    causal_lm = keras_hub.models.CausalLM.from_preset(preset)
    assert type(causal_lm).__name__ == "GPT1CausalLM"
    np.testing.assert_array_equal(causal_lm({"token_ids": x, "padding_mask": np.ones_like(x, bool)}), want)
    for name in ("encoder.json", "vocab.bpe"):  # the run's tokenizer, as its data manifest names it
        assert (runs / "lm_preset" / "assets" / "tokenizer" / name).read_bytes() == (BPE / name).read_bytes()


def test_a_finetuning_run_converts_by_the_cli_to_a_task_preset_with_the_runs_logits(runs):
    import keras_hub

    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    model, spec = load_task_model(RunFolder.open(str(runs / "ft")))
    task = keras_hub.models.TextClassifier.from_preset(str(runs / "ft_preset"))
    assert type(task).__name__ == "GPT1TextClassifier" and task.label_names == spec.label_names
    features = task.preprocessor(TEXTS)
    want = model(features).numpy()  # the run's model: its graph, restored by the core
    np.testing.assert_array_equal(task(features).numpy(), want)  # exact weights, the same eager ops: bit for bit
    np.testing.assert_allclose(task.predict(TEXTS, verbose=0), want, **TWO_PATHS)  # the same, traced in a graph


def test_a_state_dict_in_parts_converts_by_the_cli_to_a_preset_with_its_logits(tmp_path):
    """``--state_dict``: ``transformers`` weights saved as ``.npz`` parts, the token table in row blocks (as
    ``tools/torch_pretrain`` brings a GPU run's weights back), become a backbone preset computing what the model
    they came from computes; an LSTM's size is refused by name."""
    import keras
    import keras_hub

    from gpt_tf.config import get_size
    from gpt_tf.convert.state_dicts import ROWS, to_hf_state_dict
    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import causal_lm_for
    from tests.small_runs import run_cli

    keras.utils.set_random_seed(7)
    lm = causal_lm_for(get_size("test", vocab_size=8000, n_ctx=32))
    state = to_hf_state_dict(lm)
    blocks = np.array_split(state.pop("transformer.tokens_embed.weight"), 3)
    np.savez(tmp_path / "part0.npz", **{f"transformer.tokens_embed.weight{ROWS}{i}": b for i, b in enumerate(blocks)})
    np.savez(tmp_path / "part1.npz", **state)
    given = (f"--state_dict={tmp_path / 'part0.npz'},{tmp_path / 'part1.npz'}", "--n_ctx=32", f"--tokenizer_dir={BPE}")
    run_clis(("gpt_tf.convert", *given, "--model=test", f"--preset_dir={tmp_path / 'preset'}"))
    backbone = keras_hub.models.Backbone.from_preset(str(tmp_path / "preset"))
    x = np.array([[5, 6, 7, 8, 9]])
    # the state dict has no special-token rows (they keep the preset's init): the BPE tokens' logits are equal, bit for
    # bit on every CPU (the parts hold the exact float32 values; both sides run the same eager ops on the same shapes)
    np.testing.assert_array_equal(backbone.embed.logits(backbone(token_inputs(x)))[..., :8000],
                                  lm(token_inputs(x))[..., :8000])
    refused = run_cli("gpt_tf.convert", *given, "--model=lstm_test", f"--preset_dir={tmp_path / 'lstm'}", check=False)
    assert refused.returncode == 1 and "--model=lstm_test: a GPT-1 preset holds a transformer, not model_type='lstm'" \
        in refused.stderr, refused.stderr
    assert not (tmp_path / "lstm").exists()


def test_train_continues_pretraining_and_fine_tunes_from_a_preset_starting_at_its_weights(runs, tmp_path):
    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    preset = runs / "lm_preset"
    procs = run_clis(("gpt_tf.train", *PRETRAIN, *FROZEN, f"--init_checkpoint={preset}", f"--data_dir={runs / 'data'}",
                      "--train_steps=2", "--checkpoint_every=2", f"--run_dir={tmp_path / 'lm'}"),
                     ("gpt_tf.train", *FINETUNE, *FROZEN, f"--init_checkpoint={preset}", f"--data_dir={runs / 'sst2'}",
                      f"--run_dir={tmp_path / 'ft'}"))
    assert all(f"initialised from {preset}" in proc.stderr for proc in procs), [p.stderr[-2000:] for p in procs]
    reference = _lm(preset)
    # Its checkpoint after 2 frozen updates: the weights it started from, bit for bit on every CPU (a step of learning
    # rate 0 and weight decay 0 subtracts exactly 0; the rest are copies).
    continued = _lm(tmp_path / "lm")
    assert int(continued.backbone.config.n_ctx) == 32 and len(continued.weights) == len(reference.weights)
    for a, b in zip(continued.weights, reference.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    model, _ = load_task_model(RunFolder.open(str(tmp_path / "ft")))
    tuned = model.backbone.weights
    np.testing.assert_array_equal(tuned[0].numpy()[:8000], reference.backbone.weights[0].numpy()[:8000])  # specials re-drawn
    for a, b in zip(tuned[1:], reference.backbone.weights[1:]):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_train_starts_from_a_shipped_preset_by_its_name(runs, tmp_path):
    """``--init_checkpoint=<a shipped preset's name>`` (as the README's walk-through fine-tunes): continued
    pre-training and fine-tuning start from the shipped folder's weights, its earlier name as its name."""
    from gpt_tf.convert.preset_io import shipped_presets
    from gpt_tf.runs.checkpoints import load_task_model
    from gpt_tf.runs.folder import RunFolder

    procs = run_clis(("gpt_tf.train", *PRETRAIN, *FROZEN, "--init_checkpoint=books_tiny", f"--data_dir={runs / 'data'}",
                      "--train_steps=2", "--checkpoint_every=2", f"--run_dir={tmp_path / 'lm'}"),
                     ("gpt_tf.train", *FINETUNE, *FROZEN, "--init_checkpoint=gpt1_tiny_books_en", "--n_ctx=32",
                      f"--data_dir={runs / 'sst2'}", f"--run_dir={tmp_path / 'ft'}"))
    assert "initialised from books_tiny: embeddings + 4 blocks" in procs[0].stderr, procs[0].stderr[-2000:]
    assert "initialised from gpt1_tiny_books_en: embeddings + 4 of 4 blocks" in procs[1].stderr, procs[1].stderr[-2000:]
    reference = _lm(shipped_presets()["gpt1_tiny_books_en"]).backbone.weights
    # After frozen updates, the weights the preset holds, bit for bit (copies; a step of learning rate 0 and weight
    # decay 0 subtracts exactly 0); the runs' context is the data's 32 positions of the preset's 128.
    continued = _lm(tmp_path / "lm").backbone.weights
    tuned = load_task_model(RunFolder.open(str(tmp_path / "ft")))[0].backbone.weights
    assert len(continued) == len(tuned) == len(reference)
    for i, (a, b, c) in enumerate(zip(continued, tuned, reference)):
        want = c.numpy()[tuple(slice(n) for n in a.shape)]
        np.testing.assert_array_equal(a.numpy(), want, err_msg=a.path)
        rows = slice(8000) if i == 0 else slice(None)  # the token table: fine-tuning re-draws its special-token rows
        np.testing.assert_array_equal(b.numpy()[rows], want[rows], err_msg=b.path)


def test_a_shipped_preset_is_named_where_its_folder_would_be(tmp_path):
    from gpt_tf.convert import preset_io
    from gpt_tf.convert.pretrained import continued_model_config, pretrained_model_config

    folder = preset_io.shipped_presets()["gpt1_tiny_books_en"]
    assert preset_io.locate("gpt1_tiny_books_en") == preset_io.locate("books_tiny") == folder
    assert preset_io.locate(str(tmp_path)) == str(tmp_path)  # a path that is there is itself, whatever its name
    assert pretrained_model_config("books_tiny") == preset_io.preset_config(folder)
    config, problems = continued_model_config("gpt1_tiny_books_en", "data/x", {"vocab_size": 8000, "n_ctx": 64})
    assert problems == [] and (config.n_ctx, config.n_layer, config.n_embd) == (64, 4, 256)
    with pytest.raises(ValueError, match=r"^gpt2_medium does not exist and is not a shipped preset \(shipped presets: "
                                         r"gpt1_small_books_en, gpt1_tiny_books_en, books_tiny\)$"):
        pretrained_model_config("gpt2_medium")


def test_export_takes_a_preset_as_it_takes_the_run_the_preset_was_written_from(runs, tmp_path):
    """``serving.export --preset``: a backbone preset gives the language model and a task preset the classifier,
    each answering as the export of the run it was written from; an unknown name is one line naming the shipped
    presets."""
    import tensorflow as tf

    from tests.small_runs import run_cli

    base = tmp_path / "exported"
    sources = {"lm_preset": f"--preset={runs / 'lm_preset'}", "lm_run": f"--run_dir={runs / 'lm'}",
               "ft_preset": f"--preset={runs / 'ft_preset'}", "ft_run": f"--run_dir={runs / 'ft'}"}
    run_clis(*[("serving.export", source, f"--export_base={base}", f"--model_name={name}")
               for name, source in sources.items()])
    for kind, inputs in (("lm", {"text": tf.constant(TEXTS)}), ("ft", {"sentence": tf.constant(TEXTS)})):
        from_preset, from_run = (tf.saved_model.load(str(base / f"{kind}_{source}" / "1"))
                                 .signatures["serving_default"](**inputs) for source in ("preset", "run"))
        assert set(from_preset) == set(from_run) and from_run, (kind, sorted(from_run))
        for key, value in from_run.items():  # the same weights and tokenizer, each export traced on its own
            if value.dtype.is_floating:
                np.testing.assert_allclose(from_preset[key].numpy(), value.numpy(), err_msg=f"{kind} {key}",
                                           **TWO_PATHS)
            else:
                np.testing.assert_array_equal(from_preset[key].numpy(), value.numpy(), err_msg=f"{kind} {key}")
    unknown = run_cli("serving.export", "--preset=gpt1_huge_books_en", f"--export_base={base}", check=False)
    named = ("--preset=gpt1_huge_books_en does not exist and is not a shipped preset (shipped presets: "
             "gpt1_small_books_en, gpt1_tiny_books_en, books_tiny)")
    assert unknown.returncode == 1 and named in unknown.stderr, unknown.stderr


def test_continued_pretraining_names_what_does_not_fit_the_preset(runs):
    from gpt_tf.convert.pretrained import continued_model_config

    preset = str(runs / "lm_preset")
    config, problems = continued_model_config(preset, "data/x", {"vocab_size": 8000, "n_ctx": 16, "resid_pdrop": 0.0})
    assert problems == [] and (config.n_ctx, config.resid_pdrop, config.n_layer) == (16, 0.0, 2)
    _, problems = continued_model_config(preset, "data/x", {"vocab_size": 500, "n_ctx": 64})
    assert problems == [f"--init_checkpoint={preset} has 8000 BPE tokens but data/x was tokenized with 500: rebuild "
                        "it with the model's tokenizer",
                        f"data/x holds 64-token sequences, longer than the 32 positions of --init_checkpoint={preset}"]


@pytest.mark.parametrize("args, message", [
    (["--init_checkpoint=/nope"], "--init_checkpoint=/nope does not exist"),
    (["--init_checkpoint=gpt1_huge_books_en"], "--init_checkpoint=gpt1_huge_books_en does not exist and is not a "
                                               "shipped preset (shipped presets: gpt1_small_books_en, gpt1_tiny_books_en, books_tiny)"),
    (["--init_checkpoint=/tmp", "--model=small"], "--model: with --init_checkpoint the model is"),
])
def test_bad_init_checkpoint_flags_of_pretraining_fail_fast(args, message):
    from tests.small_runs import run_cli

    proc = run_cli("gpt_tf.train", "--data_dir=/tmp", "--run_dir=/tmp/x", *args, check=False, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
