"""Op time by kind from a framework's own profiler: what the speed profiles share.

``bench.finetune_speed --mode=profile`` (``bench/_finetune_profile.py``) and ``bench.train_throughput
--mode=profile`` (``bench/_pretrain_profile.py``) record steps with ``tf.profiler`` (ours, the keras-hub
stack) or ``torch.profiler`` (PyTorch HF) and put every op's own (self) time in one kind:

    matmul      dense and batched matrix products (oneDNN / MKL in both frameworks), forward and backward
    optimizer   gradient clipping and the AdamW update (TF: the optimizer's name scope, which holds
                both; torch: under ``Optimizer.step``, plus clip_grad_norm_'s foreach / vector-norm ops)
    dropout     random masks and their application, forward and backward
    other ops   everything else the graph / autograd runs: GELU, layer norm, softmax, adds, copies
    outside ops wall time minus all ops' time: Python, dispatch, input pipeline waits, and on a
                shared machine the time the thread waited for a core

Beside the kinds, ``op_types`` sums the self time per op type (TF's ``OpType``, torch's ``aten::`` name),
for the few ops that make a kind large.
"""

from __future__ import annotations

import collections
from pathlib import Path

KINDS = ("matmul", "optimizer", "dropout", "other ops", "outside ops")

# ----------------------------------------------------------------------------- TensorFlow


def tf_kind(name: str, optimizer_scope: str) -> str | None:
    """The kind of a TF executor event ``scope/op:OpType``; None for events that are not ops."""
    if ":" not in name or "::" in name:  # op events are scope:OpType; ExecutorState::Process etc. wrap them
        return None
    scope, op_type = name.rsplit(":", 1)
    if optimizer_scope in scope:
        return "optimizer"
    if "dropout" in scope.lower():
        return "dropout"
    return "matmul" if "MatMul" in op_type else "other ops"


def tf_compute_events(logdir: str):
    """``(name, picoseconds)`` of every event on TF's executor threads in the newest trace under
    ``logdir`` (``tf.profiler.experimental.start(logdir)`` ... ``stop()``); op events are named ``scope:OpType``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    path = sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))[-1]
    space = xplane_pb2.XSpace()
    space.ParseFromString(path.read_bytes())
    for plane in space.planes:
        for line in plane.lines:
            if line.name.startswith("tf_Compute"):
                for event in line.events:
                    yield plane.event_metadata[event.metadata_id].name, event.duration_ps


def tf_op_seconds(logdir: str, optimizer_scope: str, by_type: bool = False):
    """Self seconds per kind of the ops in the newest trace under ``logdir`` (TF's executor threads);
    with ``by_type``, also the seconds per op type: ``(kinds, op_types)``."""
    seconds, types = collections.Counter(), collections.Counter()
    for name, picoseconds in tf_compute_events(logdir):
        kind = tf_kind(name, optimizer_scope)
        if kind:
            seconds[kind] += picoseconds / 1e12
            types[name.rsplit(":", 1)[1]] += picoseconds / 1e12
    return (dict(seconds), dict(types)) if by_type else dict(seconds)


# ----------------------------------------------------------------------------- PyTorch

TORCH_MATMULS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_addmm_activation"}
# torch.nn.utils.clip_grad_norm_ (the models themselves use none of these).
TORCH_CLIP_OPS = {"aten::_foreach_norm", "aten::linalg_vector_norm", "aten::_foreach_mul_", "aten::stack",
                  "aten::clamp"}


def torch_kind(event) -> str:
    """The kind of a torch profiler event, from its name and its ancestors' names."""
    names, parent = [event.name], event.cpu_parent
    while parent is not None:
        names.append(parent.name)
        parent = parent.cpu_parent
    if any(n.startswith("Optimizer.step") for n in names) or event.name in TORCH_CLIP_OPS:
        return "optimizer"
    if any("dropout" in n.lower() for n in names) or event.name == "aten::bernoulli_":
        return "dropout"
    return "matmul" if event.name in TORCH_MATMULS else "other ops"


def torch_op_seconds(prof, by_type: bool = False):
    """Self seconds per kind of the aten ops recorded (the ``aten::`` events: what the kernels ran); with
    ``by_type``, also the seconds per op name: ``(kinds, op_types)``."""
    seconds, types = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.name.startswith("aten::"):
            seconds[torch_kind(event)] += event.self_cpu_time_total / 1e6
            types[event.name] += event.self_cpu_time_total / 1e6
    return (dict(seconds), dict(types)) if by_type else dict(seconds)


# ----------------------------------------------------------------------------- per unit of work


def per_unit_ms(seconds: float, op_s: dict, units: float, others_share: float) -> dict:
    """ms per unit (example, or 1,000 tokens) of each kind; ``outside ops`` is the wall time no op accounts
    for; ``others' CPU`` the share of the machine other processes used meanwhile."""
    row = {kind: 1000 * op_s.get(kind, 0.0) / units for kind in KINDS[:-1]}
    row["outside ops"] = max(0.0, 1000 * (seconds - sum(op_s.values())) / units)
    row["total"] = 1000 * seconds / units
    row["others' CPU"] = others_share
    return {k: round(v, 3) for k, v in row.items()}
