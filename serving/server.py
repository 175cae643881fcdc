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
    if FLAGS.file_system_poll_wait_seconds < 0:
        problems.append("--file_system_poll_wait_seconds must be >= 0")
    return problems


def _say(message: str) -> None:
    print(f"serving.server: {message}", file=sys.stderr, flush=True)


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


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter off unless asked for
    problems = _check_flags()
    if problems:
        print("serving.server: invalid flags:\n  " + "\n  ".join(problems), file=sys.stderr)
        sys.exit(2)
    from gpt_tf.console import import_tensorflow

    tf = import_tensorflow(serving=True)  # the serving settings; start-up lines off the console
    import grpc
    from tensorflow_serving.apis import model_service_pb2_grpc, prediction_service_pb2_grpc

    from serving.batcher import BatchingParameters
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
    except (OSError, ValueError) as err:
        sys.exit(f"serving.server: {err}")

    registry = ModelRegistry(configs, batching, FLAGS.enable_signature_method_name_check, log=_say,
                             max_num_load_retries=FLAGS.max_num_load_retries,
                             load_retry_interval=FLAGS.load_retry_interval_micros / 1e6)
    registry.poll()
    limit = FLAGS.max_request_bytes
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=FLAGS.grpc_max_threads),
                         options=[("grpc.max_receive_message_length", limit), ("grpc.so_reuseport", 0)])
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(registry), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(registry), server)
    try:
        port = server.add_insecure_port(f"{FLAGS.host}:{FLAGS.port}")
    except RuntimeError as err:
        sys.exit(f"serving.server: cannot listen on {FLAGS.host}:{FLAGS.port} for gRPC: {err}")
    rest = None
    if FLAGS.rest_api_port:
        try:
            rest = RestServer(registry, FLAGS.host, FLAGS.rest_api_port, limit, FLAGS.rest_api_num_threads,
                              FLAGS.rest_api_timeout_in_ms / 1000, log=_say,
                              header_timeout=FLAGS.rest_api_header_timeout_in_ms / 1000)
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
