"""Export and serving end to end, on real GLUE / Story Cloze text and GPT-1's BPE.

One module-scoped set-up: a real SST-2 fine-tuning run (``test`` preset, mixed_bfloat16, 16 real
rows) exported with ``serving.export.export_run``, plus a random STS-B model and a random LM;
``python -m serving.server`` serves the three from one ``models.config`` with batching on. The
server starts first so that its start-up overlaps the exports; it picks the versions up as they
appear.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2, get_model_status_pb2,
                                     model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc,
                                     regression_pb2)

from gpt_tf.config import get_preset
from gpt_tf.model import GPTBackbone, GPTLanguageModel
from gpt_tf.task_model import GPTTaskModel
from gpt_tf.tasks import get_task
from gpt_tf.tokenizer import GPTTokenizer
from pipelines.finetune_data import tokenize_examples
from pipelines.task_readers import read_examples
from pipelines.transforms import special_ids_from_config, transform_record
from serving.client import ServingClient
from serving.errors import ServingError
from serving.saved_model_io import text_example
from serving.task_module import TaskServingModule, input_specs

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
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
    out = model({"input_ids": ids, "extract_index": extract}, training=False, with_lm=False)["task"]
    return tf.nn.softmax(tf.cast(out, tf.float32)).numpy()


# ---------------------------------------------------------------------------------------------- set-up
@pytest.fixture(scope="module")
def bpe(shared_data):
    return shared_data / "gpt1_bpe"


@pytest.fixture(scope="module")
def tokenizer(bpe):
    return GPTTokenizer.from_dir(bpe)


@pytest.fixture(scope="module")
def config():
    return get_preset("test", vocab_size=40478)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The served base path and its models.config (the versions appear later)."""
    root = tmp_path_factory.mktemp("served")
    entries = "".join(f'  config {{ name: "{m}" base_path: "{root / m}" model_platform: "tensorflow" }}\n'
                      for m in ("sst2", "stsb", "lm"))
    (root / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    (root / "batching.txt").write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 0 }\n")
    return root


@pytest.fixture(scope="module")
def server(base):
    """``python -m serving.server`` on free ports (started, not yet waited for)."""
    grpc_port, rest_port = free_port(), free_port()
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving.server", f"--model_config_file={base / 'models.config'}",
         f"--port={grpc_port}", f"--rest_api_port={rest_port}", "--enable_batching",
         f"--batching_parameters_file={base / 'batching.txt'}", "--file_system_poll_wait_seconds=0.3",
         f"--max_request_bytes={MAX_REQUEST_BYTES}"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=log, text=True)
    yield proc, grpc_port, rest_port
    proc.terminate()
    try:
        assert proc.wait(timeout=30) == 0, (base / "server.log").read_text()[-3000:]
    finally:
        proc.kill()
        log.close()


@pytest.fixture(scope="module")
def sst2_run(shared_data, bpe, config, tmp_path_factory):
    """A real fine-tuning run dir: 16 SST-2 rows, 2 updates of 8, mixed_bfloat16 (as the CLI writes it)."""
    from gpt_tf.training.finetune_io import save_run_configs
    from gpt_tf.training.task_objective import FinetuneConfig, Finetuner
    from pipelines.finetune_data import build_task_data

    root = tmp_path_factory.mktemp("sst2")
    build_task_data("sst2", shared_data / "glue" / "SST-2", bpe, root / "data", max_examples=16, show_progress=False)
    ft = FinetuneConfig(data_dir=str(root / "data"), run_dir=str(root / "run"), batch_size=8, epochs=1,
                        learning_rate=1e-3, precision="mixed_bfloat16")
    Finetuner(get_task("sst2"), config, ft, tf.distribute.get_strategy(), log=lambda _: None).train(progress=False)
    save_run_configs(ft.run_dir, config, ft)
    return ft.run_dir


@pytest.fixture(scope="module")
def exported(server, base, sst2_run, bpe, config):
    """Exports the three models into the served base path; returns the in-process references."""
    from serving.export import export_lm, export_run, export_task_model, load_finetuned

    export_run(sst2_run, str(base), "sst2")
    stsb = GPTTaskModel(GPTBackbone(config, name="backbone"), get_task("stsb"))
    export_task_model(stsb, get_task("stsb"), str(bpe), str(base), "stsb")
    lm = GPTLanguageModel.from_config_preset(config)
    export_lm(lm, str(bpe), str(base), "lm", top_k=5)
    sst2_model, _, _ = load_finetuned(sst2_run)  # float32, as exported
    return {"sst2": sst2_model, "stsb": stsb, "lm": lm}


@pytest.fixture(scope="module")
def served(server, exported):
    """(gRPC port, REST port) once the server has every model available."""
    proc, grpc_port, rest_port = server
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    assert ready, "serving.server printed nothing in 120 s"
    line = proc.stdout.readline()
    assert f"gRPC on 127.0.0.1:{grpc_port}, REST on 127.0.0.1:{rest_port}" in line, line
    stub = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    deadline = time.time() + 120
    for name in ("sst2", "stsb", "lm"):
        while True:
            try:
                status = stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(model_spec={"name": name}))
                if status.model_version_status[0].state == 30:  # AVAILABLE
                    break
            except grpc.RpcError:
                pass
            assert time.time() < deadline and proc.poll() is None, f"{name} never became available"
            time.sleep(0.2)
    return grpc_port, rest_port


@pytest.fixture(scope="module")
def sst2_dev(shared_data, tokenizer, config, exported):
    """Real SST-2 dev sentences, their offline features and the in-process model's probabilities."""
    examples = glue_examples(shared_data, "sst2", "glue/SST-2", "dev", 12)
    ids, extract = offline_features(get_task("sst2"), examples, tokenizer, config)
    return [e.text_a for e in examples], reference_probabilities(exported["sst2"], ids, extract)


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

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    conn.request(method, path, data, {"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, json.loads(payload) if payload else None


# ---------------------------------------------------------------------------------------------- export
def test_export_of_a_finetuning_run_matches_the_in_process_model(base, exported, sst2_dev):
    """Text -> SavedModel (in process) == offline pipeline -> Keras model; float32 out of a bf16 run."""
    texts, expected = sst2_dev
    served = tf.saved_model.load(str(base / "sst2" / "1")).signatures["serving_default"]
    out = served(sentence=tf.constant(texts))
    assert out["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, atol=TOL)
    assert out["label_ids"].numpy().tolist() == expected.argmax(1).tolist()
    names = [n.decode() for n in out["label_names"].numpy()]
    assert names == [("negative", "positive")[i] for i in expected.argmax(1)]
    assert sorted(os.listdir(base / "sst2" / "1" / "assets.extra")) == ["tf_serving_warmup_requests"]


def test_bfloat16_export_answers_float32(sst2_run, shared_data, tokenizer, config, sst2_dev):
    """Computing in the run's mixed_bfloat16 still answers float32, close to the float32 export."""
    from serving.export import load_finetuned

    model, task, _ = load_finetuned(sst2_run, "mixed_bfloat16")
    examples = glue_examples(shared_data, "sst2", "glue/SST-2", "dev", 12)
    ids, extract = offline_features(task, examples, tokenizer, config)
    module = TaskServingModule(model, task, tokenizer.tf_tokenizer())
    out = module.predict_tokens(tf.constant(ids), tf.constant(extract))
    assert out["probabilities"].dtype == tf.float32
    np.testing.assert_allclose(out["probabilities"].numpy(), sst2_dev[1], atol=0.05)


@pytest.mark.parametrize("task_name, folder, split, n, truncates", [
    ("sst2", "glue/SST-2", "dev", 40, True), ("stsb", "glue/STS-B", "dev", 40, False),
    ("rte", "glue/RTE", "dev", 40, True), ("story_cloze", "story_cloze", "val", 20, True),
])
def test_in_graph_preprocessing_equals_the_offline_pipeline(base, exported, shared_data, tokenizer, config, task_name,
                                                            folder, split, n, truncates):
    """Real rows: the served features (cleaning, BPE, §3.3 views, truncation at n_ctx) == training's.

    SST-2 and STS-B through the exported ``features`` signature, RTE and Story Cloze (pair and
    multiple choice) through the same graph traced in process.
    """
    task = get_task(task_name)
    examples = glue_examples(shared_data, task_name, folder, split, n)
    ids, extract = offline_features(task, examples, tokenizer, config)
    assert (extract == config.n_ctx - 1).any() == truncates
    columns = {"sentence": "text_a", "premise": "text_a", "hypothesis": "text_b", "sentence1": "text_a",
               "sentence2": "text_b", "context": "text_a", "choices": "choices"}
    texts = {name: tf.constant([getattr(e, columns[name]) for e in examples]) for name in input_specs(task)}
    if task_name in exported:
        got = tf.saved_model.load(str(base / task_name / "1")).signatures["features"](**texts)
        got_ids, got_extract = got["input_ids"], got["extract_index"]
    else:
        module = TaskServingModule(GPTTaskModel(GPTBackbone(config, name="backbone"), task), task,
                                   tokenizer.tf_tokenizer())
        got_ids, got_extract = tf.function(module.features)(texts)
    np.testing.assert_array_equal(got_extract.numpy(), extract)
    pad = config.special_id("pad")
    padded = np.pad(got_ids.numpy(), [(0, 0), (0, 0), (0, config.n_ctx - got_ids.shape[2])], constant_values=pad)
    np.testing.assert_array_equal(padded, ids)


def test_saved_models_run_in_a_process_that_imports_only_tensorflow(base, exported, sst2_dev, tokenizer):
    """A fresh process with only tensorflow (no keras, tensorflow_text or project code) runs every signature."""
    texts, expected = sst2_dev
    # `import tensorflow` itself imports keras when it is installed: unload it and block any import
    # of it (and of the project, TF Text, keras-hub) before the SavedModels are loaded and run.
    script = textwrap.dedent("""
        import importlib.abc, json, sys
        import tensorflow as tf
        BLOCKED = ("keras", "tf_keras", "keras_hub", "tensorflow_text", "gpt_tf", "pipelines", "serving")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ImportError("blocked: " + name)
        for name in [m for m in sys.modules if m.split(".")[0] in BLOCKED]:
            del sys.modules[name]
        sys.meta_path.insert(0, Block())
        base, texts = sys.argv[1], json.loads(sys.argv[2])
        sst2 = tf.saved_model.load(base + "/sst2/1").signatures
        example = tf.train.Example(features=tf.train.Features(feature={"sentence": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[texts[0].encode()]))})).SerializeToString()
        lm = tf.saved_model.load(base + "/lm/1").signatures
        out = {
            "probabilities": sst2["serving_default"](sentence=tf.constant(texts))["probabilities"].numpy().tolist(),
            "classify": sst2["classify"](inputs=tf.constant([example]))["scores"].numpy().tolist(),
            "lm_ids": lm["serving_default"](text=tf.constant([texts[0]]))["token_ids"].numpy().tolist(),
            "modules": sorted({m.split(".")[0] for m in sys.modules} & set(BLOCKED)),
        }
        print(json.dumps(out))
    """)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script, str(base), json.dumps(texts)], capture_output=True,
                          text=True, env=env, cwd=str(base), timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["modules"] == []
    np.testing.assert_allclose(got["probabilities"], expected, atol=TOL)
    np.testing.assert_allclose(got["classify"][0], expected[0], atol=TOL)
    assert got["lm_ids"][0] == tokenizer.encode(texts[0])


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
        logits = exported["lm"](tf.constant([ids]), training=False)[0, -1, :40478]
        log_probs = tf.nn.log_softmax(logits).numpy()
        best = out["next_token_ids"][i]
        np.testing.assert_allclose(out["next_token_log_probs"][i], log_probs[best], atol=1e-4)
        assert out["next_token_log_probs"][i][-1] >= np.sort(log_probs)[-5] - 1e-4  # the 5 likeliest
        assert [t.decode() for t in out["next_tokens"][i]] == [words[j].replace("</w>", " ") for j in best]
        scored = out["token_log_probs"][i][1: len(ids)]
        every = tf.nn.log_softmax(exported["lm"](tf.constant([ids]), training=False)[0, :-1, :40478]).numpy()
        np.testing.assert_allclose(scored, every[np.arange(len(ids) - 1), ids[1:]], atol=1e-4)


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
    """Version 2 dropped in (atomic rename) while 6 clients send requests: zero failures, 1 then 2."""
    grpc_port, rest_port = served
    texts, expected = sst2_dev
    stop, errors, seen = threading.Event(), [], []

    def grpc_load(i):
        stub = stubs(grpc_port)
        while not stop.is_set():
            try:
                response = stub.Predict(predict_request("sst2", {"sentence": [texts[i]]}), timeout=60)
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

    threads = [threading.Thread(target=grpc_load, args=(i,)) for i in range(5)] + [threading.Thread(target=rest_load)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        staging = base / ".staging-2"
        shutil.copytree(base / "sst2" / "1", staging)
        os.rename(staging, base / "sst2" / "2")
        deadline = time.time() + 90
        while not (seen and seen[-1] == 2 and seen.count(2) > 20):
            assert time.time() < deadline, "version 2 never answered"
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == [], errors[:3]
    assert 1 in seen and 2 in seen and seen.index(2) > 0
    status, body = rest(rest_port, "GET", "/v1/models/sst2")
    states = {s["version"]: s["state"] for s in body["model_version_status"]}
    assert states == {"1": "END", "2": "AVAILABLE"}


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


def test_export_cli_errors_name_the_problem(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "serving.export", f"--run_dir={tmp_path}",
                           f"--export_base={tmp_path / 'out'}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode != 0 and "not a fine-tuning run" in proc.stderr


def test_versions_are_immutable(base, exported):
    from serving.saved_model_io import save_version

    with pytest.raises(FileExistsError, match="immutable"):
        save_version(tf.Module(), {}, str(base), "sst2", version=1)


def test_b64_strings_over_rest(served, sst2_dev):
    _, port = served
    texts, expected = sst2_dev
    encoded = base64.b64encode(texts[0].encode()).decode()
    status, body = rest(port, "POST", "/v1/models/sst2:predict", {"instances": [{"b64": encoded}]})
    assert status == 200
    np.testing.assert_allclose(body["predictions"][0]["probabilities"], expected[0], atol=TOL)
