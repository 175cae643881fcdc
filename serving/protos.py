"""TF Serving's gRPC messages without TensorFlow's start-up, and numpy arrays <-> ``TensorProto``.

``tensorflow_serving.apis`` takes its messages' dependencies (``TensorProto`` and the like) from
``tensorflow.core``: plain generated protobuf modules inside the ``tensorflow`` package. Importing them the
usual way runs ``tensorflow/__init__.py`` first, TensorFlow's whole start-up: most of a gRPC client
command's time (a command took 6.4 s with it and 0.37 s without, the messages ~0.2 s of that, on a 2-core
AMD EPYC Zen 3, 2026-11-26).
``serving_apis()`` imports them under a bare stand-in for the ``tensorflow`` package (its folder, none of
its ``__init__``), then takes the stand-in away: a later ``import tensorflow`` in the process runs as usual
and reuses these message modules, so the process has one ``TensorProto`` class. Where TensorFlow is
already imported, the usual imports run.

``fill_proto`` / ``to_ndarray`` are the client's side of ``tf.make_tensor_proto`` / ``tf.make_ndarray`` for
the types a served model takes and gives (strings, floats, integers, booleans); tests/test_protos.py checks
them against TensorFlow's.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

import numpy as np

_LOCK = threading.Lock()


def serving_apis():
    """``(predict_pb2, prediction_service_pb2_grpc)``, without TensorFlow's start-up."""
    with _LOCK:
        stand_in = None
        if "tensorflow" not in sys.modules:
            spec = importlib.util.find_spec("tensorflow")
            if spec is None or not spec.submodule_search_locations:
                raise ImportError("serving.client over gRPC needs the tensorflow package installed (TF Serving's "
                                  "messages live in it)")
            stand_in = types.ModuleType("tensorflow")
            stand_in.__path__ = list(spec.submodule_search_locations)
            sys.modules["tensorflow"] = stand_in
        try:
            from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
        finally:
            if stand_in is not None and sys.modules.get("tensorflow") is stand_in:
                del sys.modules["tensorflow"]
    return predict_pb2, prediction_service_pb2_grpc


# DataType number -> (numpy dtype, the TensorProto field its values sit in when not in tensor_content).
# The numbers are tensorflow/core/framework/types.proto's (DT_FLOAT = 1, ...), fixed by the wire format.
_TYPES = {1: (np.float32, "float_val"), 2: (np.float64, "double_val"), 3: (np.int32, "int_val"),
          4: (np.uint8, "int_val"), 5: (np.int16, "int_val"), 6: (np.int8, "int_val"), 7: (object, "string_val"),
          9: (np.int64, "int64_val"), 10: (np.bool_, "bool_val"), 17: (np.uint16, "int_val"),
          19: (np.float16, "half_val")}
_NUMBERS = {np.dtype(dtype): number for number, (dtype, _) in _TYPES.items() if dtype is not object}
_INT32 = np.iinfo(np.int32)


def fill_proto(proto, value) -> None:
    """Writes ``value`` (a list, scalar or array) into the empty ``TensorProto`` ``proto`` (e.g. a request's
    ``inputs[name]``), typed as ``tf.make_tensor_proto`` types it: strings (``str`` as UTF-8) are DT_STRING;
    Python floats float32 and Python ints int32 (int64 where one does not fit), a numpy array or scalar keeps
    its dtype."""
    typed = isinstance(value, (np.ndarray, np.generic))
    array = np.asarray(value)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    if array.dtype.kind in "USO":
        if not typed:  # numpy's bytes dtype would drop a value's trailing NULs
            array = np.asarray(value, dtype=object)
        proto.dtype = 7
        proto.string_val.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.ravel())
        return
    if not typed and array.dtype == np.float64:
        array = array.astype(np.float32)
    elif not typed and array.dtype.kind == "i" and (array.size == 0 or _INT32.min <= array.min() <= array.max()
                                                    <= _INT32.max):
        array = array.astype(np.int32)
    if array.dtype not in _NUMBERS:
        raise ValueError(f"serving.client cannot send a tensor of {array.dtype}")
    proto.dtype = _NUMBERS[array.dtype]
    proto.tensor_content = np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()


def to_ndarray(proto, name: str = "tensor") -> np.ndarray:
    """A ``TensorProto`` as ``tf.make_ndarray`` gives it (strings as ``bytes`` in an object array); ``name``
    goes into the error for a type the client does not read."""
    if proto.dtype not in _TYPES:
        raise ValueError(f"{name}: serving.client cannot read a tensor of DataType {proto.dtype} "
                         "(tensorflow/core/framework/types.proto)")
    dtype, field = _TYPES[proto.dtype]
    shape = [d.size for d in proto.tensor_shape.dim]
    size = int(np.prod(shape))
    if proto.tensor_content:
        return np.frombuffer(proto.tensor_content, np.dtype(dtype).newbyteorder("<")).astype(dtype).reshape(shape)
    values = list(getattr(proto, field))
    if field == "half_val":
        values = np.asarray(values, np.uint16).view(np.float16)
    array = np.empty(len(values), dtype)
    array[:] = values  # not np.asarray(values): for bytes it would drop trailing NULs
    if not len(array):
        return np.zeros(shape, dtype) if dtype is not object else np.full(shape, b"", object)
    if len(array) < size:  # a shorter list is padded with its last value, as TensorFlow reads it
        array = np.concatenate([array, np.repeat(array[-1:], size - len(array))])
    return array[:size].reshape(shape)
