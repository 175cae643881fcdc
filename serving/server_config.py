"""The server's two configuration files, in TF Serving's formats.

* ``--model_config_file``: a ``ModelServerConfig`` text proto (``model_config_list`` of
  ``config { name base_path model_version_policy version_labels }``), parsed with the
  ``tensorflow-serving-api`` proto itself. A relative base path is taken from the config file's
  folder (``serving/models.config`` names ``../exported/sst2``), so the file works from any
  directory. With ``--model_config_file_poll_wait_seconds`` the server reads it again and applies what
  changed (``ModelRegistry.reconfigure``). Stock TF Serving refuses relative base paths ("Expected model
  ... to have an absolute path or URI"): its file, ``serving/models.docker.config``, gives the
  container's absolute paths.
* ``--batching_parameters_file``: a ``BatchingParameters`` text proto
  (``max_batch_size { value: 32 }`` ...); the fields ``serving.batcher.BatchingParameters``
  implements are read, the other TF Serving fields are refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import os
import re

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from serving.batcher import BatchingParameters

_UNSUPPORTED_BATCHING = ("allowed_batch_sizes", "pad_variable_length_inputs", "thread_pool_name",
                         "enable_large_batch_splitting", "max_execution_batch_size")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """One served model: where its versions live and which of them to serve."""

    name: str
    base_path: str
    policy: str = "latest"  # latest | all | specific
    num_versions: int = 1  # for latest
    versions: tuple = ()  # for specific
    labels: tuple = ()  # ((label, version), ...)

    def aspired(self, on_disk: list) -> list:
        """The versions to serve among those on disk (ascending)."""
        if self.policy == "all":
            return list(on_disk)
        if self.policy == "specific":
            return [v for v in on_disk if v in self.versions]
        return list(on_disk[-self.num_versions:])


def read_model_config(path: str) -> list:
    """``ModelConfig`` s of a ``ModelServerConfig`` text file."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        proto = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as err:
        raise ValueError(f"{path}: not a ModelServerConfig text proto: {err}") from None
    return model_configs(proto, path, os.path.dirname(os.path.abspath(path)))


def model_configs(proto, source: str, base_dir: str) -> list:
    """``ModelConfig`` s of a ``ModelServerConfig`` message (from a file, or a ReloadConfig request); errors name
    ``source``; a relative base path is taken from ``base_dir``."""
    if proto.WhichOneof("config") != "model_config_list":
        raise ValueError(f"{source}: needs a model_config_list")
    configs = []
    for entry in proto.model_config_list.config:
        if not entry.name or not entry.base_path:
            raise ValueError(f"{source}: every config needs a name and a base_path")
        if entry.model_platform not in ("", "tensorflow"):
            raise ValueError(f"{source}: model {entry.name!r}: model_platform {entry.model_platform!r} is not "
                             "tensorflow")
        policy = entry.model_version_policy.WhichOneof("policy_choice") or "latest"
        latest = entry.model_version_policy.latest.num_versions or 1
        base_path = entry.base_path
        if "://" not in base_path and not os.path.isabs(base_path):  # lexically, as the file names it
            base_path = os.path.normpath(os.path.join(base_dir, base_path))
        configs.append(ModelConfig(entry.name, base_path, policy, latest,
                                   tuple(entry.model_version_policy.specific.versions),
                                   tuple(sorted(entry.version_labels.items()))))
    names = [c.name for c in configs]
    if len(set(names)) != len(names):
        raise ValueError(f"{source}: model names must be unique, got {names}")
    return configs


def read_batching_parameters(path: str) -> BatchingParameters:
    """``BatchingParameters`` from TF Serving's text format (``name { value: N }`` lines)."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"#.*", "", f.read())
    values, known = {}, {f.name for f in dataclasses.fields(BatchingParameters)}
    for match in re.finditer(r"(\w+)\s*(?::\s*(\S+)|\{\s*value\s*:\s*([^}\s]+)\s*\})", text):
        name, value = match.group(1), match.group(2) or match.group(3)
        if name in _UNSUPPORTED_BATCHING:
            raise ValueError(f"{path}: {name} is a TF Serving batching field that serving.server does not implement")
        if name not in known:
            raise ValueError(f"{path}: unknown batching field {name!r}; known: {sorted(known)}")
        try:
            values[name] = int(value)
        except ValueError:
            raise ValueError(f"{path}: {name} must be an integer, got {value!r}") from None
    leftover = re.sub(r"(\w+)\s*(?::\s*(\S+)|\{\s*value\s*:\s*([^}\s]+)\s*\})", "", text).strip()
    if leftover:
        raise ValueError(f"{path}: cannot parse {leftover[:60]!r}")
    try:
        return BatchingParameters(**values)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
