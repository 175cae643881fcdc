"""serving/protos.py: the gRPC client's TensorProtos read and written as TensorFlow reads and writes them, and
TF Serving's Predict messages built from the shipped descriptors, without TensorFlow's start-up."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from serving import protos
from tests.small_runs import ENV, ROOT, free_ports

VALUES = [["a b", "ünï"], [b"\xff\x00"], "x", [[["a"]]], np.array(["x", "yy"], object), [[1.5, 2.0]], 3, [1, 2],
          [2**40], [True, False], np.array([[1, 2]], np.int64), np.zeros((2, 3), np.float32),
          np.zeros((0, 3), np.float32), np.float64(2.5), np.array([1, -2], np.int8), np.array([3], np.uint8),
          np.array([1.5, -0.25], np.float16), np.array([7], np.int16)]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}:{np.asarray(v).dtype}{np.shape(v)}")
def test_fill_proto_types_and_holds_what_tensorflow_makes(value):
    """Same DataType as tf.make_tensor_proto (Python floats float32, ints int32 where they fit) and, read by
    TensorFlow (as a server reads a request), the same array."""
    ours, theirs = tensor_pb2.TensorProto(), tf.make_tensor_proto(value)
    protos.fill_proto(ours, value)
    assert ours.dtype == theirs.dtype
    read, expected = tf.make_ndarray(ours), tf.make_ndarray(theirs)  # bytes in, bytes out: exact on every CPU
    assert read.dtype == expected.dtype and read.shape == expected.shape and np.array_equal(read, expected)


@pytest.mark.parametrize("value", VALUES, ids=lambda v: f"{type(v).__name__}:{np.asarray(v).dtype}{np.shape(v)}")
def test_to_ndarray_reads_what_tensorflow_writes(value):
    proto = tf.make_tensor_proto(value)
    ours, theirs = protos.to_ndarray(proto), tf.make_ndarray(proto)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and np.array_equal(ours, theirs)


@pytest.mark.parametrize("fields", [{"dtype": 1, "float_val": [0.5]}, {"dtype": 3, "int_val": [1, 2, 3, 4]},
                                    {"dtype": 9, "int64_val": [5, 6]}, {"dtype": 7, "string_val": [b"q", b"r"]},
                                    {"dtype": 10, "bool_val": [True]}, {"dtype": 19, "half_val": [15360]},
                                    {"dtype": 2}])
@pytest.mark.parametrize("shape", [[4], [2, 2]])
def test_values_in_their_fields_are_read_as_tensorflow_reads_them(fields, shape):
    """A server may send values in ``float_val`` etc. instead of ``tensor_content``: a shorter list is padded
    with its last value, none gives zeros."""
    proto = tensor_pb2.TensorProto(**fields)
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    ours, theirs = protos.to_ndarray(proto), tf.make_ndarray(proto)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape and np.array_equal(ours, theirs)


def test_types_the_client_does_not_handle_are_named():
    with pytest.raises(ValueError, match=r"probabilities: .* DataType 8 "):
        protos.to_ndarray(tf.make_tensor_proto(np.array([1j], np.complex64)), "probabilities")
    with pytest.raises(ValueError, match="cannot send a tensor of complex64"):
        protos.fill_proto(tensor_pb2.TensorProto(), np.array([1j], np.complex64))


CLIENT_WITHOUT_TENSORFLOW = """
import sys
from serving.client import ServingClient
from serving.errors import ServingError
client = ServingClient("127.0.0.1", int(sys.argv[1]), timeout=5)
try:
    client.classify_texts("sst2", {"sentence": ["a gripping film"]})
except ServingError as err:
    print(err.code.name)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "tensorflow_serving")))
import tensorflow as tf  # imports whole afterwards; TF Serving's own classes read the client's bytes
from tensorflow_serving.apis import predict_pb2
request = client._request_class()
request.model_spec.name = "m"
request.inputs["x"].MergeFromString(tf.make_tensor_proto(["y"]).SerializeToString())
theirs = predict_pb2.PredictRequest.FromString(request.SerializeToString())
print(theirs.model_spec.name, tf.make_ndarray(theirs.inputs["x"]).tolist())
"""


def test_a_grpc_client_starts_without_tensorflow_and_tensorflow_still_imports_after():
    port = free_ports(1)[0]  # nothing listens there: the request fails as UNAVAILABLE
    proc = subprocess.run([sys.executable, "-c", CLIENT_WITHOUT_TENSORFLOW, str(port)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["UNAVAILABLE", "[]", "m [b'y']"], proc.stdout


def test_the_shipped_descriptors_are_the_installed_tf_serving_apis(tmp_path):
    """predict_descriptors.binpb is what write_descriptors makes from the installed tensorflow-serving-api: an
    upgrade that changes TF Serving's messages shows here (rewrite the file as write_descriptors says)."""
    from google.protobuf import descriptor_pb2
    from tensorflow_serving.apis import predict_pb2

    read = descriptor_pb2.FileDescriptorSet.FromString
    assert read(protos.DESCRIPTORS.read_bytes()) == read(protos.write_descriptors(tmp_path / "predict.binpb"))
    for ours, theirs in zip(protos.predict_messages(), (predict_pb2.PredictRequest, predict_pb2.PredictResponse)):
        assert ours.DESCRIPTOR.full_name == theirs.DESCRIPTOR.full_name
        assert [f.name for f in ours.DESCRIPTOR.fields] == [f.name for f in theirs.DESCRIPTOR.fields]
