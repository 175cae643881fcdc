"""Version policies, version labels and a model config that changes while the server runs, as TF Serving has them:
``model_version_policy``, ``version_labels`` (REST ``/labels/<label>:predict``, gRPC ``model_spec.version_label``),
``--allow_version_labels_for_unavailable_models``, ``--model_config_file_poll_wait_seconds`` and ModelService's
HandleReloadConfigRequest.

The versions are the length model (``sentence`` -> its length) plus 1000 × the version number, so an answer says
which version gave it. One server serves the module; the registry's rules are also tested in-process.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import grpc
import pytest
from tensorflow_serving.apis import (get_model_status_pb2, model_management_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)
from tensorflow_serving.config import model_server_config_pb2

from serving.errors import ServingError
from serving.model_registry import ModelRegistry
from serving.server_config import ModelConfig
from tests.small_runs import save_length_model, spawn_server, start_server, stop_servers, wait_for

HOST = "127.0.0.1"
POLL_SECONDS = 1
SENTENCE = "four"  # length 4: version v answers 1000 v + 4
AVAILABLE = get_model_status_pb2.ModelVersionStatus.AVAILABLE


def config_text(models: dict) -> str:
    """A ModelServerConfig text: ``{name: (base_path, policy text, {label: version})}``."""
    entries = []
    for name, (base, policy, labels) in models.items():
        label_text = " ".join(f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items())
        entries.append(f'config {{ name: "{name}" base_path: "{base}" model_platform: "tensorflow" '
                       f"model_version_policy {{ {policy} }} {label_text} }}")
    return "model_config_list { " + " ".join(entries) + " }\n"


def write_config(path: Path, models: dict) -> None:
    """Replaces the file in one step (a poll never reads half of it)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(config_text(models))
    tmp.replace(path)


def reload(server, models: dict) -> None:
    """Writes the server's config file and waits until the server has applied all of it, its labels included
    (its log's "reloaded" line: the versions' states and the labels change one after the other)."""
    reloads = server["log"].read_text().count(": reloaded; models:")
    write_config(server["config"], models)
    wait_for(lambda: server["log"].read_text().count(": reloaded; models:") > reloads, 60, "the config reloaded")


@pytest.fixture(scope="module")
def versions_root(tmp_path_factory) -> Path:
    """``m/1``, ``m/2``, ``m/3``: the length model plus 1000, 2000, 3000."""
    root = tmp_path_factory.mktemp("versions")
    for version in (1, 2, 3):
        save_length_model(root / "m" / str(version), plus=1000 * version)
    return root


@pytest.fixture(scope="module")
def server(versions_root, tmp_path_factory):
    """The server polling its config file every POLL_SECONDS; starts with m at versions 1 and 2, stable -> 1."""
    folder = tmp_path_factory.mktemp("versions_server")
    config = folder / "models.config"
    write_config(config, {"m": (versions_root / "m", "specific { versions: 1 versions: 2 }",
                                {"stable": 1, "canary": 2})})
    proc = start_server(folder / "server.log", f"--model_config_file={config}", "--rest_api_num_threads=4",
                        "--file_system_poll_wait_seconds=1", f"--model_config_file_poll_wait_seconds={POLL_SECONDS}")
    channel = grpc.insecure_channel(f"{HOST}:{proc.ports[0]}")
    yield {"config": config, "log": proc.log, "rest": proc.ports[1], "channel": channel, "root": versions_root}
    channel.close()
    stop_servers(proc)


def rest_predict(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("POST", path, json.dumps({"instances": [SENTENCE]}), {"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def rest_get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def grpc_predict(channel, name: str, label: str = "", version: int | None = None) -> int:
    import tensorflow as tf

    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    if label:
        request.model_spec.version_label = label
    if version is not None:
        request.model_spec.version.value = version
    request.inputs["sentence"].CopyFrom(tf.make_tensor_proto([SENTENCE]))
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    return int(tf.make_ndarray(stub.Predict(request, timeout=60).outputs["length"])[0])


def by_label(server, label: str) -> tuple[int, int]:
    """(REST answer, gRPC answer) of ``label``."""
    status, body = rest_predict(server["rest"], f"/v1/models/m/labels/{label}:predict")
    assert status == 200, body
    return body["predictions"][0], grpc_predict(server["channel"], "m", label=label)


def available(server, name: str) -> list:
    stub = model_service_pb2_grpc.ModelServiceStub(server["channel"])
    try:
        status = stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec={"name": name}), timeout=30)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND, err
        return []
    return [s.version for s in status.model_version_status if s.state == AVAILABLE]


# ---------------------------------------------------------------------------------------------- labels
def test_labels_answer_through_both_apis_and_an_unknown_label_is_invalid(server):
    assert by_label(server, "stable") == (1004, 1004)
    assert by_label(server, "canary") == (2004, 2004)
    status, body = rest_predict(server["rest"], "/v1/models/m/labels/nope:predict")
    assert status == 400 and body["error"] == "Unrecognized servable version label: nope"
    with pytest.raises(grpc.RpcError) as err:
        grpc_predict(server["channel"], "m", label="nope")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_moving_a_label_under_load_answers_every_request(server):
    """stable moves 1 -> 2 in the config file while two clients (REST and gRPC) ask for stable without pause:
    every request is answered, by version 1 until the move and by version 2 after it, within the poll interval
    (plus the time a loaded machine takes to notice it)."""
    answers, errors, stop = {"rest": [], "grpc": []}, [], threading.Event()

    def client(kind):
        while not stop.is_set():
            try:
                if kind == "rest":
                    status, body = rest_predict(server["rest"], "/v1/models/m/labels/stable:predict")
                    value = body["predictions"][0] if status == 200 else f"HTTP {status}: {body}"
                else:
                    value = grpc_predict(server["channel"], "m", label="stable")
            except Exception as err:  # noqa: BLE001 -- every failure is counted and shown
                value = repr(err)
            (answers[kind] if isinstance(value, int) else errors).append((time.monotonic(), value))

    threads = [threading.Thread(target=client, args=(kind,)) for kind in answers]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: all(len(a) >= 3 for a in answers.values()), 60, "answers before the move")
        moved = time.monotonic()
        write_config(server["config"], {"m": (server["root"] / "m", "specific { versions: 1 versions: 2 }",
                                              {"stable": 2, "canary": 2})})
        wait_for(lambda: all(a and a[-1][1] == 2004 for a in answers.values()), 30, "stable answered by version 2")
        wait_for(lambda: all(len(a) >= 3 and a[-3][1] == 2004 for a in answers.values()), 30, "more answers")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    assert errors == []
    for kind, got in answers.items():
        values = [v for _, v in got]
        assert set(values) == {1004, 2004}, (kind, values)
        switch = values.index(2004)
        assert values[switch:] == [2004] * (len(values) - switch), (kind, values)  # never back to version 1
        assert got[switch][0] - moved < POLL_SECONDS + 10, (kind, got[switch][0] - moved)


def test_a_label_on_an_unavailable_version_is_refused_and_the_labels_before_stay(server):
    base = server["root"] / "m"
    write_config(server["config"], {"m": (base, "specific { versions: 1 versions: 2 }", {"stable": 2, "next": 3})})
    message = "Request to assign label to version 3 of model m, which is not currently available for inference"
    wait_for(lambda: message in server["log"].read_text(), 30, "the refusal in the server's log")
    assert by_label(server, "stable") == (2004, 2004)
    status, body = rest_predict(server["rest"], "/v1/models/m/labels/next:predict")
    assert status == 400 and "Unrecognized servable version label: next" in body["error"]
    # Through ModelService.HandleReloadConfigRequest, the refusal is the call's status.
    request = model_management_pb2.ReloadConfigRequest()
    request.config.CopyFrom(reload_config(base, "specific { versions: 1 versions: 2 }", {"stable": 1, "next": 3}))
    with pytest.raises(grpc.RpcError) as err:
        model_service_pb2_grpc.ModelServiceStub(server["channel"]).HandleReloadConfigRequest(request, timeout=120)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and message in err.value.details()
    request.config.CopyFrom(reload_config(base, "specific { versions: 1 versions: 2 }", {"stable": 1}))
    response = model_service_pb2_grpc.ModelServiceStub(server["channel"]).HandleReloadConfigRequest(request,
                                                                                                    timeout=120)
    assert response.status.error_code == 0 and by_label(server, "stable") == (1004, 1004)


def reload_config(base: Path, policy: str, labels: dict):
    from google.protobuf import text_format

    return text_format.Parse(config_text({"m": (base, policy, labels)}), model_server_config_pb2.ModelServerConfig())


# ---------------------------------------------------------------------------------------------- live config
def test_the_config_file_adds_removes_and_repolicies_models_without_a_restart(server):
    base = server["root"] / "m"
    reload(server, {"m": (base, "latest { num_versions: 1 }", {}), "n": (base, "all {}", {})})
    assert available(server, "n") == [1, 2, 3] and available(server, "m") == [3]
    assert grpc_predict(server["channel"], "n", version=1) == 1004
    status, body = rest_get(server["rest"], "/v1/models/n/versions/3")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    status, body = rest_predict(server["rest"], "/v1/models/m/labels/stable:predict")
    assert status == 400  # the labels are the config's: none now
    reload(server, {"m": (base, "specific { versions: 2 }", {"stable": 2})})
    assert available(server, "n") == [] and available(server, "m") == [2]
    status, body = rest_predict(server["rest"], "/v1/models/n:predict")
    assert status == 404, body
    assert by_label(server, "stable") == (2004, 2004)  # version 2 loaded and labelled in one change


def test_a_config_file_that_does_not_parse_keeps_what_serves(server):
    server["config"].write_text("model_config_list { config { name: ")
    wait_for(lambda: "not reloaded, the models served stay" in server["log"].read_text(), 30, "the parse error")
    assert by_label(server, "stable") == (2004, 2004)


def test_a_label_on_a_version_that_did_not_load_stops_the_start(versions_root, tmp_path):
    config, log = tmp_path / "models.config", tmp_path / "server.log"
    write_config(config, {"m": (versions_root / "m", "specific { versions: 1 }", {"stable": 1, "next": 2})})
    proc = spawn_server(log, f"--model_config_file={config}")
    try:
        assert proc.wait(timeout=120) != 0
    finally:
        proc.kill()
    assert ("Request to assign label to version 2 of model m, which is not currently available for inference"
            in log.read_text())


# ---------------------------------------------------------------------------------------------- the registry's rules
def test_allow_version_labels_for_unavailable_models_lets_only_new_labels_wait(versions_root):
    base = str(versions_root / "m")
    configs = lambda labels: [ModelConfig("m", base, "specific", versions=(1,), labels=tuple(labels.items()))]  # noqa: E731
    strict = ModelRegistry(configs({}), log=lambda _: None)
    with pytest.raises(ServingError, match="version 3 of model m, which is not currently available") as err:
        strict.reconfigure(configs({"stable": 1, "next": 3}))
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(ServingError, match="Unrecognized servable version label: stable"):
        strict.servable("m", label="stable")  # all or none: stable was not set either
    strict.stop()

    lenient = ModelRegistry(configs({}), log=lambda _: None, allow_labels_for_unavailable=True)
    lenient.reconfigure(configs({"stable": 1, "next": 3}))  # next is new: it may wait for version 3
    assert lenient.servable("m", label="stable").version == 1
    with pytest.raises(ServingError, match=r"Specific\(m, 3\)") as err:
        lenient.servable("m", label="next")
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(ServingError, match="version 3 of model m, which is not currently available"):
        lenient.reconfigure(configs({"stable": 3, "next": 3}))  # stable is in use: it moves only to a live version
    assert lenient.servable("m", label="stable").version == 1
    lenient.stop()


def test_a_label_moves_before_the_version_it_left_is_unloaded(versions_root):
    """One change that drops version 1 and moves ``stable`` 1 -> 2: at no moment does ``stable`` name an unloaded
    version (the unload comes after the labels moved)."""
    base = str(versions_root / "m")
    registry = ModelRegistry([ModelConfig("m", base, "specific", versions=(1,))], log=lambda _: None)
    registry.reconfigure([ModelConfig("m", base, "specific", versions=(1,), labels=(("stable", 1),))])
    seen, unload = [], registry._unload  # pylint: disable=protected-access

    def watched(name, version):
        seen.append((version, registry.servable(name, label="stable").version))  # stable while version goes
        unload(name, version)

    registry._unload = watched  # pylint: disable=protected-access
    registry.reconfigure([ModelConfig("m", base, "specific", versions=(2,), labels=(("stable", 2),))])
    assert seen == [(1, 2)], seen
    assert registry.servable("m", label="stable").version == 2
    registry._unload = unload  # pylint: disable=protected-access
    registry.stop()
