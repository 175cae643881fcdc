"""TLS for ``serving.server``, configured as TF Serving configures it: ``--ssl_config_file``.

The file is TF Serving's ``SSLConfig`` text proto (``tensorflow_serving/config/ssl_config.proto``), so one file
serves both servers::

    server_key: "-----BEGIN PRIVATE KEY-----\\n...\\n-----END PRIVATE KEY-----\\n"
    server_cert: "-----BEGIN CERTIFICATE-----\\n...\\n-----END CERTIFICATE-----\\n"
    custom_ca: "-----BEGIN CERTIFICATE-----\\n...\\n-----END CERTIFICATE-----\\n"
    client_verify: true

The strings hold PEM *contents*, not file names (as in TF Serving): ``\n`` escapes for the line ends, or one
quoted string per PEM line (the text format joins adjacent strings). ``custom_ca`` is the CA that signs the
clients' certificates, needed with ``client_verify`` (which refuses a client without one). The pip package
``tensorflow-serving-api`` does not ship the message, so ``_message_class`` builds it from its four fields in a
descriptor pool of its own, and protobuf's text format parser reads the file, as in TF Serving.

Where this differs from ``tensorflow_model_server``: TF Serving puts TLS on its gRPC port only and serves REST in
plain text (behind a proxy that ends TLS, if at all). Here the same key and certificate, CA and client check
also cover the REST port, so with ``--ssl_config_file`` nothing leaves the server in plain text and a plain
request to either port gets no answer. The REST side's handshake runs in ``serving.http_front``'s head reader,
within the header deadline, so a client that stalls its handshake never holds a worker.

``read_ssl_config`` checks everything it can when the server starts (the file parses, the PEM loads, the key
matches the certificate): a bad file stops the server with one line naming it, not at its first client.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import ssl
import tempfile
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, text_format

from serving.protos import message_class

_FIELDS = (("server_key", "TYPE_STRING"), ("server_cert", "TYPE_STRING"), ("custom_ca", "TYPE_STRING"),
           ("client_verify", "TYPE_BOOL"))  # field numbers 1-4, as in ssl_config.proto


@dataclasses.dataclass(frozen=True)
class SSLConfig:
    """An ssl config file's contents: PEM texts and the client check. The key stays out of ``repr``
    (and so out of logs and tracebacks)."""

    server_key: str = dataclasses.field(repr=False)
    server_cert: str
    custom_ca: str = ""
    client_verify: bool = False


@functools.cache
def _message_class():
    """TF Serving's ``tensorflow.serving.SSLConfig`` message class, built from its fields in a private pool
    (not protobuf's default pool, which TensorFlow fills: the two never clash)."""
    field = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="tensorflow_serving/config/ssl_config.proto",
                                              package="tensorflow.serving", syntax="proto3")
    message = file.message_type.add(name="SSLConfig")
    for number, (name, kind) in enumerate(_FIELDS, start=1):
        message.field.add(name=name, number=number, type=getattr(field, kind), label=field.LABEL_OPTIONAL)
    return message_class(file, "tensorflow.serving.SSLConfig")


def read_ssl_config(path) -> SSLConfig:
    """The ``SSLConfig`` text proto at ``path``, checked by loading it into a TLS context; ``ValueError`` naming
    the file for one that does not parse, lacks the key or the certificate, asks for ``client_verify`` without
    ``custom_ca``, or holds PEM that does not load. (``OSError`` for a file that cannot be read.)"""
    message = _message_class()()
    try:
        text_format.Parse(Path(path).read_text(encoding="utf-8"), message)
    except (text_format.ParseError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not an SSLConfig text proto: {err}") from None
    config = SSLConfig(message.server_key, message.server_cert, message.custom_ca, message.client_verify)
    _check_fields(path, config)
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # what rest_context loads, one part at a time
    try:
        _load_key_pair(probe, config)
    except (ssl.SSLError, ValueError) as err:
        raise ValueError(f"{path}: server_key and server_cert do not load (PEM, the key unencrypted and the "
                         f"certificate's): {err}") from None
    if config.custom_ca:
        try:
            probe.load_verify_locations(cadata=config.custom_ca)
        except (ssl.SSLError, ValueError) as err:
            raise ValueError(f"{path}: custom_ca does not load as PEM certificates: {err}") from None
    return config


def _check_fields(path, config: SSLConfig) -> None:
    missing = [name for name in ("server_key", "server_cert") if not getattr(config, name)]
    if missing:
        raise ValueError(f"{path}: {' and '.join(missing)} missing (TLS needs both)")
    if config.client_verify and not config.custom_ca:
        raise ValueError(f"{path}: client_verify needs custom_ca, the CA that signs the clients' certificates")
    for name in ("server_key", "server_cert", "custom_ca"):
        value = getattr(config, name)
        if value and "-----BEGIN " not in value:
            raise ValueError(f"{path}: {name} must hold the PEM text itself (-----BEGIN ...), as in TF Serving, "
                             f"not a file name: {value[:60]!r}")


def grpc_credentials(config: SSLConfig) -> grpc.ServerCredentials:
    """The gRPC port's credentials: TF Serving's mapping of the same fields."""
    return grpc.ssl_server_credentials([(config.server_key.encode(), config.server_cert.encode())],
                                       root_certificates=config.custom_ca.encode() or None,
                                       require_client_auth=config.client_verify)


def _encrypted_key() -> None:
    """``load_cert_chain``'s password callback: without one, OpenSSL would ask on the terminal and the
    server would hang at start."""
    raise ValueError("server_key is encrypted (an SSLConfig key has no password)")


def _load_key_pair(context: ssl.SSLContext, config: SSLConfig) -> None:
    """``load_cert_chain`` reads files only: the key and certificate go to a temporary folder of this user's
    alone (mode 0700, files 0600), removed as soon as they are loaded."""
    with tempfile.TemporaryDirectory(prefix="serving-tls-") as folder:
        key, cert = os.path.join(folder, "key.pem"), os.path.join(folder, "cert.pem")
        for name, text in ((key, config.server_key), (cert, config.server_cert)):
            with os.fdopen(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
                file.write(text)
        context.load_cert_chain(cert, key, password=_encrypted_key)


def rest_context(config: SSLConfig) -> ssl.SSLContext:
    """The REST port's TLS context: TLS 1.2 at least, client certificates required with ``client_verify``
    (and, as on the gRPC port, not asked for without it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_RENEGOTIATION  # a client cannot make the head reader redo handshakes
    _load_key_pair(context, config)
    if config.custom_ca:
        context.load_verify_locations(cadata=config.custom_ca)
    if config.client_verify:
        context.verify_mode = ssl.CERT_REQUIRED
    return context
