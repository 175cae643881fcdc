"""Helpers the tests share for the model hubs, offline: GPT-1 as transformers publishes it (checkpoints written
here with GPT-1's released BPE files, the Hugging Face cache an ``hf://`` download would leave, ``transformers``'
own logits) and the Kaggle and Hugging Face hubs' upload calls on local folders (``FakeHubs``).

Not a test module (no ``test_`` prefix), as ``tests/small_runs.py``, which holds the other shared helpers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from tests.small_runs import ENV, ROOT


# GPT-1 as transformers publishes it (tests/test_hf_checkpoint.py, test_hf_checkpoint_cli.py): checkpoints written
# here, offline, with GPT-1's released BPE files, and the Hugging Face cache an hf:// download would leave.
GPT1_BPE = ROOT.parent / "shared" / "data" / "gpt1_bpe"
GPT1_BPE_TOKENS = 40478
HF_REPO = "openai-community/openai-gpt"


def write_tokenizer_files(folder: Path) -> None:
    """GPT-1's ``encoder_bpe_40000.json`` and ``vocab_40000.bpe`` as ``vocab.json`` and ``merges.txt``, laid out as
    ``transformers``' OpenAIGPT tokenizer wrote them (sorted keys, indent 2; the merges after ``#version: 0.2``)."""
    encoder = json.loads((GPT1_BPE / "encoder_bpe_40000.json").read_text(encoding="utf-8"))
    (folder / "vocab.json").write_text(json.dumps(encoder, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    merges = (GPT1_BPE / "vocab_40000.bpe").read_text(encoding="utf-8").splitlines()[1:]
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")


def write_checkpoint(root: Path, shape: dict, seed: int = 0) -> dict:
    """A seeded random ``OpenAIGPTLMHeadModel`` of ``shape``: ``root/safetensors`` (``save_pretrained``) and
    ``root/bin`` (``pytorch_model.bin``: ``torch.save`` of its state dict, what ``save_pretrained(
    safe_serialization=False)`` wrote before transformers 5, which writes safetensors only), each with the tokenizer
    files. Returns both folders."""
    import torch
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(seed)
    model = OpenAIGPTLMHeadModel(OpenAIGPTConfig(vocab_size=GPT1_BPE_TOKENS, **shape)).eval()
    folders = {"safetensors": root / "safetensors", "bin": root / "bin"}
    model.save_pretrained(folders["safetensors"])
    folders["bin"].mkdir(parents=True)
    model.config.save_pretrained(folders["bin"])
    torch.save(model.state_dict(), folders["bin"] / "pytorch_model.bin")
    for folder in folders.values():
        write_tokenizer_files(folder)
    return folders


def fill_hub_cache(hub_cache: Path, repo: str, source: Path, revision: str = "0" * 40) -> None:
    """``source``'s files as the Hugging Face cache holds a download of ``repo``: ``blobs/<sha256>``,
    ``snapshots/<revision>/<name>`` linking to them and ``refs/main`` naming the revision."""
    storage = hub_cache / f"models--{repo.replace('/', '--')}"
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    (storage / "refs").mkdir(exist_ok=True)
    snapshot = storage / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        blob = storage / "blobs" / digest
        if not blob.exists():
            try:
                os.link(path, blob)
            except OSError:
                shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (storage / "refs" / "main").write_text(revision)


SMALL = {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}  # the suite's checkpoint: 2 blocks of 32 dims


def cached_checkpoint(root: Path, shape: dict = SMALL) -> dict:
    """``write_checkpoint`` of ``shape`` under ``root``, and an ``HF_HOME`` (``hf_home``) whose cache holds its
    safetensors folder as ``hf://{HF_REPO}``: both weight formats' folders and the HF_HOME."""
    folders = write_checkpoint(root, shape)
    fill_hub_cache(root / "hf_home" / "hub", HF_REPO, folders["safetensors"])
    return {**folders, "hf_home": root / "hf_home"}


def backbone_weights(model) -> list:
    """The weights of ``model``'s backbone (or of ``model``, a backbone) as numpy arrays."""
    import keras

    return [keras.ops.convert_to_numpy(v) for v in getattr(model, "backbone", model).weights]


def hub_env(hf_home: Path) -> dict:
    """The environment of a process that reads the Hugging Face cache at ``hf_home`` only (``HF_HUB_OFFLINE=1``)."""
    env = {k: v for k, v in ENV.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")}
    return {**env, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}


def transformers_logits(folder: Path, ids: np.ndarray) -> np.ndarray:
    """``transformers``' ``OpenAIGPTLMHeadModel`` loaded from ``folder``: its logits of ``ids`` [B, T]."""
    import torch
    from transformers import OpenAIGPTLMHeadModel

    model = OpenAIGPTLMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.numpy()


class FakeHubs:
    """The Kaggle and Hugging Face hubs as ``keras_hub.upload_preset`` and ``gpt_tf.gpt1.presets.upload_preset`` call
    them, on local folders (no network): ``install(monkeypatch)`` replaces ``kagglehub.model_upload`` and
    ``huggingface_hub``'s ``create_repo``, ``file_exists``, ``upload_file`` and ``upload_folder``; each repository is
    the folder ``repo(handle)`` under ``root``, written when the call is made (keras-hub deletes what it generated
    right after). ``calls`` lists the calls, in order, by name."""

    def __init__(self, root: Path):
        self.root, self.calls = Path(root), []

    def repo(self, handle: str) -> Path:
        return self.root / handle

    def install(self, monkeypatch) -> "FakeHubs":
        import huggingface_hub
        import kagglehub

        for name in ("create_repo", "file_exists", "upload_file", "upload_folder"):
            monkeypatch.setattr(huggingface_hub, name, getattr(self, name))
        monkeypatch.setattr(kagglehub, "model_upload", self.model_upload)
        return self

    def create_repo(self, repo_id, exist_ok=False, **_):
        from types import SimpleNamespace

        repo_id = repo_id if "/" in repo_id else f"me/{repo_id}"  # the Hub puts a bare name under the caller's name
        self.calls.append("create_repo")
        self.repo(repo_id).mkdir(parents=True, exist_ok=exist_ok)
        return SimpleNamespace(repo_id=repo_id)

    def file_exists(self, repo_id, filename, **_):
        self.calls.append("file_exists")
        return (self.repo(repo_id) / filename).is_file()

    def upload_file(self, path_or_fileobj, path_in_repo, repo_id, **_):
        self.calls.append("upload_file")
        shutil.copyfile(path_or_fileobj, self.repo(repo_id) / path_in_repo)

    def upload_folder(self, repo_id, folder_path, **_):
        self.calls.append("upload_folder")
        shutil.copytree(folder_path, self.repo(repo_id), dirs_exist_ok=True)

    def model_upload(self, handle, local_model_dir, *_, **__):
        self.calls.append("model_upload")
        shutil.copytree(local_model_dir, self.repo(handle), dirs_exist_ok=True)
