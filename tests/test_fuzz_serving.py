"""The model server on generated requests: REST bodies no one wrote by hand (random JSON, truncated JSON, wrong
types, huge numbers, deep nesting, bytes that are not UTF-8) and gRPC ``TensorProto`` s of any dtype, shape and
values.

REST: every body gets a 2xx or a 4xx with a JSON ``{"error": ...}``, never a 5xx or a dropped connection, and the
server's memory stays flat over the run. gRPC: every Predict is answered or refused with a client's code
(INVALID_ARGUMENT, FAILED_PRECONDITION), never INTERNAL or UNKNOWN. The tiny string model of
``tests/small_runs.py`` (``save_length_model``) stands in for a GPT export: these are properties of the server.
``GPT_TF_FUZZ_EXAMPLES=N`` runs N examples per test.
"""

from __future__ import annotations

import http.client
import json

import grpc
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bench.soak import server_stats
from tests.small_runs import fuzz_settings, save_length_model, start_server, stop_servers

HOST = "127.0.0.1"
PATHS = ["/v1/models/sst2:predict", "/v1/models/sst2:classify", "/v1/models/sst2:regress",
         "/v1/models/sst2/versions/1:predict", "/v1/models/sst2/labels/stable:predict", "/v1/models/nope:predict",
         "/v1/models/sst2/versions/99999999999999999999:predict", "/v1/models/sst2/versions/2:classify"]

# ---------------------------------------------------------------------------------------------- bodies
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
NUMBERS = st.one_of(st.integers(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False, allow_infinity=False))
JSON = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT, st.fixed_dictionaries({"b64": TEXT})),
                    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=3)),
                    max_leaves=10)
KEYS = st.sampled_from(["instances", "inputs", "examples", "context", "signature_name", "sentence", "b64", "x"])
SHAPED = st.dictionaries(KEYS, st.one_of(JSON, st.lists(st.fixed_dictionaries({}, optional={"sentence": JSON}),
                                                        max_size=3)), max_size=3)
RAW = st.sampled_from([b"", b"{", b"[" * 99 + b"]" * 99, b"[" * 150 + b"]" * 150, b'{"instances": ' + b"[" * 99,
                       b'{"instances": ["\\ud800"]}', b'{"instances": [1e999]}', b'{"inputs": -Infinity}',
                       b'{"instances": [' + b"9" * 5000 + b"]}", b'{"instances": [NaN]}', b"\xff\xfe{}",
                       b'{"instances": ["a"], "instances": 1}', b'{"examples": [{"x": 99999999999999999999}]}'])


def as_body(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode("utf-8", "surrogatepass")


BODIES = st.one_of(
    JSON.map(as_body), SHAPED.map(as_body), RAW, st.binary(max_size=40),
    st.tuples(SHAPED.map(as_body), st.integers(0, 200)).map(lambda b: b[0][:b[1]]),  # truncated JSON
    st.integers(1, 400).map(lambda n: b'{"instances": ' + b"[" * n + b'"a"' + b"]" * n + b"}"),  # deep nesting
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``python -m serving.server`` on the length model (version 1, labelled ``stable``); its process and REST port."""
    root = tmp_path_factory.mktemp("fuzz_served")
    save_length_model(root / "sst2" / "1")
    config = root / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "sst2" base_path: "{root / "sst2"}" model_platform: '
                      '"tensorflow" model_version_policy { all {} } version_labels { key: "stable" value: 1 } } }\n')
    proc = start_server(root / "server.log", f"--model_config_file={config}", "--rest_api_num_threads=4",
                        "--max_request_bytes=200000")
    yield proc, proc.ports[1]
    stop_servers(proc)


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST on a fresh connection: (status, body). A dropped connection raises (and fails the test)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def assert_answered(status: int, answer: bytes, path: str, body: bytes) -> None:
    assert 200 <= status < 300 or 400 <= status < 500, (status, answer[:300], path, body[:300])
    payload = json.loads(answer)
    assert (status < 300) != ("error" in payload), (status, payload)


@pytest.fixture(scope="module")
def warmed(server):
    """The server after every kind of body once, twice over (RSS is read after, then again after the property)."""
    proc, port = server
    for _ in range(2):
        for body in [b"", b"{", b"[" * 150 + b"]" * 150, b'{"instances": ["abc", "de"]}', b'{"inputs": ["x"]}',
                     b'{"examples": [{"x": 1}]}', b"\xff", b'{"instances": [' + b"9" * 5000 + b"]}"]:
            for path in PATHS:
                post(port, path, body)
    return proc, port, server_stats(proc.pid)["rss_mb"]


@fuzz_settings(300)
@given(path=st.sampled_from(PATHS), body=BODIES)
@example(path="/v1/models/sst2:predict", body=b'{"instances": ["a gripping, funny film"]}')
@example(path="/v1/models/sst2:predict", body=b'{"instances": ' + b"[" * 65 + b'"a"' + b"]" * 65 + b"}")  # was a 500
def test_rest_answers_every_body_with_a_2xx_or_a_4xx(warmed, path, body):
    _, port, _ = warmed
    assert_answered(*post(port, path, body), path, body)


def test_rest_memory_stays_flat_over_the_generated_bodies(warmed):
    """After the property above (same module, same server): RSS within 10% (and 25 MB) of its level after the
    warm-up; the server still answers a good request."""
    proc, port, before = warmed
    status, answer = post(port, PATHS[0], b'{"instances": ["abc", "de"]}')
    assert status == 200 and json.loads(answer) == {"predictions": [3, 2]}
    after = server_stats(proc.pid)["rss_mb"]
    assert after < before * 1.10 or after < before + 25, (before, after)


# ---------------------------------------------------------------------------------------------- gRPC
@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """``PredictionService`` (the server's gRPC methods) over the length model loaded in this process."""
    from serving.grpc_service import PredictionService
    from serving.servable import Servable

    folder = tmp_path_factory.mktemp("fuzz_grpc") / "1"
    save_length_model(folder)
    servable = Servable("sst2", 1, str(folder))

    class Registry:
        def servable(self, name, version, label):
            return servable

    return PredictionService(Registry())


class Aborted(Exception):
    pass


class Context:
    """What a gRPC handler sees of its call: ``abort`` records the code and ends the call."""

    def abort(self, code, message):
        self.code, self.message = code, message
        raise Aborted(message)


def tensor_protos():
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2

    dims = st.lists(st.one_of(st.integers(-2, 4), st.sampled_from([2 ** 31, 2 ** 40, 10 ** 9, 2 ** 62, -2 ** 63])),
                    max_size=3)

    def build(dtype, shape, unknown, content, values):
        proto = tensor_pb2.TensorProto(dtype=dtype, tensor_content=content, tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in shape], unknown_rank=unknown))
        for field, items in values.items():
            if field == "float8_val":  # one bytes field, not a list
                proto.float8_val = items
            else:
                getattr(proto, field).extend(items)
        return proto

    i32, u32 = st.integers(-2 ** 31, 2 ** 31 - 1), st.integers(0, 2 ** 32 - 1)
    fields = {"float_val": st.floats(width=32), "double_val": st.floats(), "int_val": i32, "half_val": i32,
              "string_val": st.binary(max_size=6), "int64_val": st.integers(-2 ** 63, 2 ** 63 - 1),
              "bool_val": st.booleans(), "uint32_val": u32, "uint64_val": st.integers(0, 2 ** 64 - 1),
              "scomplex_val": st.floats(width=32)}
    values = st.fixed_dictionaries({}, optional={**{k: st.lists(v, max_size=3) for k, v in fields.items()},
                                                 "float8_val": st.binary(max_size=3)})
    dtype = st.one_of(st.sampled_from([1, 2, 3, 4, 6, 7, 9, 10, 14, 19, 20, 21, 22, 23, 24, 101, 107, 120]),
                      st.integers(-3, 2 ** 31 - 1))
    return st.builds(build, dtype, dims, st.booleans(), st.binary(max_size=16), values)


@fuzz_settings(400)
@given(inputs=st.dictionaries(st.sampled_from(["sentence", "x", ""]), tensor_protos(), max_size=2),
       output_filter=st.lists(st.sampled_from(["length", "x"]), max_size=2),
       signature=st.sampled_from(["", "serving_default", "nope"]))
@example(inputs={"sentence": "DT_UINT8 [2] int_val 300"}, output_filter=[], signature="")  # OverflowError -> INTERNAL
@example(inputs={"sentence": "DT_STRING [1099511627776] string_val 'a'"}, output_filter=[], signature="")  # MemoryError
@example(inputs={"sentence": "DT_RESOURCE []"}, output_filter=[], signature="")  # KeyError -> INTERNAL
def test_grpc_predict_is_answered_or_refused_with_a_clients_code(service, inputs, output_filter, signature):
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = "sst2", signature
    request.output_filter.extend(output_filter)
    for alias, proto in inputs.items():
        request.inputs[alias].CopyFrom(proto if not isinstance(proto, str) else _named_proto(proto))
    context = Context()
    try:
        response = service.Predict(request, context)
    except Aborted:
        assert context.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION), (
            context.code, context.message)
        return
    assert set(response.outputs) == set(output_filter or ["length"])


def _named_proto(name: str):
    """The protos of the regression examples, by a short description."""
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2

    kind, dims, *values = name.split(" ")
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DataType.Value(kind))
    proto.tensor_shape.CopyFrom(tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=int(d)) for d in dims.strip("[]").split(",") if d]))
    if values:
        field, value = values
        getattr(proto, field).append(value.strip("'").encode() if field == "string_val" else int(value))
    return proto
