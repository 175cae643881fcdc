"""TF Serving's REST API on the standard library's ``ThreadingHTTPServer``.

    POST /v1/models/<name>[/versions/<v> | /labels/<l>]:(predict|classify|regress)
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]            model status
    GET  /v1/models/<name>[/versions/<v> | /labels/<l>]/metadata   signature defs

Paths, bodies and errors follow TF Serving (``http_rest_api_handler.cc``): errors are
``{"error": "<message>"}`` with the HTTP code of their status (``serving.errors.HTTP_STATUS``).
A body over ``max_request_bytes`` is refused with 413 (read and dropped, never kept), one
without a Content-Length with 411.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_metadata_pb2, model_pb2

from serving import rest_json
from serving.errors import ServingError, invalid
from serving.grpc_service import SIGNATURE_DEF, model_metadata, model_status, servable_for
from serving.servable import DEFAULT_SIGNATURE

_PREDICTION = re.compile(r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
                         r"(classify|regress|predict)")
_STATUS = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?")


def _spec(name: str, version: str | None, label: str | None) -> model_pb2.ModelSpec:
    spec = model_pb2.ModelSpec(name=urllib.parse.unquote(name or ""))
    if version is not None:
        spec.version.value = int(version)
    if label is not None:
        spec.version_label = urllib.parse.unquote(label)
    return spec


class _Api:
    """The REST methods over a registry, body in, JSON-able dict out."""

    def __init__(self, registry):
        self.registry = registry

    def post(self, path: str, body: bytes) -> dict:
        match = _PREDICTION.fullmatch(path)
        if not match:
            raise invalid(f"Malformed request: POST {path}")
        spec, method = _spec(*match.group(1, 2, 3)), match.group(4).lower()
        doc = rest_json.parse_body(body)
        servable = servable_for(self.registry, spec)
        signature = rest_json.signature_name(doc) or DEFAULT_SIGNATURE
        if method == "predict":
            if signature not in servable.signature_defs:
                raise invalid(f'Serving signature name: "{signature}" not found in signature def')
            inputs, form = rest_json.predict_inputs(doc, servable.signature_defs[signature].inputs)
            return rest_json.predict_response(servable.predict(signature, inputs), form)
        examples = rest_json.examples_from_json(doc)
        if method == "classify":
            return rest_json.classify_response(*servable.classify(signature, examples))
        return rest_json.regress_response(servable.regress(signature, examples))

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
    """Serves the REST API on ``host:port`` (port 0: any free port, see ``.port``) in a thread."""

    def __init__(self, registry, host: str, port: int, max_request_bytes: int):
        api = _Api(registry)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: one connection per client

            def log_message(self, *args):  # no access log on stderr
                return

            def _reply(self, status: int, payload: dict) -> None:
                data = json.dumps(payload, indent=1).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                path = urllib.parse.urlsplit(self.path).path
                if not re.fullmatch(r"(?i)/v1/.*", path):
                    self.close_connection = True
                    return self._reply(404, {"error": f"Not found: {method} {path}"})
                try:
                    if method == "GET":
                        return self._reply(200, api.get(path))
                    length = self.headers.get("Content-Length")
                    if length is None or not length.isdigit():
                        self.close_connection = True
                        return self._reply(411, {"error": "a POST needs a Content-Length header"})
                    if int(length) > max_request_bytes:
                        self.close_connection = True
                        self._discard(int(length))
                        return self._reply(413, {"error": f"request body of {length} bytes exceeds the server's "
                                                          f"limit of {max_request_bytes} bytes"})
                    return self._reply(200, api.post(path, self.rfile.read(int(length))))
                except ServingError as err:
                    return self._reply(err.http_status, {"error": err.message})
                except Exception as err:  # noqa: BLE001 -- reported to the client; the server stays up
                    return self._reply(500, {"error": f"{type(err).__name__}: {err}"})

            def _discard(self, length: int) -> None:
                """Reads a refused body without keeping it (up to 16 limits), so the client gets the answer."""
                left = min(length, 16 * max_request_bytes)
                while left > 0:
                    chunk = self.rfile.read(min(left, 1 << 16))
                    if not chunk:
                        return
                    left -= len(chunk)

            def do_GET(self):  # noqa: N802 -- http.server's naming
                self._handle("GET")

            def do_POST(self):  # noqa: N802
                self._handle("POST")

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="rest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
