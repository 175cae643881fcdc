"""Pre-training on a GPU machine without TensorFlow (tools.torch_pretrain.train) and back into a gpt_tf run.

Records -> token streams -> a few PyTorch updates (the transformer reference, and the LSTM baseline) -> weights
imported as a gpt_tf run whose model gives the PyTorch model's logits, and whose windows are exactly the records.
The LSTM's own numerics and initialisation: tests/test_torch_lstm.py.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.small_runs import ENV, ROOT


def run_module(module, *args):
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, f"{module} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_sizes_match_gpt_tf():
    from tools.torch_pretrain.train import SIZES
    from gpt_tf.config import get_size

    assert {name for name in SIZES if name.startswith("lstm_")} == {"lstm_small", "lstm_tiny", "lstm_test"}
    for name, sizes in SIZES.items():
        config = get_size(name)
        assert {k: getattr(config, k) for k in sizes} == sizes, name
        if config.model_type == "lstm":
            assert name.startswith("lstm_") and "d_ff" in sizes, name
        else:
            assert config.d_ff == 4 * config.n_embd, f"{name}: transformers' OpenAIGPT hard-codes d_ff = 4 * n_embd"


def test_lr_schedule_matches_gpt_tf():
    import tensorflow as tf

    from tools.torch_pretrain.train import lr_at
    from gpt_tf.nn.optim import WarmupDecay

    ours = WarmupDecay(1e-3, 10, 100, "cosine")
    for step in (0, 1, 5, 10, 11, 50, 99, 100):
        assert lr_at(step, 1e-3, 10, 100) == pytest.approx(float(ours(tf.constant(step))), rel=1e-5, abs=1e-9)


@pytest.fixture(scope="module")
def records(shared_data, tmp_path_factory):
    """pipelines.pretrain_data over the two smallest train books and the smallest valid book."""
    books = tmp_path_factory.mktemp("books")
    index = [line.split("\t") for line in (shared_data / "books" / "index.tsv").read_text().splitlines()[1:]]
    smallest = sorted((int(row[4]), row[0], row[1]) for row in index)
    for split, count in (("train", 2), ("valid", 1)):
        (books / split).mkdir()
        for _, book_id, book_split in [r for r in smallest if r[2] == split][:count]:
            src = shared_data / "books" / book_split / f"{book_id}.txt"
            (books / split / src.name).write_bytes(src.read_bytes())
    out = tmp_path_factory.mktemp("data") / "tfrecords"
    run_module("pipelines.pretrain_data", f"--input_dir={books / 'train'}", f"--valid_dir={books / 'valid'}",
               f"--output_dir={out}", f"--tokenizer_dir={out.parent / 'bpe'}", "--train_tokenizer_vocab=300",
               "--n_ctx=32")
    return out


@pytest.mark.parametrize("name", ["tokens.npz", "tokens.npz.xz"])
def test_token_streams_round_trip_in_both_forms(tmp_path, name):
    from tools.torch_pretrain.streams import load_streams, save_streams

    rng = np.random.default_rng(0)
    streams = {"train": rng.integers(0, 8000, 5000).astype(np.uint16), "valid": rng.integers(0, 8000, 700).astype(np.uint16)}
    meta = {"n_ctx": 32, "vocab_size": 8000, "tokens": {k: len(v) for k, v in streams.items()}}
    save_streams(str(tmp_path / "sub" / name), meta, streams)
    got_meta, got = load_streams(str(tmp_path / "sub" / name))
    assert got_meta == meta and set(got) == set(streams)
    for split, stream in streams.items():
        assert got[split].dtype == np.uint16
        np.testing.assert_array_equal(got[split], stream)
    assert [p.name for p in (tmp_path / "sub").iterdir()] == [name]  # no temporary file left behind


def test_weight_parts_stay_within_the_part_size_and_join_back(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from tools.torch_pretrain import pieces

    monkeypatch.setattr(pieces, "PART_BYTES", 4096)
    model = torch.nn.Module()
    model.tokens_embed = torch.nn.Embedding(50, 16)  # 3,200 bytes: whole
    model.big = torch.nn.Linear(40, 70)  # its 70 x 40 weight (11,200 bytes) goes in row blocks of 25 rows
    paths = pieces.save_weights(torch, model, str(tmp_path), 7, np.float32)
    state = {}
    for path in paths:
        with np.load(path) as part:
            assert sum(part[k].nbytes for k in part.files) <= 4096, path
            state.update({k: part[k] for k in part.files})
    assert sorted(k for k in state if k.startswith("big.weight")) == [f"big.weight{pieces.ROWS}{i}" for i in range(3)]
    # gpt_tf reads them back (gpt_tf.convert.state_dicts; the GPU side writes them without gpt_tf installed)
    from gpt_tf.convert.state_dicts import ROWS, read_state_dict

    assert ROWS == pieces.ROWS
    joined = read_state_dict(paths)
    assert set(joined) == set(model.state_dict())
    for key, value in model.state_dict().items():  # rows split and joined again, no arithmetic: exact
        np.testing.assert_array_equal(joined[key], value.numpy())
    del state[f"big.weight{pieces.ROWS}1"]
    np.savez(tmp_path / "gap.npz", **state)
    with pytest.raises(ValueError, match="big.weight: row blocks"):
        read_state_dict([tmp_path / "gap.npz"])
    with pytest.raises(ValueError, match="key 'tokens_embed.weight' is also in an earlier part"):
        read_state_dict([tmp_path / "gap.npz", tmp_path / "gap.npz"])


@pytest.mark.parametrize("model", ["test", "lstm_test"])
def test_reference_run_round_trip(records, tmp_path, model):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import tensorflow as tf

    from tools.torch_pretrain.train import SIZES, build_model, windows
    from tools.torch_pretrain.convert import export, import_run
    from tools.torch_pretrain.streams import load_streams
    from gpt_tf.config import GPTConfig
    from gpt_tf.gpt1.backbone import token_inputs
    from gpt_tf.gpt1.build import causal_lm_for
    from gpt_tf.convert.pretrained import initialise_from_pretrained, restore_pretrained_lm
    from gpt_tf.data.records import COMPRESSION, PRETRAIN_FEATURE as FEATURE

    tokens = tmp_path / "tokens.npz.xz"  # the form that travels to the GPU machine (streams.py)
    meta = export(str(records), str(tokens))
    _, streams = load_streams(str(tokens))
    # The streams' stride-n_ctx windows are exactly the records, in order.
    spec = {FEATURE: tf.io.FixedLenFeature([33], tf.int64)}
    files = sorted(str(p) for p in records.glob("train-*.tfrecord.gz"))
    first = [tf.io.parse_single_example(r, spec)[FEATURE].numpy() for r in tf.data.TFRecordDataset(files, COMPRESSION)]
    np.testing.assert_array_equal(windows(streams["train"].astype(np.int64), 32), np.stack(first))
    assert meta["tokens"]["train"] == len(streams["train"])

    out = tmp_path / "gpu"
    run_module("tools.torch_pretrain.train", f"--tokens={tokens}", f"--out_dir={out}", f"--model={model}", "--batch_size=8",
               "--epochs=2", "--evals=2", "--eval_windows=64", "--keep=1")
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = log[0]["setting"]["steps"]
    assert log[-1]["done"] == steps and [r["step"] for r in log if "valid_ppl" in r][-1] == steps

    # Weights trained on other BPE files are refused.
    other = tmp_path / "other"
    other.mkdir()
    (other / "log.jsonl").write_text((out / "log.jsonl").read_text().replace(meta["tokenizer"]["files"][0]["sha256"], "0" * 64))
    with pytest.raises(ValueError, match="another tokenizer|tokenizer files"):
        import_run(str(other), str(records), str(tmp_path / "refused"), model)
    wrong = "lstm_test" if model == "test" else "test"  # weights of another model are refused by name
    with pytest.raises(ValueError, match=f"trained --model={model}"):
        import_run(str(out), str(records), str(tmp_path / "wrong"), wrong)

    run_dir = tmp_path / "run"
    summary = import_run(str(out), str(records), str(run_dir), model)
    assert summary["checkpoints"][-1] == steps and len(summary["checkpoints"]) == 2

    # The imported gpt_tf model computes the reference's logits from the saved weights.
    reference = build_model(torch, transformers, model, meta["vocab_size"], 0.0).eval()
    state = {}
    for part in sorted(out.glob(f"weights-{steps}.part*.npz")):
        state.update({k: torch.from_numpy(v) for k, v in np.load(part).items()})
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" or k.endswith("attn.bias") for k in missing), missing
    if hasattr(reference, "tie_weights"):
        reference.tie_weights()
    config = GPTConfig(**json.loads((run_dir / "model_config.json").read_text()))
    assert config.n_ctx == SIZES[model]["n_ctx"] and config.vocab_size == meta["vocab_size"]
    assert config.model_type == ("lstm" if model.startswith("lstm_") else "gpt")
    ours = causal_lm_for(config)
    restore_pretrained_lm(ours, str(run_dir))
    ids = streams["valid"][:32].astype(np.int32)[None]
    with torch.no_grad():
        out_ = reference(torch.from_numpy(ids.astype(np.int64)))
    theirs = getattr(out_, "logits", out_).numpy()
    np.testing.assert_allclose(np.asarray(ours(token_inputs(ids)))[..., : meta["vocab_size"]], theirs, atol=1e-4)
    # Fine-tuning's start (--init_checkpoint=<the run>) reads the same weights into a fresh model.
    fresh = causal_lm_for(config)
    initialise_from_pretrained(fresh, str(run_dir), config.n_layer)
    np.testing.assert_allclose(np.asarray(fresh(token_inputs(ids)))[..., : meta["vocab_size"]], theirs, atol=1e-4)


def test_the_shipped_books_preset_is_the_runs_last_checkpoint(tmp_path):
    """`--weights_dir=gpt_tf/presets/gpt1_tiny_books_en` (the books preset as a run folder, with its training curve):
    the preset, with the kept run's log beside its weights, is one checkpoint at the run's last step; a folder with
    neither is refused."""
    from tools.torch_pretrain.convert import checkpoint_steps, read_log

    preset = ROOT / "gpt_tf" / "presets" / "gpt1_tiny_books_en"
    setting, rows = read_log(str(preset))
    assert setting["steps"] == 7158 and rows[-1]["step"] == 7158 and round(rows[-1]["valid_ppl"], 1) == 55.1
    assert checkpoint_steps(str(preset), setting["steps"]) == {7158: [str(preset)]}
    (tmp_path / "weights-5.part0.npz").write_bytes(b"")
    (tmp_path / "weights-9.part1.npz").write_bytes(b"")
    (tmp_path / "weights-9.part0.npz").write_bytes(b"")
    assert checkpoint_steps(str(tmp_path), 9) == {5: [str(tmp_path / "weights-5.part0.npz")],
                                                  9: [str(tmp_path / f"weights-9.part{k}.npz") for k in (0, 1)]}
    with pytest.raises(FileNotFoundError, match="not a gpt_tf preset"):
        checkpoint_steps(str(tmp_path / "empty"), 9)


@pytest.mark.parametrize("model", ["test", "lstm_test"])
def test_pieces_resume_bit_exactly(tmp_path, model):
    """A run stopped midway (state saved, exit 75) and resumed by the same command ends with the weights, the
    log and the intermediate checkpoint of the run that went through in one go; a resume with other settings
    is refused. The LSTM's run is sized by --updates (the transformer's by --epochs)."""
    pytest.importorskip("torch")
    if model == "test":
        pytest.importorskip("transformers")
    from tools.torch_pretrain.train import PIECE_EXIT

    rng = np.random.default_rng(0)
    meta = {"data_dir": "synthetic", "n_ctx": 32, "vocab_size": 50, "tokenizer": {}, "tokens": {}}
    tokens = tmp_path / "tokens.npz"
    np.savez(tokens, meta=json.dumps(meta), train=rng.integers(0, 50, 32 * 20 + 1).astype(np.uint16),
             valid=rng.integers(0, 50, 32 * 4 + 1).astype(np.uint16))
    length = ["--epochs=2"] if model == "test" else ["--epochs=1", "--updates=10"]
    common = [f"--tokens={tokens}", f"--model={model}", "--batch_size=4", *length, "--evals=3", "--eval_windows=0",
              "--keep=1", "--dropout=0.1"]  # 10 updates over 2 epochs: the piece stops in the second epoch's order
    run_module("tools.torch_pretrain.train", *common, f"--out_dir={tmp_path / 'whole'}")
    pieces = tmp_path / "pieces"

    def piece(*extra):
        return subprocess.run([sys.executable, "-m", "tools.torch_pretrain.train", *common, f"--out_dir={pieces}", *extra],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)

    first = piece("--piece_updates=6")
    assert first.returncode == PIECE_EXIT, first.stderr[-3000:]
    assert list(pieces.glob("state-6.part*")) and (pieces / "state.json").is_file()
    assert "run the same command" in first.stdout
    other = piece("--learning_rate=5e-4")
    assert other.returncode == 1 and "other settings" in other.stderr and "learning_rate" in other.stderr
    last = piece("--piece_updates=6")
    assert last.returncode == 0 and "resuming at update 6 of 10" in last.stdout, last.stderr[-3000:]
    assert not list(pieces.glob("state*"))  # the finished run removes its resume state

    def rows(folder):
        rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
        rows[0]["setting"].pop("out_dir")
        return [{k: v for k, v in r.items() if k not in ("seconds", "wall_seconds")} for r in rows if "piece" not in r]

    assert rows(pieces) == rows(tmp_path / "whole")
    files = sorted(p.name for p in (tmp_path / "whole").glob("weights-*.npz"))
    assert files == sorted(p.name for p in pieces.glob("weights-*.npz")) and len(files) == 2
    for name in files:
        with np.load(tmp_path / "whole" / name) as a, np.load(pieces / name) as b:
            assert a.files == b.files
            for key in a.files:  # resuming is the point: the same torch ops on the same CPU, bit for bit
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{name}: {key}")
