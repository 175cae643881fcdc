"""An HTTP/1.1 server front that sheds load and times out slow clients (standard library only).

``BoundedHTTPServer`` is ``http.server.HTTPServer`` with what ``ThreadingHTTPServer`` lacks:

* a fixed pool of ``num_threads`` worker threads (no thread per connection: threads that come
  and go make the process grow, see ``bench/soak.py``), each serving one connection at a time;
* at most ``num_threads`` more accepted connections waiting for a worker; past that a new
  connection is answered ``503`` at once and closed (``shed``), never queued without bound;
* a listen backlog of ``backlog`` (``socketserver``'s default is 5, so a burst waited on SYN retries;
  the kernel caps it at ``net.core.somaxconn``);
* a deadline per request: its request line, headers and body must all arrive within
  ``timeout`` seconds of the worker starting to wait for it (so an idle keep-alive connection
  is closed after ``timeout`` too); a client that sends a partial header and holds it, or
  trickles bytes, loses its worker when the deadline passes;
* a client that went away (reset, broken pipe, timeout) is not an error: nothing is logged;
  any other exception in a handler is one line on the log, never a traceback.

Why by hand and not aiohttp or uvicorn: see the REST section of the README.
"""

from __future__ import annotations

import ctypes
import io
import queue
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

CLIENT_GONE = (ConnectionError, TimeoutError, socket.timeout)
_SHED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 68\r\n"
         b"Connection: close\r\n\r\n"
         b'{"error": "the server is at its connection limit; retry in a moment"}')


def _malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_TRIM = _malloc_trim()
_TRIM_LOCK = threading.Lock()
_last_trim = [0.0]


def release_freed_memory(min_interval: float = 1.0) -> None:
    """Hands memory freed by the allocator back to the OS (glibc ``malloc_trim``), at most once per ``min_interval``.

    Large request buffers freed in worker threads stay in glibc's per-thread arenas (its mmap
    threshold rises after the first large free), so the process's RSS only ever grows; trimming
    after large requests keeps it flat.
    """
    if _TRIM is None:
        return
    with _TRIM_LOCK:
        now = time.monotonic()
        if now - _last_trim[0] < min_interval:
            return
        _last_trim[0] = now
    _TRIM(0)


class _DeadlineReader(io.RawIOBase):
    """A socket's read side that raises ``TimeoutError`` once ``deadline`` (monotonic) has passed."""

    def __init__(self, sock: socket.socket, write_timeout: float):
        super().__init__()
        self._sock, self._write_timeout, self.deadline = sock, write_timeout, float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._write_timeout)  # the answer gets the full timeout


class DeadlineHandler(BaseHTTPRequestHandler):
    """``BaseHTTPRequestHandler`` whose every request must arrive within ``server.timeout`` seconds."""

    protocol_version = "HTTP/1.1"  # keep-alive

    def setup(self) -> None:
        self.connection = self.request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.connection.settimeout(self.server.timeout)  # writes: a client that stops reading
        self._reader = _DeadlineReader(self.connection, self.server.timeout)
        self.rfile = io.BufferedReader(self._reader, 1 << 16)
        self.wfile = self.connection.makefile("wb", 0)

    def handle_one_request(self) -> None:
        self._reader.deadline = time.monotonic() + self.server.timeout
        super().handle_one_request()

    def finish(self) -> None:
        for stream in (self.wfile, self.rfile):
            try:
                stream.close()
            except OSError:
                pass

    def log_message(self, *args) -> None:  # no access log; errors go through the server's log
        return


class BoundedHTTPServer(HTTPServer):
    """See the module doc. ``log``: where the one-line reports of handler failures go."""

    daemon_threads = True

    def __init__(self, address, handler, num_threads: int = 32, timeout: float = 30.0, backlog: int = 1024,
                 log=print):
        if num_threads < 1 or timeout <= 0 or backlog < 1:
            raise ValueError(f"num_threads={num_threads}, timeout={timeout} and backlog={backlog} must be positive")
        self.request_queue_size = backlog
        self.timeout, self.log = timeout, log  # (socketserver's own `timeout` is unused by serve_forever)
        self.shed = 0  # connections answered 503 at the limit
        self._pending: queue.Queue = queue.Queue(maxsize=num_threads)
        super().__init__(address, handler)
        self._workers = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
                         for i in range(num_threads)]
        for worker in self._workers:
            worker.start()

    def process_request(self, request, client_address) -> None:
        try:
            self._pending.put_nowait((request, client_address))
        except queue.Full:
            self.shed += 1
            try:
                request.setblocking(False)
                request.send(_SHED)  # fits in the socket buffer; never waits
            except OSError:
                pass
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._pending.get()
            if item is None:
                return
            request, client_address = item
            try:
                self.finish_request(request, client_address)
            except Exception:  # noqa: BLE001 -- one line per failure, the worker goes on
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, CLIENT_GONE):
            return
        self.log(f"REST connection from {client_address[0]}: {type(err).__name__}: {err}")

    def server_close(self) -> None:
        super().server_close()
        for _ in self._workers:
            try:
                self._pending.put_nowait(None)
            except queue.Full:
                break
