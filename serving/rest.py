"""TF Serving's REST API on the standard library's ``http.server`` (``serving.http_front``).

    POST /v1/models/<name>[/versions/<v> | /labels/<l>]:(predict|classify|regress)
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]            model status
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]/metadata   signature defs
    GET  <metrics_path>                                            Prometheus metrics (``serving.monitoring``)

Paths, bodies and errors follow TF Serving (``http_rest_api_handler.cc``): errors are
``{"error": "<message>"}`` with the HTTP code of their status (``serving.errors.HTTP_STATUS``).
A body over ``max_request_bytes`` is refused with 413 from its Content-Length alone (answered
before any of it is read; what the client still sends is discarded for at most a second, then the
connection closes), one without a Content-Length with 411. JSON nested
deeper than ``rest_json.MAX_JSON_DEPTH`` is refused with 400 before it is parsed.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.parse

import grpc
from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, model_pb2

from serving import monitoring, rest_json
from serving.errors import ServingError, invalid
from serving.http_front import CLIENT_GONE, BoundedHTTPServer, DeadlineHandler, release_freed_memory
from serving.grpc_service import SIGNATURE_DEF, model_metadata, model_status, servable_for
from serving.servable import DEFAULT_SIGNATURE

_PREDICTION = re.compile(r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
                         r"(classify|regress|predict)")
_STATUS = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?")


def _spec(name: str, version: str | None, label: str | None) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name or ""))
    if version is not None:
        if int(version) > 2 ** 63 - 1:  # a ModelSpec's version is an int64
            raise invalid(f"Malformed request: version {version[:40]} is beyond the largest version number "
                          f"(2^63 - 1)")
        spec.version.value = int(version)
    if label is not None:
        spec.version_label = urllib.parse.unquote(label)
    return spec


class _Api:
    """The REST methods over a registry, body in, JSON-able dict out.

    A large body's JSON tree takes ~20 times its size (2 MB of ``[["a"], ...]`` is ~40 MB of Python
    objects), so at most ``LARGE_BODY_SLOTS`` large bodies are parsed and converted at once (the
    work holds the GIL anyway) and the freed memory is handed back to the OS afterwards: 16 clients
    sending such bodies otherwise grew the server by hundreds of MB that it never gave back.
    """

    LARGE_BODY = 1 << 16
    LARGE_BODY_SLOTS = 2

    def __init__(self, registry):
        self.registry = registry
        self._large = threading.BoundedSemaphore(self.LARGE_BODY_SLOTS)

    def post(self, path: str, body: bytes, call: monitoring.Call) -> dict:
        """The answer to a prediction request; ``call`` learns its model, API, signature and version."""
        match = _PREDICTION.fullmatch(path)
        if not match:
            raise invalid(f"Malformed request: POST {path}")
        spec, method = _spec(*match.group(1, 2, 3)), match.group(4).lower()
        call.identify(method, spec)
        large = len(body) > self.LARGE_BODY
        try:
            with self._large if large else contextlib.nullcontext():
                servable, signature, inputs = self._parse(spec, method, body, call)
        finally:
            if large:
                release_freed_memory()
        if method == "predict":
            return rest_json.predict_response(servable.predict(signature, inputs[0]), inputs[1])
        if method == "classify":
            return rest_json.classify_response(*servable.classify(signature, inputs))
        return rest_json.regress_response(servable.regress(signature, inputs))

    def _parse(self, spec, method: str, body: bytes, call: monitoring.Call):
        """(servable, signature, inputs): ``(arrays, form)`` for predict, serialized examples otherwise.
        The signature is read before the servable is looked up (as TF Serving does), so that a request for an
        unknown model is counted under its signature too."""
        doc = rest_json.parse_body(body)
        call.signature = signature = rest_json.signature_name(doc) or DEFAULT_SIGNATURE
        servable = servable_for(self.registry, spec)
        call.served(servable.version)
        if method == "predict":
            if signature not in servable.signature_defs:
                raise invalid(f'Serving signature name: "{signature}" not found in signature def')
            return servable, signature, rest_json.predict_inputs(doc, servable.signature_defs[signature].inputs)
        return servable, signature, rest_json.examples_from_json(doc)

    def get(self, path: str) -> dict:
        match = _STATUS.fullmatch(path)
        if not match:
            raise invalid(f"Malformed request: GET {path}")
        name, version, label, metadata = match.groups()
        if not name:
            raise invalid("Missing model name in request.")
        spec = _spec(name, version, label)
        if metadata:
            response = model_metadata(self.registry, spec, [SIGNATURE_DEF])
            unpacked = get_model_metadata_pb2.SignatureDefMap()
            response.metadata[SIGNATURE_DEF].Unpack(unpacked)
            return {"model_spec": json_format.MessageToDict(response.model_spec, preserving_proto_field_name=True,
                                                            always_print_fields_with_no_presence=True),
                    "metadata": {SIGNATURE_DEF: json_format.MessageToDict(unpacked, preserving_proto_field_name=True)}}
        return json_format.MessageToDict(model_status(self.registry, spec), always_print_fields_with_no_presence=True)


class RestServer:
    """Serves the REST API on ``host:port`` (port 0: any free port, see ``.port``) in a thread.

    ``num_threads`` requests are served at once and as many more wait; past that, or past
    ``max_connections`` open connections, a connection gets 503 (``serving.http_front``).
    ``header_timeout``: seconds a request's head (line and headers) may take to arrive; ``timeout``:
    seconds its body and answer may take, and a keep-alive connection may idle. ``ssl_context``: TLS on
    the port (``serving.tls.rest_context``); ``metrics_path``: where a GET reads the Prometheus metrics
    (``serving.monitoring``; "" for none).
    """

    def __init__(self, registry, host: str, port: int, max_request_bytes: int, num_threads: int = 32,
                 timeout: float = 30.0, log=print, header_timeout: float = 5.0, max_connections: int = 1000,
                 ssl_context=None, metrics_path: str = ""):
        api = _Api(registry)

        class Handler(DeadlineHandler):
            def _reply(self, status: int, payload: dict) -> None:
                self._send(status, "application/json", json.dumps(payload, indent=1).encode("utf-8"))

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)

            def _refuse(self, status: int, message: str) -> None:
                """Answers from the headers alone, then closes: the body is never read into memory."""
                self.close_connection = True
                self._reply(status, {"error": message})
                self._linger()

            def _linger(self, seconds: float = 1.0) -> None:
                """Discards what the client still sends, for at most ``seconds`` and 4 × ``max_request_bytes``,
                so that a client busy sending its body reads the answer instead of a connection reset."""
                left, deadline = max(4 * max_request_bytes, 1 << 24), time.monotonic() + seconds
                try:
                    while left > 0 and time.monotonic() < deadline:
                        self.connection.settimeout(max(0.01, deadline - time.monotonic()))
                        chunk = self.connection.recv(min(left, 1 << 16))
                        if not chunk:
                            return
                        left -= len(chunk)
                except OSError:
                    pass

            def _handle(self, method: str) -> None:
                path = urllib.parse.urlsplit(self.path).path
                if method == "GET" and metrics_path and path == metrics_path:
                    return self._send(200, monitoring.CONTENT_TYPE, monitoring.REGISTRY.render().encode("utf-8"))
                if not re.fullmatch(r"(?i)/v1/.*", path):
                    return self._refuse(404, f"Not found: {method} {path}")
                call = monitoring.Call("REST")  # counted once api.post has named the model (predictions only)
                try:
                    if method == "GET":
                        return self._reply(200, api.get(path))
                    length = self.headers.get("Content-Length")
                    if length is None or not length.isdigit():
                        return self._refuse(411, "a POST needs a Content-Length header")
                    if int(length) > max_request_bytes:
                        return self._refuse(413, f"request body of {length} bytes exceeds the server's limit of "
                                                 f"{max_request_bytes} bytes")
                    body = self.rfile.read(int(length))
                    if len(body) < int(length):
                        self.close_connection = True
                        return  # the client went away mid-body
                    return self._reply(200, api.post(path, body, call))
                except ServingError as err:
                    call.code = err.code
                    return self._reply(err.http_status, {"error": err.message})
                except CLIENT_GONE:
                    call.code = grpc.StatusCode.CANCELLED
                    raise
                except Exception as err:  # noqa: BLE001 -- reported to the client; the server stays up
                    call.code = grpc.StatusCode.INTERNAL
                    return self._reply(500, {"error": f"{type(err).__name__}: {err}"})
                finally:
                    call.done()

            def do_GET(self):  # noqa: N802 -- http.server's naming
                self._handle("GET")

            def do_POST(self):  # noqa: N802
                self._handle("POST")

        self._server = BoundedHTTPServer((host, port), Handler, num_threads=num_threads, timeout=timeout, log=log,
                                         header_timeout=header_timeout, max_connections=max_connections,
                                         ssl_context=ssl_context)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="rest", daemon=True)

    @property
    def shed(self) -> int:
        """Connections answered 503 because the server was at its limit."""
        return self._server.shed

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
