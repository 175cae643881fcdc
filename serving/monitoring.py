"""Prometheus metrics of the model server, as TF Serving exports them (``--monitoring_config_file``).

``read_monitoring_config`` reads TF Serving's ``MonitoringConfig`` text proto; with
``prometheus_config { enable: true }`` the REST port answers GET on its ``path`` (TF Serving's
``/monitoring/prometheus/metrics`` when none is given) with ``REGISTRY.render()``: the Prometheus text
format 0.0.4. Metric names, labels and buckets are TF Serving's where TF Serving has the metric, named
as its exporter names them (``/tensorflow/serving/request_count`` is ``:tensorflow:serving:request_count``);
latencies are in microseconds. Both request metrics carry model_name, version, signature_name, API,
entrypoint and status (TF Serving's count has model_name and status, its latency model_name, API and
entrypoint), and failed requests have latencies too, under their status: docs/serving.md lists them. A
sample equal to a bucket bound counts in that bucket (Prometheus's ``le``; TF's histograms put it in the next).

The hooks (``Call``, ``record_load``, ``record_batch_size``) take the registry's one lock once per
request, load or batch and only add numbers; a scrape copies the numbers under that lock and formats them
after releasing it, so it never holds up requests for longer than the copy.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
import threading
import time

import grpc

from serving.errors import ServingError
from serving.protos import message_class

PROMETHEUS_PATH = "/monitoring/prometheus/metrics"  # TF Serving's PrometheusExporter::kPrometheusPath
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_SERIES = 5_000  # label sets per metric; past it new ones are counted under OTHER (see _Metric)
OTHER = "__other__"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


# ---------------------------------------------------------------------------------------------- config file
@functools.lru_cache(maxsize=None)
def _monitoring_config_class():
    """TF Serving's ``MonitoringConfig`` (tensorflow_serving/config/monitoring_config.proto), which the
    tensorflow-serving-api package does not ship, built in a descriptor pool of its own."""
    from google.protobuf import descriptor_pb2

    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="tensorflow_serving/config/monitoring_config.proto",
                                              package="tensorflow.serving", syntax="proto3")
    prometheus = file.message_type.add(name="PrometheusConfig")
    prometheus.field.add(name="enable", number=1, type=field.TYPE_BOOL, label=field.LABEL_OPTIONAL)
    prometheus.field.add(name="path", number=2, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    config = file.message_type.add(name="MonitoringConfig")
    config.field.add(name="prometheus_config", number=1, type=field.TYPE_MESSAGE, label=field.LABEL_OPTIONAL,
                     type_name=".tensorflow.serving.PrometheusConfig")
    return message_class(file, "tensorflow.serving.MonitoringConfig")


def read_monitoring_config(path: str) -> str:
    """The metrics path a ``MonitoringConfig`` text proto file asks for ("" when Prometheus is not enabled)."""
    from google.protobuf import text_format

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--monitoring_config_file={path}: cannot read it: {err}") from None
    config = _monitoring_config_class()()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as err:
        raise ValueError(f"--monitoring_config_file={path}: not a MonitoringConfig text proto: {err}") from None
    prometheus = config.prometheus_config
    if not prometheus.enable:
        return ""
    metrics_path = prometheus.path or PROMETHEUS_PATH
    if not re.fullmatch(r"/[^\s?#]*", metrics_path):
        raise ValueError(f"--monitoring_config_file={path}: prometheus_config.path {metrics_path!r} must start with "
                         "'/' and hold no spaces, '?' or '#'")
    return metrics_path


# ---------------------------------------------------------------------------------------------- metrics
def prometheus_name(name: str) -> str:
    """A TF metric name as TF Serving's exporter names it: ``/a/b_c`` -> ``:a:b_c``."""
    name = re.sub(r"[^a-zA-Z0-9_]", ":", name)
    return "_" + name if name[:1].isdigit() else name


def exponential_buckets(scale: float, growth: float, count: int) -> tuple:
    """TF's ``Buckets::Exponential`` bounds (``scale * growth**i``), rounded to the 6 digits its exporter prints."""
    return tuple(float(f"{scale * growth ** i:.6g}") for i in range(count))


def _escape(text: str, quote: bool = True) -> str:
    """A label value (``quote``) or HELP text as the text format wants it: backslash, newline (and ``"``) escaped."""
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text.replace('"', '\\"') if quote else text


def _number(value) -> str:
    """A sample value or bucket bound: integral values without a fraction (``le="10"``, as TF Serving prints)."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)


class _Metric:
    """A metric's series, one per label-value tuple. Series are changed only under the registry's lock.

    Label values come from requests (a model name a client made up), so a metric keeps at most
    ``MAX_SERIES`` of them: later ones are added to the series whose every label is ``OTHER``, and the
    server's memory and a scrape's size stay bounded whatever clients send.
    """

    kind = ""

    def __init__(self, name: str, documentation: str, labels: tuple):
        bad = [label for label in labels if not _LABEL_NAME.fullmatch(label) or label.startswith("__")]
        if bad:
            raise ValueError(f"metric {name}: invalid label names {bad}")
        self.name, self.documentation, self.labels = prometheus_name(name), documentation, tuple(labels)
        self.series = {}

    def _key(self, values: tuple) -> tuple:
        if values in self.series or len(self.series) < MAX_SERIES:
            return values
        return (OTHER,) * len(values)

    def snapshot(self) -> dict:
        """A copy of the series (call under the lock)."""
        return dict(self.series)

    def _selector(self, values: tuple, *extra: str) -> str:
        """``{label="value",...}`` (nothing for a metric without labels), ``extra`` pairs last."""
        pairs = [f'{label}="{_escape(value)}"' for label, value in zip(self.labels, values)] + list(extra)
        return "{" + ",".join(pairs) + "}" if pairs else ""

    def exposition(self, series: dict) -> list:
        """The metric's lines of the text format, from a ``snapshot``."""
        lines = [f"# HELP {self.name} {_escape(self.documentation, quote=False)}", f"# TYPE {self.name} {self.kind}"]
        for values in sorted(series):
            lines += self._sample_lines(values, series[values])
        return lines


class Counter(_Metric):
    """A monotonic count per label set."""

    kind = "counter"

    def add(self, values: tuple, amount=1) -> None:
        key = self._key(values)
        self.series[key] = self.series.get(key, 0) + amount

    def _sample_lines(self, values: tuple, count) -> list:
        return [f"{self.name}{self._selector(values)} {_number(count)}"]


class Histogram(_Metric):
    """Samples counted into buckets (upper bounds ``bounds``, then +Inf) with their sum, per label set."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labels: tuple, bounds: tuple):
        if "le" in labels or list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram {name}: a label 'le' or bounds not strictly increasing")
        super().__init__(name, documentation, labels)
        self.bounds = tuple(bounds)

    def add(self, values: tuple, sample) -> None:
        key = self._key(values)
        cell = self.series.get(key)
        if cell is None:
            cell = self.series[key] = [0] * (len(self.bounds) + 1) + [0]  # per-bucket counts, +Inf, then the sum
        cell[bisect.bisect_left(self.bounds, sample)] += 1
        cell[-1] += sample

    def snapshot(self) -> dict:
        return {values: list(cell) for values, cell in self.series.items()}

    def _sample_lines(self, values: tuple, cell: list) -> list:
        lines, cumulative = [], 0
        for bound, count in zip(self.bounds + (math.inf,), cell):
            cumulative += count
            le = 'le="' + _number(float(bound)) + '"'
            lines.append(f"{self.name}_bucket{self._selector(values, le)} {cumulative}")
        lines.append(f"{self.name}_sum{self._selector(values)} {_number(cell[-1])}")
        lines.append(f"{self.name}_count{self._selector(values)} {cumulative}")
        return lines


class Registry:
    """Metrics under one lock: each hook takes it once, a scrape copies the numbers under it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._metrics = []

    def counter(self, name: str, documentation: str, labels: tuple = ()) -> Counter:
        return self._register(Counter(name, documentation, labels))

    def histogram(self, name: str, documentation: str, labels: tuple, bounds: tuple) -> Histogram:
        return self._register(Histogram(name, documentation, labels, bounds))

    def _register(self, metric):
        if any(m.name == metric.name for m in self._metrics):
            raise ValueError(f"metric {metric.name} is already registered")
        self._metrics.append(metric)
        return metric

    def add(self, *samples) -> None:
        """Adds each ``(metric, label values, value)`` under one acquisition of the lock."""
        with self._lock:
            for metric, values, value in samples:
                metric.add(values, value)

    def render(self) -> str:
        """The text exposition format (0.0.4) of every metric, formatted from a snapshot outside the lock."""
        with self._lock:
            snapshots = [(metric, metric.snapshot()) for metric in self._metrics]
        lines = []
        for metric, series in sorted(snapshots, key=lambda pair: pair[0].name):
            lines += metric.exposition(series)
        return "\n".join(lines) + "\n"

    def reset(self) -> None:
        """Forgets every series (tests start from zero)."""
        with self._lock:
            for metric in self._metrics:
                metric.series.clear()


# ---------------------------------------------------------------------------------------------- the server's
REGISTRY = Registry()
# TF Serving: servables/tensorflow/util.cc (request_count: model_name, status; request_latency: model_name,
# API, entrypoint, OK requests only, Exponential(10, 1.8, 33) microseconds, ~20 minutes).
REQUEST_LABELS = ("model_name", "version", "signature_name", "API", "entrypoint", "status")
REQUEST_COUNT = REGISTRY.counter("/tensorflow/serving/request_count", "The total number of requests.",
                                 REQUEST_LABELS)
REQUEST_LATENCY = REGISTRY.histogram(
    "/tensorflow/serving/request_latency",
    "Distribution of wall time (in microseconds) for Tensorflow Serving request.",
    REQUEST_LABELS, exponential_buckets(10, 1.8, 33))
# TF Serving: batching/batching_util.h (no labels; Exponential(1, 2, 14)).
PROCESSED_BATCH_SIZE = REGISTRY.histogram("/tensorflow/serving/batching_session/processed_batch_size",
                                          "Tracks the batch size distribution on processing.", (),
                                          exponential_buckets(1, 2, 14))
# TensorFlow: cc/saved_model/loader.cc (status "success" or "fail"; every attempt, retries included). TF Serving
# prints no HELP lines, so this one says what the metric counts rather than repeating TF's "successfully loaded".
LOAD_ATTEMPT_COUNT = REGISTRY.counter("/tensorflow/cc/saved_model/load_attempt_count",
                                      "The number of attempts to load a SavedModel, by status (success, fail).",
                                      ("model_path", "status"))


class Call:
    """One Predict / Classify / Regress / GetModelMetadata request: its labels, filled in as the request is
    understood (``identify``, ``served``, ``signature``), and its ``code``. ``done`` counts it and records
    its latency; a request never identified (a malformed REST path) is not counted. As a context manager
    (gRPC) the exception that ends the block sets the code, as ``grpc_service._handled`` answers it."""

    __slots__ = ("entrypoint", "api", "model", "version", "signature", "code", "_start")

    def __init__(self, entrypoint: str, api: str = "", spec=None, signature: str = ""):
        self._start = time.perf_counter_ns()
        self.entrypoint, self.code = entrypoint, grpc.StatusCode.OK
        self.api = self.model = self.version = self.signature = ""
        if api:
            self.identify(api, spec, signature)

    def identify(self, api: str, spec, signature: str = "") -> None:
        """The API and the ``ModelSpec`` asked for: its version (if it names one) until ``served`` is told."""
        self.api, self.model, self.signature = api, spec.name, signature
        self.version = str(spec.version.value) if spec.HasField("version") else ""

    def served(self, version: int) -> None:
        """The version that answers the request."""
        self.version = str(version)

    def done(self) -> None:
        if not self.api:
            return
        labels = (self.model, self.version, self.signature, self.api, self.entrypoint, self.code.name)
        micros = (time.perf_counter_ns() - self._start) // 1000
        REGISTRY.add((REQUEST_COUNT, labels, 1), (REQUEST_LATENCY, labels, micros))

    def __enter__(self) -> Call:
        return self

    def __exit__(self, kind, err, traceback) -> None:
        if err is not None:
            self.code = err.code if isinstance(err, ServingError) else grpc.StatusCode.INTERNAL
        self.done()


def record_load(model_path: str, ok: bool) -> None:
    """One attempt to load the SavedModel at ``model_path`` (a version's folder)."""
    REGISTRY.add((LOAD_ATTEMPT_COUNT, (model_path, "success" if ok else "fail"), 1))


def record_batch_size(rows: int) -> None:
    """One batch run by a batcher, of ``rows`` rows."""
    REGISTRY.add((PROCESSED_BATCH_SIZE, (), rows))
