"""Where Keras's ``fit`` runs the pre-training (``keras_fit.py``): one device, or ``keras.distribution`` over many.

Every choice is the caller's (``--distribution``, ``--model_parallel``; nothing is picked from the device count):

* ``none``: Keras's default device, as without ``keras.distribution`` (the paper's recipe on one accelerator);
* ``data_parallel``: ``DataParallel`` over every device of every process: the weights whole on each, the global
  batch split over them; the update is the one-device update of the same global batch;
* ``model_parallel``: ``ModelParallel`` over a ``(devices / model_parallel, model_parallel)`` mesh named
  ``("batch", "model")``, the weights split over ``"model"`` by the family's ``GPT1Backbone.get_layout_map`` and the
  batch over ``"batch"``: for a model too large for one device, the same update again.

Several processes (one per host, or several on one machine) join through ``keras.distribution.initialize``
(``coordinator_address``: process 0's ``host:port``), which must run before anything touches a device: ``start``
is the route's first call. On the CPU, JAX's collectives between processes are gloo's (JAX's default for
``jax_cpu_collectives_implementation`` in the 0.10 tested). Keras then gives each process its part of every
global batch (``Distribution.distribute_dataset``: ``rebatch`` then ``shard``), so the processes read the same data
files, and the update is still the one-device update of the same global batch. Process 0 is the one that writes.
"""

from __future__ import annotations

import dataclasses

KINDS = ("none", "data_parallel", "model_parallel")


class PlacementError(ValueError):
    """The devices found do not fit the placement asked for (the message names the numbers)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """``--distribution`` and its flags, as the route takes them."""

    kind: str = "none"  # one of KINDS
    model_parallel: int = 1  # model_parallel: devices on the mesh's "model" axis
    coordinator_address: str = ""  # several processes: process 0's host:port
    num_processes: int = 1
    process_id: int = 0

    @property
    def chief(self) -> bool:
        """Whether this process writes the run folder (process 0)."""
        return self.process_id == 0

    def problems(self) -> list[str]:
        """What does not fit together, before anything starts (one line each)."""
        out = []
        if self.kind not in KINDS:
            out.append(f"--distribution={self.kind} is not one of {', '.join(KINDS)}")
        if self.model_parallel != 1 and self.kind != "model_parallel":
            out.append("--model_parallel only applies to --distribution=model_parallel")
        if self.num_processes > 1 and not self.coordinator_address:
            out.append(f"--num_processes={self.num_processes} needs --coordinator_address (process 0's host:port)")
        if self.num_processes > 1 and self.kind == "none":
            out.append("several processes train one model together: give --distribution=data_parallel or "
                       "model_parallel")
        if self.num_processes > 1 and self.kind == "model_parallel":
            out.append("--distribution=model_parallel runs in one process (its saves read whole weights on "
                       "process 0); across processes use --distribution=data_parallel")
        if self.process_id >= self.num_processes:
            out.append(f"--process_id={self.process_id} must be below --num_processes={self.num_processes}")
        if self.coordinator_address and self.num_processes == 1:
            out.append("--coordinator_address joins several processes: give --num_processes too")
        return out


def start(placement: Placement) -> None:
    """Joins the processes (``keras.distribution.initialize``); nothing for one process. Call it before anything
    touches a device (before the model, the random seed or ``list_devices``)."""
    if placement.num_processes > 1:
        import keras

        keras.distribution.initialize(placement.coordinator_address, placement.num_processes, placement.process_id)


def distribution(placement: Placement, batch_size: int):
    """The ``keras.distribution.Distribution`` of ``placement`` over every device of every process (None for
    ``none``); a ``PlacementError`` naming the numbers when the devices or the batch do not divide."""
    import keras

    from gpt_tf.gpt1.backbone import GPT1Backbone

    if placement.kind == "none":
        return None
    devices = keras.distribution.list_devices()
    model = placement.model_parallel if placement.kind == "model_parallel" else 1
    if len(devices) % model:
        raise PlacementError(f"--model_parallel={model} does not divide the {len(devices)} devices")
    replicas = len(devices) // model
    if batch_size % replicas:
        raise PlacementError(f"--batch_size={batch_size} does not split over {replicas} model replicas "
                         f"({len(devices)} devices / --model_parallel={model})")
    if placement.kind == "data_parallel":
        return keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh((replicas, model), ("batch", "model"), devices)
    return keras.distribution.ModelParallel(layout_map=GPT1Backbone.get_layout_map(mesh), batch_dim_name="batch")


def describe(placement: Placement) -> str:
    """The placement in a few words, for the run's first line."""
    import keras

    devices = keras.distribution.list_devices()
    processes = f" in {placement.num_processes} processes" if placement.num_processes > 1 else ""
    if placement.kind == "none":
        return f"one device ({devices[0]})"
    if placement.kind == "data_parallel":
        return f"DataParallel over {len(devices)} devices{processes}"
    return (f"ModelParallel over {len(devices)} devices{processes}: {len(devices) // placement.model_parallel} "
            f"(batch) x {placement.model_parallel} (model)")
