r"""A TF Serving API server (gRPC and REST) for machines where ``tensorflow_model_server`` can't be had.

    python -m serving.server --model_name=sst2 --model_base_path=exported/sst2 --port=8500 --rest_api_port=8501
    python -m serving.server --model_config_file=serving/models.config --enable_batching \
        --batching_parameters_file=serving/batching_parameters.txt

It serves the base-path layout stock TF Serving serves (``<base>/<version>/`` SavedModels), one
model or the models of a ``ModelServerConfig`` file, with TF Serving's flag names and defaults
where they exist, except that it listens on 127.0.0.1 unless ``--host`` says otherwise. The
gRPC port given as 0 picks a free one; ``--rest_api_port=0`` turns REST off (as in TF Serving).
The bound addresses are printed on one line to stdout once the first versions are loaded.
Only ``tensorflow``, ``grpcio`` and ``tensorflow-serving-api`` are imported: no Keras, no model
code.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from concurrent import futures

from absl import app, flags, logging

from serving import extra

extra.require("serving.server", __name__)  # without the serving extra, one line that names it

FLAGS = flags.FLAGS


def _check_flags() -> list:
    problems = []
    if bool(FLAGS.model_base_path) == bool(FLAGS.model_config_file):
        problems.append("give exactly one of --model_base_path and --model_config_file")
    for name in ("model_config_file", "batching_parameters_file"):
        if getattr(FLAGS, name) and not os.path.isfile(getattr(FLAGS, name)):
            problems.append(f"--{name}={getattr(FLAGS, name)} does not exist")
    if FLAGS.batching_parameters_file and not FLAGS.enable_batching:
        problems.append("--batching_parameters_file needs --enable_batching")
    if FLAGS.max_request_bytes <= 0 or FLAGS.grpc_max_threads <= 0:
        problems.append("--max_request_bytes and --grpc_max_threads must be positive")
    if not 0 <= FLAGS.port < 65536 or not 0 <= FLAGS.rest_api_port < 65536:
        problems.append("--port and --rest_api_port must be in [0, 65535]")
    if FLAGS.max_num_load_retries < 0:
        problems.append(f"--max_num_load_retries={FLAGS.max_num_load_retries} must be >= 0")
    if min(FLAGS.rest_api_num_threads, FLAGS.rest_api_timeout_in_ms, FLAGS.rest_api_header_timeout_in_ms) < 1:
        problems.append("--rest_api_num_threads, --rest_api_timeout_in_ms and --rest_api_header_timeout_in_ms "
                        "must be positive")
    if FLAGS.file_system_poll_wait_seconds < 0 or FLAGS.model_config_file_poll_wait_seconds < 0:
        problems.append("--file_system_poll_wait_seconds and --model_config_file_poll_wait_seconds must be >= 0")
    if FLAGS.model_config_file_poll_wait_seconds and not FLAGS.model_config_file:
        problems.append("--model_config_file_poll_wait_seconds needs --model_config_file")
    return problems


def _say(message: str) -> None:
    print(f"serving.server: {message}", file=sys.stderr, flush=True)


def _watch_model_config(registry, path: str, configs: list, seconds: float, stop: threading.Event) -> None:
    """Reads ``path`` every ``seconds`` and serves what changed (TF Serving's
    ``--model_config_file_poll_wait_seconds``). A file that does not parse, or whose labels are refused, is
    reported once and not retried until it changes again; what serves meanwhile stays."""
    from serving.errors import ServingError
    from serving.server_config import read_model_config

    seen, reported = configs, ""
    while not stop.wait(seconds):
        try:
            configs = read_model_config(path)
        except (OSError, ValueError) as err:
            if str(err) != reported:
                _say(f"{path}: not reloaded, the models served stay: {err}")
                reported = str(err)
            continue
        if configs == seen:
            continue
        seen, reported = configs, ""
        try:
            registry.reconfigure(configs)
        except ServingError as err:
            _say(f"{path}: models reloaded, labels not (the labels before stay): {err.message}")
        else:
            _say(f"{path}: reloaded; models: {', '.join(sorted(registry.configs))}")


def define_flags() -> None:
    """The command line's flags (defined only when run as a command, so the module imports cleanly)."""
    flags.DEFINE_integer("port", 8500, "gRPC port (0: any free port).")
    flags.DEFINE_integer("rest_api_port", 8501, "REST port (0: no REST API).")
    flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (0.0.0.0: every interface).")
    flags.DEFINE_string("model_name", "default", "Name of the model served from --model_base_path.")
    flags.DEFINE_string("model_base_path", "", "Folder of numbered SavedModel versions of one model.")
    flags.DEFINE_string("model_config_file", "", "ModelServerConfig text proto listing several models.")
    flags.DEFINE_bool("enable_batching", False, "Batch concurrent requests to the same signature.")
    flags.DEFINE_string("batching_parameters_file", "", "BatchingParameters text proto (with --enable_batching).")
    flags.DEFINE_float("file_system_poll_wait_seconds", 1.0, "Seconds between polls of the base paths (0: load once).")
    flags.DEFINE_integer("max_request_bytes", 4 * 1024 * 1024, "Largest request accepted, gRPC message or REST body.")
    flags.DEFINE_integer("grpc_max_threads", 32, "Threads answering gRPC calls.")
    flags.DEFINE_integer("max_num_load_retries", 5, "Retries of a version whose load failed, before giving up "
                         "(TF Serving's flag and default; 0: one attempt).")
    flags.DEFINE_integer("load_retry_interval_micros", 60_000_000, "Microseconds between load retries "
                         "(TF Serving's flag and default, 1 minute).")
    flags.DEFINE_integer("rest_api_num_threads", 32, "REST connections served at once; as many more may wait, "
                         "past that a connection is answered 503.")
    flags.DEFINE_integer("rest_api_timeout_in_ms", 30_000, "REST: a request's body must arrive and its answer "
                         "go within this time, and an idle keep-alive connection is closed after it (TF Serving's flag).")
    flags.DEFINE_integer("rest_api_header_timeout_in_ms", 5_000, "REST: a request's line and headers must arrive "
                         "within this time (capped by --rest_api_timeout_in_ms); till then it holds no worker.")
    flags.DEFINE_bool("enable_signature_method_name_check", False, "Classify/Regress only on signatures with their "
                      "method name (TF Serving's flag, off by default there too).")
    flags.DEFINE_integer("tensorflow_intra_op_parallelism", 0, "Threads per op (0: TensorFlow's default).")
    flags.DEFINE_integer("tensorflow_inter_op_parallelism", 0, "Ops run in parallel (0: TensorFlow's default).")
    flags.DEFINE_string("ssl_config_file", "", "SSLConfig text proto (server_key, server_cert, custom_ca, "
                        "client_verify): TLS on the gRPC and the REST port.")
    flags.DEFINE_string("monitoring_config_file", "", "MonitoringConfig text proto (prometheus_config { enable: true "
                        "path: ... }): Prometheus metrics on the REST port.")
    flags.DEFINE_integer("model_config_file_poll_wait_seconds", 0, "Seconds between reads of --model_config_file: "
                         "models added, removed and relabelled without a restart (0: read once).")
    flags.DEFINE_bool("allow_version_labels_for_unavailable_models", False, "A new version label may name a "
                      "version that is not available yet (a label already in use still moves only to an "
                      "available version).")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter off unless asked for
    problems = _check_flags()
    if problems:
        print("serving.server: invalid flags:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(2)
    from gpt_tf.console import import_tensorflow, start_command

    start_command(serving=True)  # the serving settings
    tf = import_tensorflow()  # start-up lines off the console
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    from serving import monitoring, tls
    from serving.batcher import BatchingParameters
    from serving.errors import ServingError
    from serving.grpc_service import ModelService, PredictionService
    from serving.model_registry import ModelRegistry
    from serving.rest import RestServer
    from serving.server_config import ModelConfig, read_batching_parameters, read_model_config

    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.tensorflow_intra_op_parallelism)
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.tensorflow_inter_op_parallelism)
    try:
        configs = (read_model_config(FLAGS.model_config_file) if FLAGS.model_config_file
                   else [ModelConfig(FLAGS.model_name, FLAGS.model_base_path)])
        batching = None
        if FLAGS.enable_batching:
            batching = (read_batching_parameters(FLAGS.batching_parameters_file) if FLAGS.batching_parameters_file
                        else BatchingParameters())
        ssl_config = tls.read_ssl_config(FLAGS.ssl_config_file) if FLAGS.ssl_config_file else None
        metrics_path = (monitoring.read_monitoring_config(FLAGS.monitoring_config_file)
                        if FLAGS.monitoring_config_file else "")
    except (OSError, ValueError) as err:
        sys.exit(f"serving.server: {err}")

    registry = ModelRegistry(configs, batching, FLAGS.enable_signature_method_name_check, log=_say,
                             max_num_load_retries=FLAGS.max_num_load_retries,
                             load_retry_interval=FLAGS.load_retry_interval_micros / 1e6,
                             allow_labels_for_unavailable=FLAGS.allow_version_labels_for_unavailable_models)
    try:
        registry.reconfigure(configs)  # the first load pass, then the labels
    except ServingError as err:
        registry.stop()
        sys.exit(f"serving.server: {FLAGS.model_config_file}: {err.message}")
    limit = FLAGS.max_request_bytes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=FLAGS.grpc_max_threads),
                         options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(registry), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(registry), server)
    try:
        address = f"{FLAGS.host}:{FLAGS.port}"
        port = (server.add_secure_port(address, tls.grpc_credentials(ssl_config)) if ssl_config
                else server.add_insecure_port(address))
    except RuntimeError as err:
        sys.exit(f"serving.server: cannot listen on {FLAGS.host}:{FLAGS.port} for gRPC: {err}")
    rest = None
    if FLAGS.rest_api_port:
        try:
            rest = RestServer(registry, FLAGS.host, FLAGS.rest_api_port, limit, FLAGS.rest_api_num_threads,
                              FLAGS.rest_api_timeout_in_ms / 1000, log=_say,
                              header_timeout=FLAGS.rest_api_header_timeout_in_ms / 1000,
                              ssl_context=tls.rest_context(ssl_config) if ssl_config else None,
                              metrics_path=metrics_path)
        except OSError as err:
            sys.exit(f"serving.server: cannot listen on {FLAGS.host}:{FLAGS.rest_api_port} for REST: {err}")
        rest.start()
    server.start()
    registry.start_polling(FLAGS.file_system_poll_wait_seconds)
    rest_text = f"REST on {FLAGS.host}:{rest.port}" if rest else "REST off"
    print(f"serving.server: gRPC on {FLAGS.host}:{port}, {rest_text}; models: "
          f"{', '.join(sorted(registry.configs))}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if FLAGS.model_config_file_poll_wait_seconds:
        threading.Thread(target=_watch_model_config, name="config-poller", daemon=True,
                         args=(registry, FLAGS.model_config_file, configs, FLAGS.model_config_file_poll_wait_seconds,
                               stop)).start()
    stop.wait()
    _say("shutting down")
    if rest:
        rest.stop()
    server.stop(grace=5).wait()
    registry.stop()


def run():
    """The console script's entry point (pyproject's [project.scripts])."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
