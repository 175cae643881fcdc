"""Export and serving end to end, on real GLUE / Story Cloze text and GPT-1's BPE.

One package-scoped set-up, shared by test_serving_export.py and test_serving_api.py: a real SST-2
fine-tuning run (``test`` preset, mixed_bfloat16, 16 real rows) exported with ``serving.export.export_run``, plus a random STS-B model and a random LM;
``python -m serving.server`` serves the three from one ``models.config`` with batching on. The
server starts first so that its start-up overlaps the exports; it picks the versions up as they
appear.
"""

from __future__ import annotations

import copy
import select
import subprocess
import sys
import time

import grpc
import pytest
import tensorflow as tf
from tensorflow_serving.apis import get_model_status_pb2, model_service_pb2_grpc

from gpt_tf.config import get_size
from gpt_tf.gpt1.backbone import GPT1Backbone
from gpt_tf.gpt1.build import causal_lm_for
from gpt_tf.gpt1.tokenizer import GPT1Tokenizer
from gpt_tf.gpt1.text_classifier import task_for_spec
from gpt_tf.tasks import get_task
from gpt_tf.text.tokenizer import GPTTokenizer
from tests.serving_e2e.helpers import (ENV, MAX_REQUEST_BYTES, ROOT, free_port, glue_examples, offline_features,
                                      reference_probabilities)


# ---------------------------------------------------------------------------------------------- set-up
@pytest.fixture(scope="package")
def bpe(shared_data):
    return shared_data / "gpt1_bpe"


@pytest.fixture(scope="package")
def tokenizer(bpe):
    return GPTTokenizer.from_dir(bpe)


@pytest.fixture(scope="package")
def gpt1_tokenizer(bpe):
    """The ``GPT1Tokenizer`` of the BPE files, its in-graph tokenizer built once (its tables: several seconds each
    time)."""
    tokenizer = GPT1Tokenizer(str(bpe))
    assert tokenizer.tf_tokenizer is not None  # built now, once
    return tokenizer


@pytest.fixture(scope="package")
def tf_tokenizer(gpt1_tokenizer):
    """The in-graph tokenizer (``GPT1Tokenizer.tf_tokenizer``), built once."""
    return gpt1_tokenizer.tf_tokenizer


@pytest.fixture(scope="package")
def preprocessor_for(gpt1_tokenizer, config):
    """``preprocessor_for(task)``: the ``GPT1TaskPreprocessor`` of a registry ``TaskSpec`` (n_ctx, the run's BPE), as
    ``serving.export.task_preprocessor`` makes it, on the package's tokenizer (its in-graph tables built once)."""
    from gpt_tf.gpt1.preprocessor import GPT1TaskPreprocessor

    return lambda task: GPT1TaskPreprocessor(gpt1_tokenizer, config.n_ctx, task.input_type, task.num_choices)


@pytest.fixture(scope="package")
def config():
    return get_size("test", vocab_size=40478)


@pytest.fixture(scope="package")
def base(tmp_path_factory):
    """The served base path and its models.config (the versions appear later)."""
    root = tmp_path_factory.mktemp("served")
    entries = "".join(f'  config {{ name: "{m}" base_path: "{root / m}" model_platform: "tensorflow" }}\n'
                      for m in ("sst2", "stsb", "lm"))
    (root / "models.config").write_text(f"model_config_list {{\n{entries}}}\n")
    (root / "batching.txt").write_text("max_batch_size { value: 8 }\nbatch_timeout_micros { value: 0 }\n")
    return root


@pytest.fixture(scope="package")
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
        assert proc.wait(timeout=180) == 0, (base / "server.log").read_text()[-3000:]  # a loaded machine: >30 s seen
    finally:
        proc.kill()
        log.close()


@pytest.fixture(scope="package")
def sst2_run(shared_data, bpe, config, tmp_path_factory):
    """A real fine-tuning run dir: 16 SST-2 rows, 2 updates of 8, mixed_bfloat16 (as the CLI writes it)."""
    from gpt_tf.runs.files import save_run_configs
    from gpt_tf.training.task_objective import FinetuneConfig, Finetuner
    from pipelines.finetune_data import build_task_data

    root = tmp_path_factory.mktemp("sst2")
    build_task_data("sst2", shared_data / "glue" / "SST-2", bpe, root / "data", max_examples=16, show_progress=False)
    ft = FinetuneConfig(data_dir=str(root / "data"), run_dir=str(root / "run"), batch_size=8, epochs=1,
                        learning_rate=1e-3, precision="mixed_bfloat16")
    Finetuner(get_task("sst2"), config, ft, tf.distribute.get_strategy(), log=lambda _: None).train(progress=False)
    save_run_configs(ft.run_dir, "finetune", config, ft)
    return ft.run_dir


@pytest.fixture(scope="package")
def exported(server, base, bpe, sst2_run, tokenizer, tf_tokenizer, config):
    """Exports the three models into the served base path; returns the in-process references.

    sst2 goes through ``export_run`` as the CLI does (its in-graph tokenizer built from the run's BPE files), stsb
    through ``export_task_model`` with the BPE folder (its preprocessor's, ``serving.export.task_preprocessor``);
    lm through ``export_lm`` with a ``GPTTokenizer`` whose in-graph twin is the package's ``tf_tokenizer``: its graph
    (the text cleanup, most of an export's tracing) is traced once in this process instead of once more, and the
    SavedModel holds the same functions."""
    from serving.export import export_lm, export_run, export_task_model, load_finetuned

    export_run(sst2_run, str(base), "sst2")
    shared = copy.copy(tokenizer)
    shared.tf_tokenizer = lambda: tf_tokenizer
    stsb = task_for_spec(GPT1Backbone.from_gpt_config(config, name="backbone"), get_task("stsb"))
    export_task_model(stsb, get_task("stsb"), bpe, str(base), "stsb")
    lm = causal_lm_for(config)
    export_lm(lm, shared, str(base), "lm", top_k=5)
    sst2_model, _, _ = load_finetuned(sst2_run)  # float32, as exported
    return {"sst2": sst2_model, "stsb": stsb, "lm": lm}


@pytest.fixture(scope="package")
def loaded(base, exported):
    """``load(name)``: version 1 of an exported model, loaded in this process once (``tf.saved_model.load``
    of a GPT export instantiates its hundreds of functions: the costly part of a load)."""
    cache = {}

    def load(name):
        if name not in cache:
            cache[name] = tf.saved_model.load(str(base / name / "1"))
        return cache[name]

    return load


@pytest.fixture(scope="package")
def served(server, exported):
    """(gRPC port, REST port) once the server has every model available."""
    proc, grpc_port, rest_port = server
    ready, _, _ = select.select([proc.stdout], [], [], 900)  # deadlines for a hang, not timings: a loaded 2-core
    assert ready, "serving.server printed nothing in 900 s"  # machine took 330 s for this set-up
    line = proc.stdout.readline()
    assert f"gRPC on 127.0.0.1:{grpc_port}, REST on 127.0.0.1:{rest_port}" in line, line
    stub = model_service_pb2_grpc.ModelServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
    deadline = time.time() + 900
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


@pytest.fixture(scope="package")
def sst2_dev(shared_data, tokenizer, config, exported):
    """Real SST-2 dev sentences, their offline features and the in-process model's probabilities."""
    examples = glue_examples(shared_data, "sst2", "glue/SST-2", "dev", 12)
    ids, extract = offline_features(get_task("sst2"), examples, tokenizer, config)
    return [e.text_a for e in examples], reference_probabilities(exported["sst2"], ids, extract)

