"""Prometheus metrics (``serving.monitoring``, ``--monitoring_config_file``), read back with the
``prometheus_client`` text parser: the renderer on its own, then one server under gRPC and REST traffic
(requests that succeed and fail, a version that fails to load, batching, scrapes under load).

A tiny string model (``sentence`` -> its ``length``) stands in for a GPT export.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving import monitoring
from serving.errors import ServingError, not_found
from tests.small_runs import save_length_model, start_server, stop_servers

HOST = "127.0.0.1"
COUNT = ":tensorflow:serving:request_count"
LATENCY = ":tensorflow:serving:request_latency"
BATCH = ":tensorflow:serving:batching_session:processed_batch_size"
LOADS = ":tensorflow:cc:saved_model:load_attempt_count"


def samples(text: str) -> dict:
    """``{(sample name, frozenset of its labels): value}`` of a scrape, as the Prometheus client parses it
    (a counter's samples are named ``<name>_total`` there)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(parsed: dict, name: str, **labels) -> float:
    return parsed.get((name, frozenset(labels.items())), 0)


# ---------------------------------------------------------------------------------------------- the renderer
def test_counters_and_histograms_read_back_with_escaped_labels():
    registry = monitoring.Registry()
    counter = registry.counter("/test/requests", 'Requests "served"\\ by\nthe server.', ("model", "code"))
    histogram = registry.histogram("/test/latency", "Latency.", ("model",), (1.0, 2.5, 10.0))
    bare = registry.histogram("/test/sizes", "Sizes.", (), monitoring.exponential_buckets(1, 2, 3))
    odd = 'a "quoted"\\back\nslashed'
    registry.add((counter, (odd, "OK"), 3), (counter, ("plain", "NOT_FOUND"), 1), (counter, (odd, "OK"), 2))
    for sample in (0.5, 1.0, 2.0, 7.0, 11.0):  # 1.0 lands in le="1": Prometheus buckets are inclusive
        registry.add((histogram, (odd,), sample))
    registry.add((bare, (), 3))
    text = registry.render()
    assert "# TYPE :test:requests counter" in text and "# TYPE :test:latency histogram" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families[":test:requests"].documentation == 'Requests "served"\\ by\nthe server.'
    parsed = samples(text)
    assert value(parsed, ":test:requests_total", model=odd, code="OK") == 5
    assert value(parsed, ":test:requests_total", model="plain", code="NOT_FOUND") == 1
    buckets = {le: value(parsed, ":test:latency_bucket", model=odd, le=le) for le in ("1", "2.5", "10", "+Inf")}
    assert buckets == {"1": 2, "2.5": 3, "10": 4, "+Inf": 5}
    assert value(parsed, ":test:latency_sum", model=odd) == 21.5
    assert value(parsed, ":test:latency_count", model=odd) == 5
    assert [value(parsed, ":test:sizes_bucket", le=le) for le in ("1", "2", "4", "+Inf")] == [0, 0, 1, 1]
    registry.reset()
    assert samples(registry.render()) == {}


def test_names_buckets_and_label_checks_are_tf_servings():
    assert monitoring.prometheus_name("/tensorflow/serving/request_count") == COUNT
    assert monitoring.exponential_buckets(10, 1.8, 33)[:4] == (10, 18, 32.4, 58.32)
    assert len(monitoring.REQUEST_LATENCY.bounds) == 33 and monitoring.PROCESSED_BATCH_SIZE.bounds[-1] == 8192
    with pytest.raises(ValueError, match="invalid label names"):
        monitoring.Registry().counter("/x", "x", ("bad-name",))
    with pytest.raises(ValueError, match="'le'"):
        monitoring.Registry().histogram("/x", "x", ("le",), (1,))


def test_label_sets_past_the_cap_are_counted_together(monkeypatch):
    monkeypatch.setattr(monitoring, "MAX_SERIES", 3)
    registry = monitoring.Registry()
    counter = registry.counter("/test/requests", "Requests.", ("model",))
    registry.add(*[(counter, (f"made-up-{i}",), 1) for i in range(10)])
    parsed = samples(registry.render())
    assert len(parsed) == 3 + 1 and value(parsed, ":test:requests_total", model=monitoring.OTHER) == 7


def test_a_call_records_its_status():
    """As the gRPC methods use it: the exception that ends the block is the status (INTERNAL for a bug)."""
    from tensorflow_serving.apis import model_pb2

    monitoring.REGISTRY.reset()
    spec = model_pb2.ModelSpec(name="m")
    spec.version.value = 4
    for error in (not_found("no"), RuntimeError("bug")):
        with pytest.raises(type(error)), monitoring.Call("GRPC", "Regress", spec, "s"):
            raise error
    parsed = samples(monitoring.REGISTRY.render())
    labels = {"model_name": "m", "version": "4", "signature_name": "s", "API": "Regress", "entrypoint": "GRPC"}
    assert value(parsed, COUNT + "_total", **labels, status="NOT_FOUND") == 1
    assert value(parsed, COUNT + "_total", **labels, status="INTERNAL") == 1
    monitoring.REGISTRY.reset()


def test_monitoring_config_files(tmp_path):
    def read(text: str) -> str:
        path = tmp_path / "monitoring.config"
        path.write_text(text)
        return monitoring.read_monitoring_config(str(path))

    assert read('prometheus_config { enable: true path: "/metrics" }') == "/metrics"
    assert read("prometheus_config { enable: true }") == monitoring.PROMETHEUS_PATH
    assert read('prometheus_config { enable: false path: "/metrics" }') == read("") == ""
    with pytest.raises(ValueError, match="monitoring.config: not a MonitoringConfig text proto"):
        read("prometheus_config { enabled: true }")
    with pytest.raises(ValueError, match="must start with '/'"):
        read('prometheus_config { enable: true path: "metrics" }')
    with pytest.raises(ValueError, match="missing.config: cannot read it"):
        monitoring.read_monitoring_config(str(tmp_path / "missing.config"))


# ---------------------------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the end-to-end tests: model ``sst2`` (all versions) with a good version 1 and a corrupt
    version 2, batching on, metrics at /metrics; ``(grpc port, rest port, base path)``."""
    root = tmp_path_factory.mktemp("metrics")
    save_length_model(root / "sst2" / "1")
    save_length_model(root / "sst2" / "2")
    (root / "sst2" / "2" / "saved_model.pb").write_bytes(b"not a SavedModel")
    (root / "models.config").write_text(
        f'model_config_list {{ config {{ name: "sst2" base_path: "{root / "sst2"}" '
        "model_version_policy { all {} } } }")
    (root / "monitoring.config").write_text('prometheus_config { enable: true path: "/metrics" }')
    proc = start_server(root / "server.log", f"--model_config_file={root / 'models.config'}",
                        f"--monitoring_config_file={root / 'monitoring.config'}", "--enable_batching",
                        "--max_num_load_retries=0", "--file_system_poll_wait_seconds=0")
    try:
        yield *proc.ports, root / "sst2"
    finally:
        stop_servers(proc)


def scrape(port: int, path: str = "/metrics") -> tuple:
    """``(status, content type, body)`` of a GET on the REST port."""
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read().decode("utf-8")
    finally:
        conn.close()


class Clients:
    """A gRPC stub and a keep-alive REST connection to the server."""

    def __init__(self, grpc_port: int, rest_port: int):
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        self._channel = grpc.insecure_channel(f"{HOST}:{grpc_port}")
        self.stub = prediction_service_pb2_grpc.PredictionServiceStub(self._channel)
        self.rest = http.client.HTTPConnection(HOST, rest_port, timeout=30)

    def grpc_predict(self, model: str, sentences: list, version: int | None = None, name: str = "sentence"):
        """The lengths, or the ServingError the server answered."""
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2

        request = predict_pb2.PredictRequest()
        request.model_spec.name = model
        if version is not None:
            request.model_spec.version.value = version
        request.inputs[name].CopyFrom(tf.make_tensor_proto(sentences))
        try:
            return list(tf.make_ndarray(self.stub.Predict(request, timeout=30).outputs["length"]))
        except grpc.RpcError as err:
            return ServingError(err.code(), err.details())

    def grpc_metadata(self, model: str):
        from tensorflow_serving.apis import get_model_metadata_pb2

        request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
        request.model_spec.name = model
        return self.stub.GetModelMetadata(request, timeout=30)

    def rest_predict(self, path: str, body) -> int:
        """The HTTP status of a POST to ``path`` (a dict body as JSON)."""
        self.rest.request("POST", path, body if isinstance(body, bytes) else json.dumps(body).encode())
        response = self.rest.getresponse()
        response.read()
        return response.status

    def close(self) -> None:
        self._channel.close()
        self.rest.close()


def test_requests_loads_and_batches_are_counted(server):
    """N gRPC and M REST predictions, failed ones of each kind, one GetModelMetadata: every label set reads
    exactly its count, with as many latencies; batches hold exactly the rows sent; the corrupt version 2
    shows as a failed load and version 1 as a loaded one."""
    grpc_port, rest_port, base = server
    clients = Clients(grpc_port, rest_port)
    n, m = 7, 5
    rows = 0
    for i in range(n):  # half with the version named, half the latest: both are served by version 1
        assert clients.grpc_predict("sst2", ["a" * i] * (i % 3 + 1), version=1 if i % 2 else None) == [i] * (i % 3 + 1)
        rows += i % 3 + 1
    for i in range(m):
        assert clients.rest_predict("/v1/models/sst2:predict", {"instances": ["xy"] * (i + 1)}) == 200
        rows += i + 1
    failures = [clients.grpc_predict("nope", ["a"]), clients.grpc_predict("sst2", ["a"], name="text"),
                clients.grpc_predict("sst2", ["a"], version=2)]
    assert [f.code for f in failures] == [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                                          grpc.StatusCode.NOT_FOUND]
    assert [clients.rest_predict("/v1/models/nope:predict", {"instances": ["a"]}),
            clients.rest_predict("/v1/models/sst2:predict", {"inputs": {"text": ["a"]}}),
            clients.rest_predict("/v1/models/sst2:predict", b"{not json")] == [404, 400, 400]
    clients.grpc_metadata("sst2")
    clients.close()

    status, content_type, text = scrape(rest_port)
    assert status == 200 and content_type == monitoring.CONTENT_TYPE
    parsed = samples(text)
    expected = {  # (model, version, signature, API, entrypoint, status): requests
        ("sst2", "1", "serving_default", "Predict", "GRPC", "OK"): n,
        ("sst2", "1", "serving_default", "predict", "REST", "OK"): m,
        ("nope", "", "serving_default", "Predict", "GRPC", "NOT_FOUND"): 1,
        ("sst2", "1", "serving_default", "Predict", "GRPC", "INVALID_ARGUMENT"): 1,
        ("sst2", "2", "serving_default", "Predict", "GRPC", "NOT_FOUND"): 1,
        ("nope", "", "serving_default", "predict", "REST", "NOT_FOUND"): 1,
        ("sst2", "1", "serving_default", "predict", "REST", "INVALID_ARGUMENT"): 1,
        ("sst2", "", "", "predict", "REST", "INVALID_ARGUMENT"): 1,  # its body never parsed
        ("sst2", "1", "", "GetModelMetadata", "GRPC", "OK"): 1,
    }
    counted = {tuple(dict(labels)[k] for k in monitoring.REQUEST_LABELS): v
               for (name, labels), v in parsed.items() if name == COUNT + "_total"}
    assert counted == expected
    for key, count in expected.items():
        labels = dict(zip(monitoring.REQUEST_LABELS, key))
        assert value(parsed, LATENCY + "_count", **labels) == count
        assert value(parsed, LATENCY + "_bucket", **labels, le="+Inf") == count
        assert value(parsed, LATENCY + "_sum", **labels) > 0
    assert value(parsed, BATCH + "_count") == n + m  # sequential requests: one batch each
    assert value(parsed, BATCH + "_sum") == rows
    assert value(parsed, LOADS + "_total", model_path=str(base / "1"), status="success") == 1
    assert value(parsed, LOADS + "_total", model_path=str(base / "2"), status="fail") == 1
    assert scrape(rest_port, "/monitoring/prometheus/metrics")[0] == 404  # only the configured path


def test_scrapes_under_load_take_no_request_down(server):
    """Clients predict without pause over gRPC and REST while the metrics are scraped in a loop: no request
    fails, every scrape parses, and the counts grow by exactly the requests answered."""
    grpc_port, rest_port, _ = server
    before = samples(scrape(rest_port)[2])
    stop, errors, answered = threading.Event(), [], []  # entrypoints of the requests answered

    def client(entrypoint: str):
        clients = Clients(grpc_port, rest_port)
        try:
            while not stop.is_set():
                if entrypoint == "GRPC":
                    ok = clients.grpc_predict("sst2", ["abc", "de"]) == [3, 2]
                else:
                    ok = clients.rest_predict("/v1/models/sst2:predict", {"instances": ["abc"]}) == 200
                (answered if ok else errors).append(entrypoint)
        except Exception as err:  # noqa: BLE001 -- a dropped connection is a failure of the test, reported below
            errors.append(repr(err))
        finally:
            clients.close()

    threads = [threading.Thread(target=client, args=(e,)) for e in ("GRPC", "REST", "GRPC", "REST")]
    for thread in threads:
        thread.start()
    scrapes, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        status, _, text = scrape(rest_port)
        assert status == 200 and samples(text)
        scrapes += 1
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and scrapes >= 10 and set(answered) == {"GRPC", "REST"}, (errors, scrapes)
    after = samples(scrape(rest_port)[2])
    for entrypoint, api in (("GRPC", "Predict"), ("REST", "predict")):
        labels = {"model_name": "sst2", "version": "1", "signature_name": "serving_default", "API": api,
                  "entrypoint": entrypoint, "status": "OK"}
        grown = value(after, COUNT + "_total", **labels) - value(before, COUNT + "_total", **labels)
        assert grown == answered.count(entrypoint)
        assert value(after, LATENCY + "_count", **labels) == value(after, COUNT + "_total", **labels)
