"""TF Serving's Predict messages without TensorFlow's start-up, and numpy arrays <-> ``TensorProto``.

``tensorflow_serving.apis`` takes its messages' dependencies (``TensorProto`` and the like) from
``tensorflow.core``, inside the ``tensorflow`` package: importing them runs TensorFlow's whole start-up, most of a
gRPC client command's time (a command took 6.4 s with it and 0.37 s without, on a 2-core AMD EPYC Zen 3).
The client needs only the Predict call's messages. Their descriptors (``predict.proto`` and the files it imports,
as the installed ``tensorflow-serving-api`` defines them) ship in ``predict_descriptors.binpb``, a
``FileDescriptorSet`` that ``write_descriptors`` makes and ``tests/test_protos.py`` holds equal to the installed
package's. ``predict_messages`` builds the message classes from it in a descriptor pool of their own (not
protobuf's default pool, which TensorFlow's modules fill: the two never clash, and ``import tensorflow`` later in
the process runs as usual); ``predict_call`` is the gRPC method on a channel. The bytes on the wire are TF
Serving's: a message moves between the two classes by ``SerializeToString`` / ``FromString``.

``fill_proto`` / ``to_ndarray`` are the client's side of ``tf.make_tensor_proto`` / ``tf.make_ndarray`` for
the types a served model takes and gives (strings, floats, integers, booleans); tests/test_protos.py checks
them against TensorFlow's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

DESCRIPTORS = Path(__file__).with_name("predict_descriptors.binpb")
PREDICT = "/tensorflow.serving.PredictionService/Predict"  # the gRPC method: /<package>.<service>/<method>


@functools.lru_cache(maxsize=None)
def predict_messages():
    """``(PredictRequest, PredictResponse)``: TF Serving's message classes, from the shipped descriptors."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for file in files.file:  # dependencies first, as write_descriptors orders them
        pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.serving.{name}"))
                 for name in ("PredictRequest", "PredictResponse"))


def message_class(file, full_name: str):
    """The class of message ``full_name`` of ``file`` (a ``FileDescriptorProto`` written in code, for TF Serving's
    config messages that tensorflow-serving-api does not ship), in a descriptor pool of its own."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))


def predict_call(channel):
    """The channel's Predict method: ``call(request, timeout=...)`` -> ``PredictResponse``."""
    request, response = predict_messages()
    return channel.unary_unary(PREDICT, request_serializer=request.SerializeToString,
                               response_deserializer=response.FromString)


def write_descriptors(path: Path = DESCRIPTORS) -> bytes:
    """Writes the ``FileDescriptorSet`` of the installed ``tensorflow-serving-api``'s ``predict.proto`` and every
    file it imports (dependencies first) to ``path``; returns its bytes. Run where that package (and TensorFlow)
    is installed, after an upgrade of it: ``python -c "import serving.protos as p; p.write_descriptors()"``."""
    from google.protobuf import descriptor_pb2
    from tensorflow_serving.apis import predict_pb2

    ordered, seen = [], set()

    def visit(file):
        if file.name in seen:
            return
        seen.add(file.name)
        for dependency in file.dependencies:
            visit(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        ordered.append(proto)

    visit(predict_pb2.DESCRIPTOR)
    data = descriptor_pb2.FileDescriptorSet(file=ordered).SerializeToString(deterministic=True)
    Path(path).write_bytes(data)
    return data


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
