"""A finished run folder, read once: ``RunFolder.open(path)``.

    run = RunFolder.open("runs/finetune_sst2")
    run.kind, run.model_config, run.run_config, run.manifest, run.tasks, run.tokenizer, run.checkpoints

A run folder holds ``model_config.json`` and its run config (``train_config.json`` for pre-training,
``finetune_config.json`` for fine-tuning; ``gpt_tf/runs/files.py``), which names the data folder(s) it
read, whose ``manifest.json`` names the tokenizer (and, for task data, the ``TaskSpec``). A folder
of GPT-1's release shards (``params_0.npy`` ...) opens too, as ``kind == "gpt1"``, with no run
config and no manifest (its tokenizer must be given). ``open`` reads each of those files once;
the tokenizer and the checkpoint list are read when first asked for.

Export (``serving/export.py``), zero-shot (``gpt_tf/analysis/zero_shot.py``), the conversion to a preset
(``gpt_tf/convert/presets.py``), the §5 study and ``gpt_tf.runs.checkpoints.load_task_model`` take the run from
here. It reads data manifests (``gpt_tf.data.records``), so it sits above ``pipelines`` (as does the whole of
``gpt_tf/runs``). Nothing here imports TensorFlow until ``checkpoints`` is asked for.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional

from gpt_tf.config import GPTConfig
from gpt_tf.convert.pretrained import is_release, pretrained_model_config
from gpt_tf.runs.files import RUN_CONFIGS, read_json
from gpt_tf.tasks import TaskSpec
from gpt_tf.data.records import MANIFEST, has_manifest, read_manifest, tokenizer_problems


@dataclasses.dataclass(frozen=True)
class RunFolder:
    path: str
    kind: str                       # "pretrain", "finetune" or "gpt1" (release shards)
    model_config: GPTConfig
    run_config: dict                # train_config.json / finetune_config.json ({} for release shards)
    data_dir: str                   # the (primary) data folder: the run's, or the one ``open`` was given
    manifest: Optional[dict]        # its manifest.json (None where the run names none, or it is gone)
    aux_manifests: tuple = ()       # fine-tuning's auxiliary task folders' manifests, in run order
    tokenizer_dir: str = ""         # the one ``open`` was given, else the one the manifest names

    @classmethod
    def open(cls, path: str, data_dir: str = "", tokenizer_dir: str = "") -> "RunFolder":
        """Reads the run folder ``path``; ``data_dir`` / ``tokenizer_dir`` override the run's own.

        FileNotFoundError naming what is missing when ``path`` is neither a run nor release shards;
        a fine-tuning run's data manifests must exist (its tasks are in them), a pre-training run's
        may be gone (``manifest`` is then None, and a tokenizer must be given).
        """
        path = str(path)
        kinds = [kind for kind, name in RUN_CONFIGS.items() if os.path.isfile(os.path.join(path, name))]
        if not kinds:
            if is_release(path):
                return cls(path, "gpt1", pretrained_model_config(path), {}, "", None, (), str(tokenizer_dir))
            raise FileNotFoundError(f"{path}: not a fine-tuning run ({RUN_CONFIGS['finetune']}), a pre-training run "
                                    f"({RUN_CONFIGS['pretrain']}) nor GPT-1 release shards (params_0.npy)")
        kind = "finetune" if "finetune" in kinds else "pretrain"
        run_config = read_json(os.path.join(path, RUN_CONFIGS[kind]))
        model_config = pretrained_model_config(path)
        data_dir = str(data_dir or run_config.get("data_dir", ""))
        if kind == "finetune":
            manifest = read_manifest(data_dir, "pipelines.finetune_data")
            aux = tuple(read_manifest(d, "pipelines.finetune_data") for d in run_config.get("aux_data_dirs", ()))
        else:
            manifest = read_manifest(data_dir) if data_dir and has_manifest(data_dir) else None
            aux = ()
        tokenizer_dir = str(tokenizer_dir or (manifest or {}).get("tokenizer", {}).get("dir", ""))
        return cls(path, kind, model_config, run_config, data_dir, manifest, aux, tokenizer_dir)

    # ------------------------------------------------------------------ what the files say
    @property
    def tasks(self) -> tuple:
        """A fine-tuning run's ``TaskSpec``s, primary first, as its data manifests name them."""
        return tuple(TaskSpec.from_dict(m["task_spec"]) for m in (self.manifest, *self.aux_manifests))

    @property
    def bos_id(self) -> Optional[int]:
        """The pre-training data's document separator (what precedes a document), or None."""
        return (self.manifest or {}).get("separator", {}).get("id")

    @property
    def seed(self) -> int:
        return int(self.run_config.get("seed", 0))

    def tokenizer_problems(self) -> list[str]:
        """Why the tokenizer cannot be used (empty: it can): none named, its folder missing, or files
        other than those the data was built with (their sha256 in the manifest)."""
        if not self.tokenizer_dir:
            what = "GPT-1 release shards" if self.kind == "gpt1" else f"cannot find the data manifest of {self.path}"
            return [f"{self.path}: {what}; give --tokenizer_dir"]
        if self.manifest is None:
            return []  # nothing to compare a given tokenizer with
        if not os.path.isdir(self.tokenizer_dir):
            named = self.tokenizer_dir == self.manifest.get("tokenizer", {}).get("dir")
            return [f"{os.path.join(self.data_dir, MANIFEST)} names tokenizer dir {self.tokenizer_dir!r}, which does "
                    "not exist here; pass --tokenizer_dir" if named else f"--tokenizer_dir={self.tokenizer_dir} does not exist"]
        return tokenizer_problems(self.manifest, self.tokenizer_dir, self.data_dir)

    # ------------------------------------------------------------------ read when asked for
    @functools.cached_property
    def tokenizer(self):
        """The offline ``GPTTokenizer`` (read once, on first use)."""
        from gpt_tf.text.tokenizer import GPTTokenizer

        return GPTTokenizer.from_dir(self.tokenizer_dir)

    @functools.cached_property
    def checkpoints(self) -> list:
        """``[(step, prefix)]`` of the kept checkpoints in step order (``gpt_tf.runs.checkpoints.kept_checkpoints``)."""
        from gpt_tf.runs.checkpoints import kept_checkpoints

        return kept_checkpoints(self.path)
