"""Choosing a tf.distribute strategy by name.

``default``       the default (single-device) strategy;
``one_device``    ``OneDeviceStrategy`` on the first GPU, else the CPU;
``mirrored``      ``MirroredStrategy`` over all local GPUs (or, for tests on a CPU machine, over
                  ``num_cpu_devices`` logical CPU devices);
``multi_worker``  ``MultiWorkerMirroredStrategy`` over the cluster ``workers`` names (``cluster_resolver``: this
                  process is worker ``worker_index``), or, without them, the one the ``TF_CONFIG`` environment
                  variable describes;
``tpu``           ``TPUStrategy`` from a ``TPUClusterResolver`` (``tpu="local"`` on a TPU VM).

Only the chief (``is_chief``) writes checkpoints, summaries and exports; where the other workers
save, and where every worker restores from, is ``gpt_tf.runs.checkpoints.checkpoint_managers``.
"""

from __future__ import annotations

import json
import os

from gpt_tf.backend import tf  # imported at first use: the family imports without TensorFlow

STRATEGIES = ("default", "one_device", "mirrored", "multi_worker", "tpu")


def split_cpu(num_devices: int) -> None:
    """Splits the physical CPU into ``num_devices`` logical devices (before any TF op runs)."""
    if num_devices <= 1:
        return
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)


def cluster_resolver(workers: list[str], index: int):
    """The cluster of ``workers`` (``host:port`` each; 0 is chief) as seen by worker ``index``: a
    ``tf.distribute.cluster_resolver.SimpleClusterResolver`` over gRPC, with this machine's GPUs."""
    if not workers or any(":" not in w for w in workers):
        raise ValueError(f"workers must be a non-empty list of host:port, got {workers!r}")
    if not 0 <= index < len(workers):
        raise ValueError(f"worker index {index} is not in [0, {len(workers)})")
    gpus = len(tf.config.list_physical_devices("GPU"))
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": list(workers)}), task_type="worker", task_id=index, rpc_layer="grpc",
        num_accelerators={"GPU": gpus} if gpus else None)


def make_strategy(name: str, num_cpu_devices: int = 1, tpu: str = "", tpu_zone: str = "", gcp_project: str = "",
                  workers: tuple = (), worker_index: int = 0):
    """Returns the ``tf.distribute.Strategy`` called ``name`` (see module doc)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown --strategy={name!r}; choose one of {', '.join(STRATEGIES)}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        devices = [d.name for d in gpus] or [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(devices)
    if name == "multi_worker":
        if workers:
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=cluster_resolver(workers, worker_index))
        if "TF_CONFIG" not in os.environ:
            raise ValueError("--strategy=multi_worker needs the cluster: --workers, or the TF_CONFIG environment "
                             "variable (cluster and task)")
        json.loads(os.environ["TF_CONFIG"])  # fail early on malformed JSON
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or None, zone=tpu_zone or None, project=gcp_project or None)
    tf.config.experimental_connect_to_cluster(resolver)
    try:
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
        raise RuntimeError(
            f"--strategy=tpu --tpu={tpu}: no TPU system could be initialised ({e.message.splitlines()[0][:200]}); "
            "on a Cloud TPU VM pass --tpu=local and install TensorFlow's TPU build (tensorflow-tpu)") from None
    return tf.distribute.TPUStrategy(resolver)


def is_chief(strategy) -> bool:
    """True on the worker that writes checkpoints, summaries and exports."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict())
