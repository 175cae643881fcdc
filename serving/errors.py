"""Request errors with TF Serving's status codes (gRPC codes, and their HTTP equivalents for REST)."""

from __future__ import annotations

import re

import grpc

# tensorflow_serving/model_servers/http_server.cc, ToHTTPStatusCode.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


class ServingError(Exception):
    """A request that cannot be answered: a gRPC status code and TF Serving's message."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]


def invalid(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
    return ServingError(grpc.StatusCode.NOT_FOUND, message)


def from_tf_error(error) -> ServingError:
    """A ``tf.errors.OpError`` with its own code; a failed in-graph check keeps only its message."""
    check = re.search(r"assertion failed: \[(.*?)\]", error.message, re.DOTALL)
    message = check.group(1).strip() if check else error.message
    return ServingError(_BY_NUMBER.get(error.error_code, grpc.StatusCode.UNKNOWN), message)
