"""What the end-to-end serving tests share: constants, the offline reference pipeline, request helpers."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from gpt_tf.tasks import get_task
from pipelines.finetune_data import tokenize_examples
from gpt_tf.data.task_readers import read_examples
from gpt_tf.data.transforms import special_ids_from_config, transform_record
from tests.small_runs import ENV  # noqa: F401 -- the servers' and CLIs' environment (tests/child_site on the path)

ROOT = Path(__file__).resolve().parents[2]
MAX_REQUEST_BYTES = 200_000
TOL = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def glue_examples(shared_data, task, folder, split, n):
    examples, _ = read_examples(get_task(task), shared_data / folder, split)
    return examples[:n]


def offline_features(task, examples, tokenizer, config):
    """The training pipeline's features: offline BPE, then transform_record (padded to n_ctx)."""
    records, _ = tokenize_examples(tokenizer, examples)
    ids, extract = [], []
    for r in records:
        record = {k: tf.constant(r[k], tf.int32) for k in ("tokens_a", "tokens_b", "choice_tokens", "choice_lengths")}
        record["label"] = tf.constant(-1.0)
        features, _ = transform_record(task, record, config.n_ctx, special_ids_from_config(config))
        ids.append(features["input_ids"].numpy())
        extract.append(features["extract_index"].numpy())
    return np.stack(ids), np.stack(extract)


def reference_probabilities(model, ids, extract):
    """The in-process model's class probabilities for the offline features (its graph, outside training: the LM
    weights are not read)."""
    inputs = {"input_ids": ids, "extract_index": extract, "lm_weights": np.zeros(ids.shape, np.float32)}
    out = model(inputs, training=False)
    return tf.nn.softmax(tf.cast(out, tf.float32)).numpy()


def stubs(port):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


def predict_request(model, inputs, signature="serving_default", version=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name, request.model_spec.signature_name = model, signature
    if version:
        request.model_spec.version.value = version
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(value if isinstance(value, type(request.inputs[name])) else
                                      tf.make_tensor_proto(value))
    return request


def rest(port, method, path, body=None, raw=None):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)  # a loaded machine, a version loading
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, json.loads(payload) if payload else None

