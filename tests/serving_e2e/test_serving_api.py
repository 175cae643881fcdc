"""The server's gRPC and REST APIs on the exported models: TF Serving's protos, errors, a version swap
under load, the client (the set-up: conftest.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, get_model_metadata_pb2, regression_pb2

from gpt_tf.gpt1.backbone import token_inputs
from serving.client import ServingClient
from serving.errors import ServingError
from serving.saved_model_io import text_example
from tests.serving_e2e.helpers import ENV, MAX_REQUEST_BYTES, ROOT, TOL, predict_request, rest, stubs
from tests.small_runs import wait_for


# ---------------------------------------------------------------------------------------------- server
def test_grpc_text_in_probabilities_out(served, sst2_dev):
    """Text -> gRPC Predict / Classify -> the in-process model's probabilities; client library too."""
    grpc_port, _ = served
    texts, expected = sst2_dev
    stub = stubs(grpc_port)
    response = stub.Predict(predict_request("sst2", {"sentence": texts}))
    assert response.model_spec.version.value == 1 and response.model_spec.signature_name == "serving_default"
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["probabilities"]), expected, atol=TOL)
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name, request.model_spec.signature_name = "sst2", "classify"
    request.input.example_list.examples.extend(text_example({"sentence": t}) for t in texts[:3])
    result = stub.Classify(request).result
    for row, probs in zip(result.classifications, expected):
        assert [c.label for c in row.classes] == ["negative", "positive"]
        np.testing.assert_allclose([c.score for c in row.classes], probs, atol=TOL)
    client = ServingClient("127.0.0.1", grpc_port)
    results = client.classify_texts("sst2", {"sentence": texts})
    client.close()
    assert [r["label"] for r in results] == [("negative", "positive")[i] for i in expected.argmax(1)]
    np.testing.assert_allclose([list(r["probabilities"].values()) for r in results], expected, atol=TOL)


def test_rest_api(served, sst2_dev, exported, tokenizer):
    """REST predict (row and columnar), classify, regress, status and metadata; client over REST."""
    _, port = served
    texts, expected = sst2_dev
    status, body = rest(port, "POST", "/v1/models/sst2:predict", {"instances": [{"sentence": t} for t in texts]})
    assert status == 200, body
    np.testing.assert_allclose([p["probabilities"] for p in body["predictions"]], expected, atol=TOL)
    status, body = rest(port, "POST", "/v1/models/sst2/versions/1:predict",
                        {"inputs": {"sentence": texts[:2]}, "signature_name": "serving_default"})
    assert status == 200 and body["outputs"]["label_names"] == [("negative", "positive")[i] for i in
                                                                 expected[:2].argmax(1)]
    status, body = rest(port, "POST", "/v1/models/sst2:classify",
                        {"signature_name": "classify", "examples": [{"sentence": t} for t in texts[:2]]})
    assert status == 200 and [c[0] for c in body["results"][0]] == ["negative", "positive"]
    np.testing.assert_allclose([[c[1] for c in r] for r in body["results"]], expected[:2], atol=TOL)
    status, body = rest(port, "POST", "/v1/models/stsb:regress",
                        {"signature_name": "regress", "context": {"sentence2": "A man is dancing."},
                         "examples": [{"sentence1": "A man with a hat is dancing."}, {"sentence1": "A cat."}]})
    assert status == 200 and len(body["results"]) == 2
    status, body = rest(port, "POST", "/v1/models/stsb:predict",
                        {"instances": [{"sentence1": "A man with a hat is dancing.", "sentence2": "A man is dancing."}]})
    assert status == 200 and abs(body["predictions"][0] - rest_regress_first(port)) < TOL
    status, body = rest(port, "GET", "/v1/models/sst2")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    assert body["model_version_status"][0]["status"]["error_code"] == "OK"
    status, body = rest(port, "GET", "/v1/models/sst2/versions/1/metadata")
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert status == 200 and body["model_spec"]["version"] == "1"
    assert set(signatures) == {"serving_default", "tokens", "features", "classify"}
    assert signatures["classify"]["method_name"] == "tensorflow/serving/classify"
    assert list(signatures["serving_default"]["inputs"]) == ["sentence"]
    client = ServingClient("127.0.0.1", port, protocol="rest")
    results = client.classify_texts("sst2", {"sentence": texts[:3]})
    np.testing.assert_allclose([list(r["probabilities"].values()) for r in results], expected[:3], atol=TOL)
    over_grpc = ServingClient("127.0.0.1", served[0]).classify_texts("sst2", {"sentence": texts[:3]})
    assert over_grpc == results  # the same float32 values, printed at the same precision


def rest_regress_first(port):
    _, body = rest(port, "POST", "/v1/models/stsb:regress",
                   {"signature_name": "regress", "examples": [{"sentence1": "A man with a hat is dancing.",
                                                                "sentence2": "A man is dancing."}]})
    return body["results"][0]


def test_language_model_signatures(served, exported, tokenizer):
    """Served LM: token ids = offline BPE, next-token log-probs = the in-process LM's (BPE vocabulary)."""
    grpc_port, _ = served
    texts = ["The man walked into the room and", "it was a dark and stormy night"]
    words = {index: word for word, index in tokenizer.encoder.items()}
    response = stubs(grpc_port).Predict(predict_request("lm", {"text": texts}))
    out = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    for i, text in enumerate(texts):
        ids = tokenizer.encode(text)
        assert out["lengths"][i] == len(ids) and out["token_ids"][i][: len(ids)].tolist() == ids
        logits = exported["lm"](token_inputs([ids]), training=False)[0, -1, :40478]
        log_probs = tf.nn.log_softmax(logits).numpy()
        best = out["next_token_ids"][i]
        np.testing.assert_allclose(out["next_token_log_probs"][i], log_probs[best], atol=1e-4)
        assert out["next_token_log_probs"][i][-1] >= np.sort(log_probs)[-5] - 1e-4  # the 5 likeliest
        assert [t.decode() for t in out["next_tokens"][i]] == [words[j].replace("</w>", " ") for j in best]
        scored = out["token_log_probs"][i][1: len(ids)]
        every = tf.nn.log_softmax(exported["lm"](token_inputs([ids]), training=False)[0, :-1, :40478]).numpy()
        np.testing.assert_allclose(scored, every[np.arange(len(ids) - 1), ids[1:]], atol=1e-4)


def test_language_model_continues_texts_greedily_as_the_python_api_does(served, exported, tokenizer, base):
    """The ``generate`` signature (the Python API's cached generation, in core TF ops: no XLA op in the graph) gives
    each text the greedy continuation that ``generate_step`` without the cache gives in process, over gRPC and REST."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((base / "lm" / "1" / "saved_model.pb").read_bytes())
    ops = {n.op for g in proto.meta_graphs for f in g.graph_def.library.function for n in f.node_def}
    assert "While" in ops or "StatelessWhile" in ops
    assert not [op for op in ops if op.startswith("Xla")]  # stock TF Serving runs no XLA op without its JIT
    grpc_port, rest_port = served
    texts, counts = ["The man walked into the room and", "it was"], [6, 3]
    response = stubs(grpc_port).Predict(predict_request(
        "lm", {"text": texts, "max_new_tokens": np.array(counts, np.int32)}, "generate"))
    out = {k: tf.make_ndarray(v) for k, v in response.outputs.items()}
    _, body = rest(rest_port, "POST", "/v1/models/lm:predict", {"signature_name": "generate", "instances": [
        {"text": t, "max_new_tokens": n} for t, n in zip(texts, counts)]})
    lm = exported["lm"]
    lm.use_sampler("greedy")
    for i, (text, n) in enumerate(zip(texts, counts)):
        ids = tokenizer.encode(text)
        token_ids = np.zeros((1, len(ids) + n), np.int32)
        token_ids[0, : len(ids)] = ids
        inputs = {"token_ids": token_ids, "padding_mask": np.arange(len(ids) + n)[None, :] < len(ids)}
        want = lm.generate_step(inputs, use_cache=False)["token_ids"].numpy()[0, len(ids):].tolist()
        assert out["continuation_ids"][i].tolist() == want + [-1] * (max(counts) - n)
        assert out["continuation"][i].decode() == tokenizer.decode(want) == body["predictions"][i]["continuation"]


def test_bad_requests_get_tf_serving_codes_and_the_server_stays_up(served, sst2_dev):
    grpc_port, rest_port = served
    stub = stubs(grpc_port)
    string = tf.make_tensor_proto(["a fine film"])
    cases = [
        (predict_request("nope", {"sentence": string}), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
        (predict_request("sst2", {"sentence": string}, version=7), grpc.StatusCode.NOT_FOUND, "Specific(sst2, 7)"),
        (predict_request("sst2", {"sentence": string}, "nope"), grpc.StatusCode.FAILED_PRECONDITION, '"nope" not found'),
        (predict_request("sst2", {"sentence": np.array([1], np.int32)}), grpc.StatusCode.INVALID_ARGUMENT,
         "to be string but int32"),
        (predict_request("sst2", {"sentence": np.array([["a"]])}), grpc.StatusCode.INVALID_ARGUMENT, "shape [1, 1]"),
        (predict_request("sst2", {"text": string}), grpc.StatusCode.INVALID_ARGUMENT, "Missing but required: {sentence}"),
        (predict_request("sst2", {"sentence": tf.make_tensor_proto([], tf.string)}), grpc.StatusCode.INVALID_ARGUMENT,
         "empty batch"),
        (predict_request("sst2", {"sentence": np.array([b"caf\xe9"], object)}), grpc.StatusCode.INVALID_ARGUMENT,
         "not valid UTF-8"),
        (predict_request("sst2", {"sentence": [" "]}), grpc.StatusCode.INVALID_ARGUMENT, "encodes to no token"),
        (predict_request("sst2", {"input_ids": np.full([1, 1, 4], 99999, np.int32),
                                  "extract_index": np.zeros([1, 1], np.int32)}, "tokens"),
         grpc.StatusCode.INVALID_ARGUMENT, "input_ids must be <"),
        (predict_request("sst2", {"sentence": ["x" * (MAX_REQUEST_BYTES + 10)]}), grpc.StatusCode.RESOURCE_EXHAUSTED,
         ""),
    ]
    for request, code, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.Predict(request)
        assert err.value.code() == code and message in err.value.details(), (code, err.value.details())
    with pytest.raises(grpc.RpcError) as err:
        stub.Classify(classification_pb2.ClassificationRequest(model_spec={"name": "sst2", "signature_name": "classify"}))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Input is empty" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Regress(regression_pb2.RegressionRequest(model_spec={"name": "sst2"}))
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetModelMetadata(get_model_metadata_pb2.GetModelMetadataRequest(model_spec={"name": "sst2"},
                                                                            metadata_field=["x"]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    rest_cases = [
        ("POST", "/v1/models/nope:predict", json.dumps({"instances": ["a"]}).encode(), 404),
        ("POST", "/v1/models/sst2:predict", b"{not json", 400),
        ("POST", "/v1/models/sst2:predict", b'{"instances": ["caf\xe9"]}', 400),  # body is not UTF-8
        ("POST", "/v1/models/sst2:predict", json.dumps({"instances": [{"b64": "bm90IHV0Zi04/w=="}]}).encode(), 400),
        ("POST", "/v1/models/sst2:predict", json.dumps({"instances": [1]}).encode(), 400),
        ("POST", "/v1/models/sst2:predict", json.dumps({"instances": []}).encode(), 400),
        ("POST", "/v1/models/sst2:predict", json.dumps({"instances": ["a"], "signature_name": "x"}).encode(), 400),
        ("POST", "/v1/models/sst2:predict", json.dumps({"instances": ["x" * MAX_REQUEST_BYTES]}).encode(), 413),
        ("POST", "/v1/models/sst2:frobnicate", b"{}", 400),
        ("GET", "/v1/models/sst2/versions/9", None, 404),
        ("GET", "/elsewhere", None, 404),
    ]
    for method, path, raw, code in rest_cases:
        status, body = rest(rest_port, method, path, raw=raw)
        assert status == code and "error" in body, (path, raw and raw[:60], status, body)

    # One bad request among concurrent good ones: only it fails, though they may share a batch.
    results = [None] * 8

    def call(i):
        text = np.array([b"\xff\xfe" if i == 3 else sst2_dev[0][i].encode()], object)
        try:
            results[i] = stub.Predict(predict_request("sst2", {"sentence": text}))
        except grpc.RpcError as err:
            results[i] = err.code()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[3] == grpc.StatusCode.INVALID_ARGUMENT
    for i in (0, 1, 2, 4, 5, 6, 7):
        np.testing.assert_allclose(tf.make_ndarray(results[i].outputs["probabilities"])[0], sst2_dev[1][i], atol=TOL)
    status, body = rest(rest_port, "GET", "/v1/models/sst2")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"


def test_new_version_under_concurrent_load_drops_no_request(served, base, sst2_dev):
    """Version 2 dropped in (atomic rename) while 6 clients send requests: zero failures, 1 then 2.

    It waits on the server's own status, not a fixed time: first for version 2 to be AVAILABLE (a loaded
    2-core machine took minutes to load it while answering the clients; the deadline only catches a
    hang), then for it to answer 20 requests."""
    grpc_port, rest_port = served
    texts, expected = sst2_dev
    stop, errors, seen = threading.Event(), [], []

    def grpc_load(i):
        stub = stubs(grpc_port)
        while not stop.is_set():
            try:
                response = stub.Predict(predict_request("sst2", {"sentence": [texts[i]]}), timeout=300)
                seen.append(response.model_spec.version.value)
                np.testing.assert_allclose(tf.make_ndarray(response.outputs["probabilities"])[0], expected[i],
                                           atol=TOL)
            except Exception as err:  # noqa: BLE001 -- every failure is recorded
                errors.append(repr(err))

    def rest_load():
        while not stop.is_set():
            status, body = rest(rest_port, "POST", "/v1/models/sst2:predict", {"instances": [texts[0]]})
            if status != 200:
                errors.append(body)

    def version_2_state():
        _, body = rest(rest_port, "GET", "/v1/models/sst2/versions/2")
        return (body.get("model_version_status") or [{}])[0] if body else {}

    threads = [threading.Thread(target=grpc_load, args=(i,)) for i in range(5)] + [threading.Thread(target=rest_load)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        staging = base / ".staging-2"
        shutil.copytree(base / "sst2" / "1", staging)
        os.rename(staging, base / "sst2" / "2")
        deadline = time.time() + 900
        while (state := version_2_state()).get("state") != "AVAILABLE":
            assert state.get("state") != "END", f"version 2 failed to load: {state}"
            assert time.time() < deadline, f"version 2 not AVAILABLE in 900 s: {state}"
            time.sleep(0.5)
        wait_for(lambda: seen and seen[-1] == 2 and seen.count(2) > 20, 300,
                 "version 2 is AVAILABLE but never answered 20 requests")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [], errors[:3]
    assert 1 in seen and 2 in seen and seen.index(2) > 0
    deadline = time.time() + 300  # version 1 goes UNLOADING -> END once its batch threads and memory are released
    while (states := {s["version"]: s["state"] for s in rest(rest_port, "GET", "/v1/models/sst2")[1]
                      ["model_version_status"]}) != {"1": "END", "2": "AVAILABLE"}:
        assert time.time() < deadline and states.get("1") == "UNLOADING", states
        time.sleep(0.5)


def test_client_cli(served):
    """``python -m serving.client`` over REST, a batch of two pairs to the regression model."""
    _, rest_port = served
    proc = subprocess.run([sys.executable, "-m", "serving.client", f"--port={rest_port}", "--protocol=rest",
                           "--model_name=stsb", "--input=sentence1=A man is dancing.", "--input=sentence2=A man dances.",
                           "--input=sentence1=x", "--input=sentence2=y"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(lines) == 2 and all(set(r) == {"score"} for r in lines)
    client = ServingClient("127.0.0.1", rest_port, protocol="rest")
    expected = client.classify_texts("stsb", {"sentence1": ["A man is dancing.", "x"], "sentence2": ["A man dances.", "y"]})
    assert lines == expected


def test_client_library_reports_server_errors(served):
    grpc_port, rest_port = served
    for port, protocol in ((grpc_port, "grpc"), (rest_port, "rest")):
        client = ServingClient("127.0.0.1", port, protocol)
        with pytest.raises(ServingError) as err:
            client.classify_texts("sst2", {"premise": ["x"]})
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(ServingError) as err:
            client.classify_texts("nope", {"sentence": ["x"]})
        assert err.value.code == grpc.StatusCode.NOT_FOUND and "nope" in err.value.message
        client.close()


def test_b64_strings_over_rest(served, sst2_dev):
    _, port = served
    texts, expected = sst2_dev
    encoded = base64.b64encode(texts[0].encode()).decode()
    status, body = rest(port, "POST", "/v1/models/sst2:predict", {"instances": [{"b64": encoded}]})
    assert status == 200
    np.testing.assert_allclose(body["predictions"][0]["probabilities"], expected[0], atol=TOL)
