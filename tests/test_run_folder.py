"""``gpt_tf.runs.folder.RunFolder``: a run folder read through one reader, each file once.

The folders are written by hand (the files a run and its data hold), so nothing here trains or starts TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpt_tf.config import get_size
from gpt_tf.tasks import get_task
from gpt_tf.runs import folder as run_folder
from gpt_tf.runs.folder import RunFolder


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return path.parent


def data_folder(path, tokenizer_dir, task=None, **extra):
    manifest = {"tokenizer": {"dir": str(tokenizer_dir), "vocab_size": 40478, "files": []}, **extra}
    if task:
        manifest["task_spec"] = get_task(task).to_dict()
    return write(path / "manifest.json", manifest)


def run(path, kind, **run_config):
    write(path / "model_config.json", dataclasses.asdict(get_size("test", n_ctx=48)))
    return write(path / ("finetune_config.json" if kind == "finetune" else "train_config.json"), run_config)


@pytest.fixture
def counted(monkeypatch):
    """Counts each file the reader reads: {path: times}."""
    reads = {}

    def counting(fn):
        def wrapper(path, *args):
            reads[str(path)] = reads.get(str(path), 0) + 1
            return fn(path, *args)
        return wrapper

    monkeypatch.setattr(run_folder, "read_json", counting(run_folder.read_json))
    monkeypatch.setattr(run_folder, "read_manifest", counting(run_folder.read_manifest))
    monkeypatch.setattr(run_folder, "pretrained_model_config", counting(run_folder.pretrained_model_config))
    return reads


def test_a_pretraining_run_is_read_once(tmp_path, shared_data, counted, monkeypatch):
    data = data_folder(tmp_path / "data", shared_data / "gpt1_bpe", separator={"id": 7}, n_ctx=48)
    path = run(tmp_path / "run", "pretrain", data_dir=str(data), seed=5)
    folder = RunFolder.open(path)
    assert (folder.kind, folder.data_dir, folder.seed, folder.bos_id) == ("pretrain", str(data), 5, 7)
    assert folder.model_config == get_size("test", n_ctx=48)
    assert folder.manifest["n_ctx"] == 48 and folder.tokenizer_dir == str(shared_data / "gpt1_bpe")
    assert folder.tokenizer_problems() == []
    from gpt_tf.text.tokenizer import GPTTokenizer

    loads = []
    real = GPTTokenizer.from_dir
    monkeypatch.setattr(GPTTokenizer, "from_dir", lambda d: loads.append(d) or real(d))
    assert folder.tokenizer is folder.tokenizer and folder.tokenizer.vocab_size == 40478 and len(loads) == 1
    assert sorted(counted.values()) == [1, 1, 1]  # the run config, the model config, the manifest
    with pytest.raises(dataclasses.FrozenInstanceError):
        folder.data_dir = "elsewhere"


def test_a_multitask_finetuning_run_names_its_tasks_and_takes_another_data_folder(tmp_path, counted):
    rte, stsb, moved = (data_folder(tmp_path / n, tmp_path / "bpe", task=t)
                        for n, t in (("rte", "rte"), ("stsb", "stsb"), ("moved", "rte")))
    path = run(tmp_path / "ft", "finetune", data_dir=str(rte), aux_data_dirs=[str(stsb)], clf_pdrop=0.2)
    folder = RunFolder.open(path)
    assert folder.kind == "finetune" and [t.name for t in folder.tasks] == ["rte", "stsb"]
    assert folder.run_config["clf_pdrop"] == 0.2 and folder.tokenizer_dir == str(tmp_path / "bpe")
    assert set(counted.values()) == {1} and len(counted) == 4
    assert folder.tokenizer_problems() == [f"{rte}/manifest.json names tokenizer dir {str(tmp_path / 'bpe')!r}, which "
                                           "does not exist here; pass --tokenizer_dir"]
    assert RunFolder.open(path, data_dir=str(moved)).data_dir == str(moved)


def test_release_shards_and_other_folders(tmp_path, shared_data):
    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "params_0.npy").write_bytes(b"")
    shards = RunFolder.open(tmp_path / "shards")
    assert shards.kind == "gpt1" and shards.model_config == get_size("gpt1") and shards.manifest is None
    assert shards.tokenizer_problems() == [f"{tmp_path / 'shards'}: GPT-1 release shards; give --tokenizer_dir"]
    assert RunFolder.open(tmp_path / "shards", tokenizer_dir=str(shared_data / "gpt1_bpe")).tokenizer_problems() == []
    with pytest.raises(FileNotFoundError, match="not a fine-tuning run"):
        RunFolder.open(tmp_path)
    gone = run(tmp_path / "gone", "pretrain", data_dir=str(tmp_path / "deleted"))
    assert RunFolder.open(gone).manifest is None
    assert "give --tokenizer_dir" in RunFolder.open(gone).tokenizer_problems()[0]


def test_a_data_manifest_missing_or_corrupt_is_named_by_every_reader(tmp_path):
    """``gpt_tf.data.records.read_manifest`` is the data manifests' one reader: the builders' up-to-date check
    (``find_manifest``), ``RunFolder.open`` and the training data readers go through it and its errors."""
    from gpt_tf.data.records import find_manifest, has_manifest, read_manifest
    from gpt_tf.data.transforms import load_task_spec

    path = tmp_path / "data" / "manifest.json"
    path.parent.mkdir()
    assert not has_manifest(path.parent) and find_manifest(path.parent) is None
    with pytest.raises(FileNotFoundError, match=f"{path}: no manifest; build {path.parent} with `python -m "
                                                "pipelines.finetune_data`"):
        load_task_spec(str(path.parent))
    run(tmp_path / "run", "finetune", data_dir=str(path.parent))
    with pytest.raises(FileNotFoundError, match=f"{path}: no manifest"):
        RunFolder.open(str(tmp_path / "run"))
    path.write_text('{"tokenizer": {"dir": ')  # cut short
    assert has_manifest(path.parent)
    for reader in (read_manifest, find_manifest, lambda d: RunFolder.open(str(tmp_path / "run"))):
        with pytest.raises(ValueError, match=f"{path}: not valid JSON"):
            reader(path.parent)


def test_a_data_manifest_is_parsed_once_while_it_stays_the_same_file(tmp_path, monkeypatch):
    """The data readers (``num_examples``, ``load_task_spec``, the training readers) each ask for the manifest:
    it is opened once, each caller gets its own copy, and a rewritten manifest is read again."""
    import os

    from gpt_tf.data import records
    from gpt_tf.data.transforms import load_task_spec, num_examples

    folder = data_folder(tmp_path / "data", tmp_path / "bpe", task="sst2",
                         splits={"train": {"examples": 7, "files": []}})
    opened = []
    real_open = records._open
    monkeypatch.setattr(records, "_open", lambda path, mode: opened.append(path) or real_open(path, mode))
    assert num_examples(str(folder), "train") == 7 and load_task_spec(str(folder)).name == "sst2"
    first = records.read_manifest(folder)
    first["splits"]["train"]["examples"] = 0  # a caller's change stays its own
    assert records.read_manifest(folder)["splits"]["train"]["examples"] == 7
    assert len(opened) == 1
    write(folder / "manifest.json", {"tokenizer": {"dir": "x"}, "splits": {"train": {"examples": 9, "files": []}},
                                     "padding": "a longer file"})
    os.utime(folder / "manifest.json", ns=(1, 1))  # even with an old timestamp: the size changed
    assert num_examples(str(folder), "train") == 9 and len(opened) == 2
