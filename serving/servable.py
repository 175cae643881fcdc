"""One loaded model version: TF Serving's Predict / Classify / Regress semantics over a SavedModel.

The SavedModel is loaded with ``tf.saved_model.load`` (nothing else is imported). Its lookup
tables (the tokenizer's) are resources of the process's eager context that outlive the loaded
object, so when the last reference to an unloaded version goes they are destroyed explicitly
(``_destroy_resources``; their handles are unique per load, so a newer version of the same model
keeps its own). Likewise the gradients ``tf.saved_model.load`` registers for the model's custom-gradient
ops (Keras layers use ``tf.custom_gradient``): TensorFlow's global gradient registry holds them under
op types unique to that load, and through them every function of the model (each with its runtime
instantiations, ~0.5 GB for a ``test``-preset GPT export), so they are unregistered with the tables. Its
SignatureDefs are read from ``saved_model.pb`` (method names, input/output TensorInfos, as
GetModelMetadata reports them), and requests are checked against them before they run, with
TF Serving's status codes and messages: an unknown signature (FAILED_PRECONDITION for Predict,
INVALID_ARGUMENT for Classify / Regress), missing or extra inputs, a wrong dtype or shape, an
unknown output filter (INVALID_ARGUMENT). Errors raised in the graph keep their own code.
Classify / Regress run any signature with one ``inputs`` tensor and ``classes`` / ``scores``
(``outputs``) outputs; the method name is checked only with ``method_name_check`` (TF Serving's
``--enable_signature_method_name_check``, off by default there too).
"""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_resource_variable_ops

from serving.batcher import Batcher, BatchingParameters
from serving.errors import ServingError, from_tf_error, invalid
from serving.requests import examples_from_input, inputs_from_protos
from serving.saved_model_io import METHOD_NAMES, read_warmup

DEFAULT_SIGNATURE = "serving_default"
PREDICT_METHOD = "tensorflow/serving/predict"
_INTERNAL_SIGNATURES = ("__saved_model_init_op",)


def _set(names) -> str:
    return "{" + ",".join(sorted(names)) + "}"


def read_signature_defs(export_dir: str) -> dict:
    """``{name: SignatureDef}`` of a SavedModel's (single) MetaGraph, internal ones left out."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    signatures = proto.meta_graphs[0].signature_def
    return {name: signatures[name] for name in signatures if name not in _INTERNAL_SIGNATURES}


def _compatible(shape: tuple, info) -> bool:
    if info.tensor_shape.unknown_rank:
        return True
    dims = [d.size for d in info.tensor_shape.dim]
    return len(dims) == len(shape) and all(d < 0 or d == s for d, s in zip(dims, shape))


def _shape_text(info) -> str:
    if info.tensor_shape.unknown_rank:
        return "[?]"
    return "[" + ",".join(str(d.size) if d.size >= 0 else "?" for d in info.tensor_shape.dim) + "]"


def _table_handles(loaded) -> list:
    """Handles of the loaded object's resources other than variables (lookup tables); variables free themselves."""
    handles = []
    for obj in tf.train.TrackableView(loaded).descendants():
        if isinstance(obj, tf.Variable) or not hasattr(type(obj), "resource_handle"):
            continue
        handle = getattr(obj, "_resource_handle", None)
        if handle is not None:
            handles.append(handle)
    return handles


_GRADIENTS = ops._gradient_registry._registry  # pylint: disable=protected-access -- {op type: gradient}
_LOAD_LOCK = threading.Lock()  # loads in turn: the gradients one registers are the registry's new keys


def _load(path: str) -> tuple:
    """``tf.saved_model.load(path)`` and the op types of the gradients it registered (none left by a failed load)."""
    with _LOAD_LOCK:
        before = set(_GRADIENTS)
        try:
            loaded = tf.saved_model.load(path)
        finally:
            registered = [op_type for op_type in list(_GRADIENTS) if op_type not in before]
            if "loaded" not in locals():
                _unregister_gradients(registered)
        return loaded, registered


def _unregister_gradients(op_types) -> None:
    for op_type in op_types:
        _GRADIENTS.pop(op_type, None)


def _destroy_resources(handles) -> None:
    for handle in handles:
        try:
            gen_resource_variable_ops.destroy_resource_op(handle, ignore_lookup_error=True)
        except Exception:  # noqa: BLE001 -- already gone, or the interpreter is shutting down
            pass


class Servable:
    """``<base>/<name>/<version>`` loaded and ready to answer (optionally batching requests)."""

    def __init__(self, name: str, version: int, path: str, batching: BatchingParameters | None = None,
                 method_name_check: bool = False):
        self.name, self.version, self.path = name, version, path
        self.method_name_check = method_name_check
        self.signature_defs = read_signature_defs(path)
        self._loaded, self._gradients = _load(path)
        self._functions = dict(self._loaded.signatures)
        self._tables = _table_handles(self._loaded)
        self._batchers = {}
        if batching is not None:
            self._batchers = {sig: Batcher(lambda inputs, s=sig: self._call(s, inputs), batching, f"{name}-{version}")
                              for sig in self._functions}

    def close(self) -> None:
        """Drains and stops the batch threads (requests already holding this servable still finish).

        Its tables are destroyed and its gradients unregistered when the last reference to it goes
        (``__del__``: a request may still be running in it); dropping the batchers breaks their reference
        cycle back to it.
        """
        for batcher in self._batchers.values():
            batcher.close()
        self._batchers = {}

    def __del__(self):
        _destroy_resources(getattr(self, "_tables", ()))
        _unregister_gradients(getattr(self, "_gradients", ()))

    # ------------------------------------------------------------------ running
    def _call(self, signature: str, inputs: dict) -> dict:
        try:
            outputs = self._functions[signature](**{k: tf.constant(v) for k, v in inputs.items()})
        except tf.errors.OpError as err:
            raise from_tf_error(err) from None
        return {k: v.numpy() for k, v in outputs.items()}

    def run(self, signature: str, inputs: dict) -> dict:
        """Validated inputs -> all outputs, through the batcher when batching is on."""
        batcher = self._batchers.get(signature)
        return batcher(inputs) if batcher else self._call(signature, inputs)

    def _validate(self, signature: str, inputs: dict) -> dict:
        """Numpy inputs checked against the SignatureDef (names, dtypes, shapes)."""
        infos = self.signature_defs[signature].inputs
        if set(inputs) != set(infos):
            raise invalid(
                f"input size does not match signature: {len(inputs)}!={len(infos)} len({_set(inputs)}) != "
                f"len({_set(infos)}). Sent extra: {_set(set(inputs) - set(infos))}. "
                f"Missing but required: {_set(set(infos) - set(inputs))}.")
        checked = {}
        for index, name in enumerate(sorted(infos)):
            info, value = infos[name], inputs[name]
            want = tf.dtypes.as_dtype(info.dtype)
            got = tf.dtypes.as_dtype(value.dtype) if value.dtype != object else tf.string
            if got != want:
                raise invalid(f"Expects arg[{index}] ('{name}') to be {want.name} but {got.name} is provided")
            if not _compatible(value.shape, info):
                raise invalid(f"input '{name}' has shape {list(value.shape)}, which does not match the "
                              f"signature's {_shape_text(info)}")
            checked[name] = value
        return checked

    def predict(self, signature: str, inputs: dict, output_filter=()) -> dict:
        """TF Serving's Predict: ``{name: np.ndarray}`` -> ``{output alias: np.ndarray}``."""
        signature = signature or DEFAULT_SIGNATURE
        if signature not in self.signature_defs:
            raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                               f'Serving signature key "{signature}" not found.')
        outputs = self.signature_defs[signature].outputs
        for alias in output_filter:
            if alias not in outputs:
                raise invalid(f"output tensor alias not found in signature: {alias} Outputs expected to be in the "
                              f"set {_set(outputs)}.")
        if len(set(output_filter)) != len(output_filter):
            raise invalid(f"duplicate output tensor alias in {list(output_filter)}")
        result = self.run(signature, self._validate(signature, inputs))
        return {k: result[k] for k in (output_filter or result)}

    def _examples_signature(self, signature: str, method: str) -> str:
        """The signature a Classify / Regress request names, checked as TF Serving checks it."""
        signature = signature or DEFAULT_SIGNATURE
        if signature not in self.signature_defs:
            raise invalid(f"No signature was found with the name: {signature}")
        definition = self.signature_defs[signature]
        kind = "classification" if method == "classify" else "regression"
        if self.method_name_check and definition.method_name != METHOD_NAMES[method]:
            raise invalid(f"Expected {kind} signature method_name to be {METHOD_NAMES[method]}. "
                          f"Was: {definition.method_name}")
        if len(definition.inputs) != 1:
            raise invalid("Expected one input Tensor.")
        if "inputs" not in definition.inputs:
            raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"No {kind} inputs found in SignatureDef {signature!r}")
        wanted = ("classes", "scores") if method == "classify" else ("outputs",)
        if not set(wanted) & set(definition.outputs):
            raise ServingError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"Expected {kind} signature outputs to contain at least one of {wanted}; "
                               f"{signature!r} has {sorted(definition.outputs)}")
        return signature

    def classify(self, signature: str, examples: np.ndarray) -> tuple:
        """TF Serving's Classify over serialized ``tf.Example`` s: (classes or None, scores or None)."""
        signature = self._examples_signature(signature, "classify")
        out = self.run(signature, self._validate(signature, {"inputs": examples}))
        return out.get("classes"), out.get("scores")

    def regress(self, signature: str, examples: np.ndarray) -> np.ndarray:
        """TF Serving's Regress over serialized ``tf.Example`` s: one value per example."""
        signature = self._examples_signature(signature, "regress")
        out = self.run(signature, self._validate(signature, {"inputs": examples}))["outputs"]
        if np.size(out) != len(examples):
            raise invalid(f"Expected output Tensor shape to be [{len(examples)}] or [{len(examples)},1]; "
                          f"got {list(np.shape(out))}")
        return np.reshape(out, [len(examples)])

    def warm_up(self) -> int:
        """Replays ``assets.extra/tf_serving_warmup_requests``; returns how many records ran."""
        records = read_warmup(self.path)
        for record in records:
            kind = record.WhichOneof("log_type")
            if kind == "predict_log":
                request = record.predict_log.request
                self.predict(request.model_spec.signature_name, inputs_from_protos(request.inputs),
                             list(request.output_filter))
            elif kind in ("classify_log", "regress_log"):
                request = getattr(record, kind).request
                examples = examples_from_input(request.input)
                run = self.classify if kind == "classify_log" else self.regress
                run(request.model_spec.signature_name, examples)
            else:
                raise ValueError(f"{self.path}: warm-up record of unsupported type {kind!r}")
        return len(records)
