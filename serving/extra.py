"""The ``serving`` extra: what ``serving/`` needs beyond the runtime install (``pip install .``).

``pip install ".[serving]"``, from the repository root, adds grpcio and tensorflow-serving-api: TF Serving's
protos (the export's warm-up records, the server's requests) and gRPC (the server and the client).
``python -m serving.export``, ``serving.server`` and ``serving.client`` call :func:`require` before importing
either: without them the command exits with one line naming the extra, and an import of those modules from other
code (a task's ``export()``) raises ``ModuleNotFoundError`` with the same sentence. Only the modules are looked up
(no import), so the check costs nothing when the extra is installed.
"""

from __future__ import annotations

import importlib.util

INSTALL = 'pip install ".[serving]" from the repository root'  # gpt-tf is not on PyPI: a checkout's extra
# Top-level module -> the distribution of the extra that provides it (protobuf, the extra's third entry, comes
# with TensorFlow itself).
MODULES = {"grpc": "grpcio", "tensorflow_serving": "tensorflow-serving-api"}


def missing() -> list[str]:
    """The distributions of the extra whose modules cannot be found here, in ``MODULES``' order."""
    absent = []
    for module, distribution in MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a finder refusing it, or a half-imported module
            found = False
        if not found:
            absent.append(distribution)
    return absent


def require(command: str, module_name: str) -> None:
    """Nothing when the extra is installed. Otherwise, run as a command (``module_name == "__main__"``): exit
    with one line naming ``command`` and the extra; imported: ``ModuleNotFoundError`` saying the same."""
    absent = missing()
    if not absent:
        return
    message = (f"{command} needs gpt-tf's serving extra ({', '.join(absent)} not installed): {INSTALL}")
    if module_name == "__main__":
        raise SystemExit(message)
    raise ModuleNotFoundError(message, name=next(m for m, d in MODULES.items() if d == absent[0]))
