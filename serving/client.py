r"""Client for exported models behind stock TF Serving or ``serving.server``, over gRPC or REST.

    python -m serving.client --port=8500 --model_name=sst2 --input="sentence=a gripping, funny film"
    python -m serving.client --port=8501 --protocol=rest --model_name=rte \
        --input="premise=A man is sleeping." --input="hypothesis=Somebody rests."
    python -m serving.client --port=8500 --model_name=story_cloze --input="context=..." \
        --input='choices=["ending one", "ending two"]'
    python -m serving.client --port=8500 --ssl_ca_file=ca.pem --model_name=sst2 --input="sentence=..."

Repeat an input to send a batch. Prints one JSON object per example: ``label`` and
``probabilities`` per class (classification, multiple choice), ``score`` (regression), or every
output of the signature (other models, e.g. the language model).

As a library: ``ServingClient(host, port, protocol).classify_texts("sst2", {"sentence": [...]})``.

TLS (a server started with ``--ssl_config_file``): ``--ssl_ca_file``, the PEM of the CA that signed the
server's certificate, whose names must include the ``--host`` asked for; for a server with ``client_verify``,
also ``--ssl_client_cert_file`` and ``--ssl_client_key_file``, a certificate its ``custom_ca`` signed.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
import threading
from pathlib import Path

from serving import extra

extra.require("serving.client", __name__)  # before grpc: without the serving extra, one line that names it

# pylint: disable=wrong-import-position
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from serving import protos  # noqa: E402
from serving.errors import ServingError  # noqa: E402
# pylint: enable=wrong-import-position

FLAGS = flags.FLAGS

# HTTP status -> the gRPC code a TF Serving REST error most likely had (serving.errors.HTTP_STATUS reversed).
_FROM_HTTP = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "ABORTED", 411: "INVALID_ARGUMENT",
              413: "RESOURCE_EXHAUSTED", 429: "RESOURCE_EXHAUSTED", 501: "UNIMPLEMENTED", 503: "UNAVAILABLE",
              504: "DEADLINE_EXCEEDED"}
# A kept-alive connection the server closed meanwhile: plain, or over TLS (a close without TLS's close_notify).
_CLOSED = (ConnectionError, http.client.HTTPException, ssl.SSLEOFError)


class ServingClient:
    """Predict requests to one server; thread-safe (one HTTP connection per thread for REST).

    TLS when ``ssl_ca_file`` (the CA that signed the server's certificate; without it, the CAs gRPC or Python
    trust by default) or a client certificate is given: ``ssl_client_cert_file`` and ``ssl_client_key_file``,
    PEM files, for a server that verifies its clients. ``OSError`` for a file that cannot be read.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 8500, protocol: str = "grpc", timeout: float = 30.0,
                 *, ssl_ca_file: str = "", ssl_client_cert_file: str = "", ssl_client_key_file: str = ""):
        if protocol not in ("grpc", "rest"):
            raise ValueError(f"protocol must be 'grpc' or 'rest', got {protocol!r}")
        if bool(ssl_client_cert_file) != bool(ssl_client_key_file):
            raise ValueError("a client certificate needs its key: give both ssl_client_cert_file and "
                             "ssl_client_key_file, or neither")
        self.host, self.port, self.protocol, self.timeout = host, port, protocol, timeout
        tls = (ssl_ca_file, ssl_client_cert_file, ssl_client_key_file) if ssl_ca_file or ssl_client_cert_file else None
        if protocol == "grpc":
            # TF Serving's messages without TensorFlow's start-up (serving/protos.py): a gRPC command takes
            # about as long as a REST one.
            self._request_class, _ = protos.predict_messages()
            self._channel = _grpc_channel(f"{host}:{port}", tls)
            self._predict = protos.predict_call(self._channel)
        else:
            self._ssl_context = _https_context(*tls) if tls else None
        self._local = threading.local()

    def close(self) -> None:
        if self.protocol == "grpc":
            self._channel.close()

    # ------------------------------------------------------------------ transport
    def predict(self, model_name: str, inputs: dict, signature: str = "serving_default",
                version: int | None = None) -> dict:
        """``{input: list or array}`` -> ``{output: np.ndarray}`` (strings as ``str``)."""
        if self.protocol == "grpc":
            request = self._request_class()
            request.model_spec.name, request.model_spec.signature_name = model_name, signature
            if version:
                request.model_spec.version.value = version
            for name, value in inputs.items():
                protos.fill_proto(request.inputs[name], value)
            try:
                response = self._predict(request, timeout=self.timeout)
            except grpc.RpcError as err:
                raise ServingError(err.code(), err.details()) from None
            outputs = {k: protos.to_ndarray(v, k) for k, v in response.outputs.items()}
        else:
            path = f"/v1/models/{model_name}" + (f"/versions/{version}" if version else "")
            body = {"signature_name": signature, "inputs": {k: np.asarray(v).tolist() for k, v in inputs.items()}}
            outputs = self._request("POST", path + ":predict", body)["outputs"]
            if not isinstance(outputs, dict):  # TF Serving leaves out the name of a signature's only output
                metadata = self._request("GET", path + "/metadata")["metadata"]["signature_def"]["signature_def"]
                outputs = {next(iter(metadata[signature]["outputs"])): outputs}
            outputs = {k: np.asarray(v) for k, v in outputs.items()}
        return {k: (np.vectorize(lambda b: b.decode("utf-8") if isinstance(b, bytes) else b, otypes=[object])(v)
                    if v.dtype == object else v) for k, v in outputs.items()}

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        for attempt in (0, 1):  # a kept-alive connection the server closed is reopened once
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self._connect()
            try:
                conn.request(method, path, data, {"Content-Type": "application/json"})
                response = conn.getresponse()
                payload = json.loads(response.read() or b"{}")
                break
            except _CLOSED:
                conn.close()
                self._local.conn = None
                if attempt:
                    raise
        if response.status != 200:
            code = getattr(grpc.StatusCode, _FROM_HTTP.get(response.status, "INTERNAL"))
            raise ServingError(code, payload.get("error", f"HTTP {response.status}"))
        return payload

    def _connect(self) -> http.client.HTTPConnection:
        if self._ssl_context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._ssl_context)

    # ------------------------------------------------------------------ text in, labels out
    def classify_texts(self, model_name: str, fields: dict, version: int | None = None) -> list:
        """Texts (``{field: [text per example]}``) -> one result dict per example; see the module doc."""
        return results_from_outputs(self.predict(model_name, fields, version=version))


def _read(path: str) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _grpc_channel(target: str, tls: tuple | None) -> grpc.Channel:
    """A plain channel, or with ``tls`` (CA, client certificate and key files; "" for none) a TLS one."""
    if tls is None:
        return grpc.insecure_channel(target)
    ca_file, cert_file, key_file = tls
    return grpc.secure_channel(target, grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file), private_key=_read(key_file), certificate_chain=_read(cert_file)))


def _https_context(ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    """REST's TLS context: the server's certificate checked against ``ca_file`` (else the system's CAs) and the
    host name; the client's certificate sent when given."""
    context = ssl.create_default_context(cafile=ca_file or None)
    if cert_file:
        context.load_cert_chain(cert_file, key_file)
    return context


def _float32(value) -> float:
    """A float32 output as the shortest float that reads back as it: gRPC's float32 tensors and REST's
    JSON numbers then give the same value (and print at the same precision)."""
    return float(str(np.float32(value)))


def results_from_outputs(outputs: dict) -> list:
    """Per-example dicts from a ``serving_default`` answer (classification, choice, regression or other)."""
    if "probabilities" in outputs:
        return [{"label": str(label), "label_id": int(index),
                 "probabilities": {str(c): _float32(p) for c, p in zip(classes, probs)}}
                for label, index, classes, probs in zip(outputs["label_names"], outputs["label_ids"],
                                                        outputs["classes"], outputs["probabilities"])]
    if "score" in outputs:
        return [{"score": _float32(s)} for s in outputs["score"]]
    rows = len(next(iter(outputs.values())))
    return [{k: v[i].tolist() for k, v in outputs.items()} for i in range(rows)]


def parse_inputs(specs: list) -> dict:
    """``["name=value", ...]`` -> ``{name: [value, ...]}`` (JSON lists for values starting with '[')."""
    fields = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not name:
            raise ValueError(f"--input={spec!r}: expected NAME=VALUE")
        fields.setdefault(name, []).append(json.loads(value) if value.startswith("[") else value)
    return fields


def define_flags() -> None:
    """The command line's flags (defined only when run as a command, so the module imports cleanly)."""
    flags.DEFINE_string("host", "127.0.0.1", "Server address.")
    flags.DEFINE_integer("port", 8500, "gRPC port (or REST port with --protocol=rest).")
    flags.DEFINE_enum("protocol", "grpc", ["grpc", "rest"], "API to use.")
    flags.DEFINE_string("model_name", None, "Model to ask.")
    flags.DEFINE_integer("model_version", 0, "Version to ask (0: the latest the server has).")
    flags.DEFINE_multi_string("input", [], "NAME=VALUE (repeat for several inputs and examples; a value starting "
                              "with '[' is a JSON list, e.g. the choices of a multiple-choice example).")
    flags.DEFINE_float("timeout", 30.0, "Seconds to wait for an answer.")
    flags.DEFINE_string("ssl_ca_file", "", "TLS: PEM of the CA that signed the server's certificate (a server "
                        "started with --ssl_config_file).")
    flags.DEFINE_string("ssl_client_cert_file", "", "TLS: PEM of this client's certificate, for a server with "
                        "client_verify (with --ssl_client_key_file).")
    flags.DEFINE_string("ssl_client_key_file", "", "TLS: PEM of this client's private key.")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.model_name or not FLAGS.input:
        sys.exit("serving.client: --model_name and at least one --input are required")
    try:
        fields = parse_inputs(FLAGS.input)
    except ValueError as err:
        sys.exit(f"serving.client: {err}")
    try:
        client = ServingClient(FLAGS.host, FLAGS.port, FLAGS.protocol, FLAGS.timeout, ssl_ca_file=FLAGS.ssl_ca_file,
                               ssl_client_cert_file=FLAGS.ssl_client_cert_file,
                               ssl_client_key_file=FLAGS.ssl_client_key_file)
    except (OSError, ValueError) as err:  # a TLS file that cannot be read
        sys.exit(f"serving.client: {err}")
    try:
        results = client.classify_texts(FLAGS.model_name, fields, FLAGS.model_version or None)
    except ServingError as err:
        sys.exit(f"serving.client: {err.code.name}: {err.message}")
    except OSError as err:  # REST: no connection, or a TLS handshake that failed (the server's certificate)
        sys.exit(f"serving.client: {FLAGS.host}:{FLAGS.port}: {err}")
    finally:
        client.close()
    for result in results:
        print(json.dumps(result, ensure_ascii=False), flush=True)


def run():
    """The console script's entry point (pyproject's [project.scripts])."""
    define_flags()
    app.run(main)


if __name__ == "__main__":
    run()
