"""Serving pieces on their own (no model, no server process): batcher, config files, REST JSON,
version registry over tiny SavedModels."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import tensorflow as tf

from serving.batcher import Batcher, BatchingParameters
from serving.errors import ServingError
from serving.model_registry import ModelRegistry, State
from serving.rest_json import examples_from_json, predict_inputs, predict_response, to_array
from serving.server_config import ModelConfig, read_batching_parameters, read_model_config

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- batcher
class Doubler:
    """A ``run`` that doubles ``x``, records each batch's rows, refuses negatives, and is slow."""

    def __init__(self, seconds=0.05):
        self.sizes, self.seconds = [], seconds

    def __call__(self, inputs):
        self.sizes.append(len(inputs["x"]))
        time.sleep(self.seconds)
        if (inputs["x"] < 0).any():
            raise ServingError(grpc.StatusCode.INVALID_ARGUMENT, "negative")
        return {"y": inputs["x"] * 2, "n": np.full(len(inputs["x"]), len(inputs["x"]))}


def call_concurrently(batcher, values):
    results = [None] * len(values)

    def call(i):
        try:
            results[i] = batcher({"x": np.array([values[i]], np.float32)})
        except ServingError as err:
            results[i] = err

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(values))]
    for t in threads:
        t.start()
        time.sleep(0.002)
    for t in threads:
        t.join()
    return results


def test_batcher_merges_concurrent_requests_and_splits_the_answers():
    run = Doubler()
    batcher = Batcher(run, BatchingParameters(max_batch_size=8))
    results = call_concurrently(batcher, list(range(7)))
    batcher.close()
    assert [float(r["y"][0]) for r in results] == [2.0 * i for i in range(7)]
    assert max(run.sizes) > 1 and sum(run.sizes) == 7  # the requests behind the first one shared runs


def test_batcher_waits_only_for_the_rows_it_expects():
    lone = Batcher(Doubler(seconds=0.02), BatchingParameters(max_batch_size=8, batch_timeout_micros=60_000_000))
    for _ in range(3):
        start = time.perf_counter()
        lone({"x": np.ones([1], np.float32)})
        assert time.perf_counter() - start < 30  # a lone client does not wait for the 60 s timeout (a loaded machine
    lone.close()  # may take seconds, never 60)
    run = Doubler(seconds=0.02)
    batcher = Batcher(run, BatchingParameters(max_batch_size=8, batch_timeout_micros=300_000))

    def client():
        for _ in range(5):
            batcher({"x": np.ones([1], np.float32)})

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    sizes = run.sizes
    assert sum(sizes) == 20 and sizes.count(4) >= 4, sizes  # clients answered together are batched together


def test_batcher_isolates_a_failing_request():
    run = Doubler()
    batcher = Batcher(run, BatchingParameters(max_batch_size=8))
    results = call_concurrently(batcher, [1, 2, -1, 3, 4, 5])
    batcher.close()
    assert isinstance(results[2], ServingError) and results[2].message == "negative"
    assert [float(results[i]["y"][0]) for i in (0, 1, 3, 4, 5)] == [2, 4, 6, 8, 10]


def test_batcher_runs_empty_oversized_and_mismatched_requests_alone():
    run = Doubler(seconds=0)
    batcher = Batcher(run, BatchingParameters(max_batch_size=4))
    assert batcher({"x": np.zeros([0], np.float32)})["y"].shape == (0,)
    assert batcher({"x": np.ones([9], np.float32)})["n"][0] == 9
    assert run.sizes == [0, 9]
    batcher.close()
    assert batcher({"x": np.ones([2], np.float32)})["n"][0] == 2  # after close: unbatched, still answered


def test_batcher_queue_limit():
    gate = threading.Event()
    batcher = Batcher(lambda inputs: (gate.wait(), inputs)[1], BatchingParameters(max_batch_size=1,
                                                                                  max_enqueued_batches=2))
    threads = [threading.Thread(target=batcher, args=({"x": np.ones([1])},)) for _ in range(3)]
    for t in threads:  # one runs (blocked on the gate), two wait in the queue
        t.start()
        time.sleep(0.05)
    with pytest.raises(ServingError) as err:
        batcher({"x": np.ones([1])})
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    gate.set()
    for t in threads:
        t.join()
    batcher.close()


# ---------------------------------------------------------------------------------------------- config files
def test_shipped_config_files_parse():
    configs = read_model_config(str(ROOT / "serving" / "models.docker.config"))
    assert [(c.name, c.base_path, c.policy, c.num_versions) for c in configs] == [
        ("sst2", "/models/sst2", "latest", 1), ("lm", "/models/lm", "latest", 1)]
    # The Python server's copy names the same models relative to itself: the repository's exported/.
    local = read_model_config(str(ROOT / "serving" / "models.config"))
    assert [(c.name, c.base_path) for c in local] == [(c.name, str(ROOT / "exported" / c.name)) for c in configs]
    assert read_batching_parameters(str(ROOT / "serving" / "batching_parameters.txt")) == BatchingParameters(
        max_batch_size=32, batch_timeout_micros=2000, max_enqueued_batches=100, num_batch_threads=1)


def test_config_errors_name_the_file_and_field(tmp_path):
    bad = tmp_path / "batching.txt"
    bad.write_text("max_batch_size { value: 8 }\npad_variable_length_inputs: true\n")
    with pytest.raises(ValueError, match=f"{bad}: pad_variable_length_inputs"):
        read_batching_parameters(str(bad))
    bad.write_text("max_batch_sise { value: 8 }\n")
    with pytest.raises(ValueError, match="unknown batching field 'max_batch_sise'"):
        read_batching_parameters(str(bad))
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "a" } }')
    with pytest.raises(ValueError, match="needs a name and a base_path"):
        read_model_config(str(config))
    config.write_text('model_config_list { config { name: "a" base_path: "/x" '
                      'model_version_policy { specific { versions: 2 versions: 5 } } version_labels { key: "stable" '
                      'value: 2 } } }')
    (parsed,) = read_model_config(str(config))
    assert parsed.aspired([1, 2, 3, 5]) == [2, 5] and parsed.labels == (("stable", 2),)
    assert ModelConfig("b", "/y", "all").aspired([1, 2]) == [1, 2]
    assert ModelConfig("b", "/y", "latest", 2).aspired([1, 2, 3]) == [2, 3]


def test_relative_base_paths_are_taken_from_the_config_files_folder(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    config = tmp_path / "conf" / "models.config"
    config.write_text('model_config_list { config { name: "a" base_path: "../exported/a" } '
                      'config { name: "b" base_path: "/abs/b" } config { name: "c" base_path: "gs://bucket/c" } }')
    monkeypatch.chdir(tmp_path / "conf")
    got = {c.name: c.base_path for c in read_model_config("models.config")}
    assert got == {"a": str(tmp_path / "exported" / "a"), "b": "/abs/b", "c": "gs://bucket/c"}


def test_a_missing_base_path_is_a_start_up_warning_and_the_status_says_why(tmp_path):
    logs, base = [], tmp_path / "exported" / "sst2"
    registry = ModelRegistry([ModelConfig("sst2", str(base))], log=logs.append)
    registry.poll()
    registry.poll()
    assert logs == [f"WARNING: model sst2: base path {base} does not exist; the model has no version until one "
                    "is exported there"]  # once, not at every poll
    for call in (lambda: registry.status("sst2"), lambda: registry.servable("sst2")):
        with pytest.raises(ServingError, match=f"its base path {base} does not exist") as err:
            call()
        assert err.value.code == grpc.StatusCode.NOT_FOUND
    base.mkdir(parents=True)
    registry.poll()
    assert logs[-1] == f"model sst2: base path {base} now exists"
    with pytest.raises(ServingError, match=r"Could not find any versions of model sst2$"):
        registry.status("sst2")


# ---------------------------------------------------------------------------------------------- REST JSON
def test_rest_json_inputs_follow_tf_serving_rules():
    from tensorflow.core.protobuf import meta_graph_pb2

    def info(dtype):
        return meta_graph_pb2.TensorInfo(dtype=dtype.as_datatype_enum)

    one = {"sentence": info(tf.string)}
    two = {"premise": info(tf.string), "hypothesis": info(tf.string)}
    inputs, form = predict_inputs({"instances": ["a", {"b64": "Yg=="}]}, one)
    assert form == "row" and inputs["sentence"].tolist() == [b"a", b"b"]
    inputs, form = predict_inputs({"inputs": {"premise": ["p"], "hypothesis": ["h"]}}, two)
    assert form == "columnar" and inputs["hypothesis"].tolist() == [b"h"]
    for doc, infos, message in [
        ({"instances": ["a"]}, two, "plain list"),
        ({"instances": [{"premise": "p"}]}, two, "keys must be equal to: hypothesis,premise"),
        ({"inputs": {"premise": ["p"]}}, two, "Missing named input: hypothesis"),
        ({"instances": ["a"], "inputs": ["a"]}, one, "only one of"),
        ({}, one, "Missing 'inputs' or 'instances'"),
    ]:
        with pytest.raises(ServingError, match=message):
            predict_inputs(doc, infos)
    with pytest.raises(ServingError, match="unexpected size"):
        to_array([[1, 2], [3]], tf.int32)
    with pytest.raises(ServingError, match="is not of expected type: int32"):
        to_array([True], tf.int32)
    assert to_array([[1, 2]], tf.float32).dtype == np.float32


def test_rest_json_outputs_follow_tf_serving_rules():
    outputs = {"p": np.array([[0.2, 1.0]], np.float32), "name": np.array([b"ok"], object),
               "raw_bytes": np.array([b"\xff"], object)}
    row = predict_response(outputs, "row")
    assert row == {"predictions": [{"p": [0.2, 1.0], "name": "ok", "raw_bytes": {"b64": "/w=="}}]}
    assert json.dumps(row["predictions"][0]["p"]) == "[0.2, 1.0]"  # shortest float32 text, as TF Serving writes
    assert predict_response({"score": np.array([0.5, 1.5], np.float32)}, "columnar") == {"outputs": [0.5, 1.5]}
    assert predict_response({"score": np.array([0.5], np.float32)}, "row") == {"predictions": [0.5]}


def test_rest_json_examples_put_the_context_first():
    (serialized,) = examples_from_json({"context": {"sentence2": "c", "n": 1}, "examples": [{"sentence1": "e"}]})
    example = tf.train.Example.FromString(serialized)
    features = example.features.feature
    assert features["sentence1"].bytes_list.value == [b"e"] and features["sentence2"].bytes_list.value == [b"c"]
    assert features["n"].int64_list.value == [1]
    with pytest.raises(ServingError, match="empty array"):
        examples_from_json({"examples": []})


# ---------------------------------------------------------------------------------------------- registry
class Plus(tf.Module):
    def __init__(self, amount):
        super().__init__()
        self.amount = tf.Variable(float(amount))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def serve(self, x):
        return {"y": x + self.amount}


def save_plus(base: Path, version: int, amount: float) -> None:
    module = Plus(amount)
    tf.saved_model.save(module, str(base / str(version)), signatures={"serving_default": module.serve})


def test_registry_loads_swaps_and_reports_versions(tmp_path):
    base = tmp_path / "plus"
    save_plus(base, 1, 1.0)
    logs = []
    registry = ModelRegistry([ModelConfig("plus", str(base))], BatchingParameters(), log=logs.append,
                             max_num_load_retries=0)
    registry.poll()
    servable = registry.servable("plus")
    assert servable.version == 1 and servable.predict("", {"x": np.ones([2], np.float32)})["y"].tolist() == [2, 2]
    with pytest.raises(ServingError, match=r"Specific\(plus, 2\)"):
        registry.servable("plus", 2)
    os.makedirs(base / "3")  # a broken version: reported, never served, not retried (no retries asked for)
    (base / "3" / "saved_model.pb").write_bytes(b"not a SavedModel")
    save_plus(base, 2, 10.0)
    registry.poll()
    registry.poll()
    assert registry.servable("plus").version == 1  # the newest (3) is broken: 1 keeps serving
    status = {v: (state, error) for v, state, error in registry.status("plus")}
    assert status[3][0] == State.END and status[3][1] and status[1][0] == State.AVAILABLE
    assert 2 not in status  # the latest-1 policy wants 3 only
    assert sum("load failed" in line for line in logs) == 1
    servable.close()  # a request that holds an unloaded servable still gets its answer
    assert servable.predict("", {"x": np.zeros([1], np.float32)})["y"].tolist() == [1]
    registry.stop()
    with pytest.raises(ServingError, match="Could not find any versions of model nope"):
        registry.status("nope")


def test_an_export_removes_the_temporary_folders_of_killed_exports(tmp_path):
    """A killed export's ``.<version>.tmp-<pid>`` folder is removed by the next export into that model folder, as
    the data builders remove theirs (``gpt_tf.data.common.remove_stale_temps``); one of a live process stays."""
    import subprocess
    import sys

    from serving.saved_model_io import save_version

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    model_dir = tmp_path / "m"
    (model_dir / f".3.tmp-{dead}" / "variables").mkdir(parents=True)  # killed mid-export
    (model_dir / f".4.tmp-{os.getpid()}").mkdir()  # an export still running (this process)
    module = Plus(1.0)
    save_version(module, {"serving_default": module.serve}, str(tmp_path), "m")
    assert sorted(os.listdir(model_dir)) == [f".4.tmp-{os.getpid()}", "1"]


class Twice(tf.Module):
    """A child with a ``tf.function`` of its own, as the in-graph tokenizer is inside the serving modules."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def __call__(self, x):
        return 2.0 * x


class Served(tf.Module):
    def __init__(self):
        super().__init__()
        self.double = Twice()

    def signatures(self):
        return {"serving_default": tf.function(lambda x: {"y": self.double(x) + 1.0}).get_concrete_function(
            tf.TensorSpec([None], tf.float32, name="x"))}


@pytest.mark.parametrize("traced_for_the_save, traces", [(True, 1), (False, 2)])
def test_signatures_traced_for_the_save_are_not_traced_again(tmp_path, traced_for_the_save, traces):
    """``traced_signatures``: the child's function is traced once for the signatures and the save together
    (the tokenizer's graph is most of an export's tracing); traced outside the save's context, the save traces
    it again. The SavedModel answers the same either way."""
    from serving.saved_model_io import save_at, traced_signatures

    module = Served()
    signatures = traced_signatures(module) if traced_for_the_save else module.signatures()
    save_at(module, signatures, str(tmp_path / "m"))
    assert module.double.__call__.experimental_get_tracing_count() == traces
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    assert loaded.signatures["serving_default"](x=tf.constant([1.0, 2.0]))["y"].numpy().tolist() == [3.0, 5.0]
    assert loaded.double(tf.constant([3.0])).numpy().tolist() == [6.0]
