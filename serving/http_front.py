"""An HTTP/1.1 server front that sheds load and times out slow clients (standard library only).

``BoundedHTTPServer`` is ``http.server.HTTPServer`` with what ``ThreadingHTTPServer`` lacks:

* a connection takes a worker only once the head of its request (request line and headers) is in:
  one thread reads the heads of every open connection (new ones, and keep-alive ones between
  requests) with ``select``, so clients that send a partial header and hold it, trickle it, or
  idle between requests never hold a worker while a complete request waits;
* a header deadline per request: its head must arrive within ``header_timeout`` seconds (a few)
  of its first byte or of the connection's start, else the connection is closed; an idle
  keep-alive connection is closed after ``timeout``;
* a fixed pool of ``num_threads`` worker threads (no thread per connection: threads that come
  and go make the process grow, see ``bench/soak.py``), each serving one request at a time; the
  request's body and answer must be done within ``timeout`` seconds;
* at most ``num_threads`` complete requests waiting for a worker, and at most ``max_connections``
  open connections; past either a connection is answered ``503`` at once and closed (``shed``),
  never queued without bound;
* a listen backlog of ``backlog`` (``socketserver``'s default is 5, so a burst waited on SYN retries;
  the kernel caps it at ``net.core.somaxconn``);
* a client that went away (reset, broken pipe, timeout) is not an error: nothing is logged;
  any other exception in a handler is one line on the log, never a traceback;
* with an ``ssl_context``, TLS on every connection and nothing in plain text: the head reader runs each
  handshake without blocking (within the header deadline, which counts from the accept, so a client that
  stalls its handshake is closed and never holds a worker), and a connection refused at the connection cap
  is closed without an answer, as no handshake has been made yet (the 503 of a full wait queue goes over TLS).

Why by hand and not aiohttp or uvicorn: see the REST section of the README.
"""

from __future__ import annotations

import collections
import ctypes
import io
import queue
import resource
import selectors
import socket
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

CLIENT_GONE = (ConnectionError, TimeoutError, socket.timeout, ssl.SSLEOFError, ssl.SSLZeroReturnError)
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


MAX_HEAD = 1 << 16  # bytes of request line + headers (http.server's own line limit)
# What the head reader makes of a connection besides waiting for selectors.EVENT_READ or EVENT_WRITE.
_HEAD_IN, _GONE = "head in", "gone"


class _Connection:
    """An open connection between requests: its socket, the bytes read of its next request, its deadline, and
    whether its TLS handshake is still to be made."""

    __slots__ = ("sock", "address", "buffer", "deadline", "handshaking")

    def __init__(self, sock: socket.socket, address, deadline: float, buffer: bytes = b""):
        self.sock, self.address, self.deadline, self.buffer = sock, address, deadline, buffer
        self.handshaking = False

    def head_complete(self, since: int = 0) -> bool:
        start = max(0, since - 3)
        return self.buffer.find(b"\n\r\n", start) >= 0 or self.buffer.find(b"\n\n", start) >= 0


class _SendAll(io.RawIOBase):
    """A socket's write side that sends all it is given, within the socket's timeout. (A socket file's
    ``write`` sends what fits in the socket buffer and returns that count, which ``http.server`` ignores: an
    answer larger than the buffer was cut short.)"""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class _DeadlineReader(io.RawIOBase):
    """A socket's read side, after the bytes already read (``pending``), that raises ``TimeoutError`` once
    ``deadline`` (monotonic) has passed; with ``stop`` set it reads nothing more from the socket."""

    def __init__(self, sock: socket.socket, write_timeout: float, pending: bytes = b""):
        super().__init__()
        self._sock, self._write_timeout, self.deadline = sock, write_timeout, float("inf")
        self._pending, self.stop = memoryview(pending), False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer):
        if len(self._pending):
            n = min(len(buffer), len(self._pending))
            buffer[:n] = self._pending[:n]
            self._pending = self._pending[n:]
            return n
        if self.stop:
            return None  # "no data now": what the buffer holds is all there is
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._write_timeout)  # the answer gets the full timeout


class DeadlineHandler(BaseHTTPRequestHandler):
    """``BaseHTTPRequestHandler`` for one request whose head is in (``server`` hands it a ``_Connection``):
    its body must arrive within ``server.timeout`` seconds. ``leftover``: bytes read past it (pipelining)."""

    protocol_version = "HTTP/1.1"  # keep-alive

    def setup(self) -> None:
        self.connection = self.request.sock
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.connection.settimeout(self.server.timeout)  # writes: a client that stops reading
        self._reader = _DeadlineReader(self.connection, self.server.timeout, self.request.buffer)
        self.rfile = io.BufferedReader(self._reader, 1 << 16)
        self.wfile = _SendAll(self.connection)
        self.leftover = b""

    def handle(self) -> None:
        self.close_connection = True
        self._reader.deadline = time.monotonic() + self.server.timeout
        self.handle_one_request()
        if not self.close_connection:
            self._reader.stop = True
            self.leftover = self.rfile.peek()

    def finish(self) -> None:
        for stream in (self.wfile, self.rfile):
            try:
                stream.close()
            except OSError:
                pass

    def log_message(self, *args) -> None:  # no access log; errors go through the server's log
        return


def _fd_room() -> int:
    """File descriptors this process may still open, less a reserve for TensorFlow, gRPC and models."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else max(16, soft - 256)


class BoundedHTTPServer(HTTPServer):
    """See the module doc. ``log``: where the one-line reports of handler failures go; ``ssl_context``: a
    server-side ``ssl.SSLContext`` for TLS on every connection (None: plain HTTP)."""

    daemon_threads = True

    def __init__(self, address, handler, num_threads: int = 32, timeout: float = 30.0, backlog: int = 1024,
                 log=print, header_timeout: float = 5.0, max_connections: int = 1000, ssl_context=None):
        if min(num_threads, timeout, backlog, header_timeout, max_connections) <= 0:
            raise ValueError(f"num_threads={num_threads}, timeout={timeout}, backlog={backlog}, header_timeout="
                             f"{header_timeout} and max_connections={max_connections} must be positive")
        self.request_queue_size = backlog
        self.timeout, self.log = timeout, log  # (socketserver's own `timeout` is unused by serve_forever)
        self.ssl_context = ssl_context
        self.header_timeout = min(header_timeout, timeout)
        self.max_connections = min(max_connections, _fd_room())
        self.shed = 0  # connections answered 503 at a limit
        self._pending: queue.Queue = queue.Queue(maxsize=num_threads)  # complete requests for the workers
        self._open, self._count_lock = 0, threading.Lock()
        self._incoming: collections.deque = collections.deque()  # connections for the head reader
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._closing = False
        super().__init__(address, handler)
        self._heads = threading.Thread(target=self._read_heads, name="http-heads", daemon=True)
        self._heads.start()
        self._workers = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
                         for i in range(num_threads)]
        for worker in self._workers:
            worker.start()

    # ------------------------------------------------------------------ accepting
    def process_request(self, request, client_address) -> None:
        with self._count_lock:
            full = self._open >= self.max_connections
            self._open += not full
        if full:  # on a TLS port no handshake is made yet: closed without an answer, never one in plain text
            self._refuse(request, answer=self.ssl_context is None)
            return
        request.setblocking(False)
        conn = _Connection(request, client_address, time.monotonic() + self.header_timeout)  # TLS: its handshake too
        if self.ssl_context is not None:
            try:  # no I/O here: the head reader makes the handshake, without blocking
                conn.sock = self.ssl_context.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            except OSError:  # the client has gone already
                self._close(conn)
                return
            conn.handshaking = True
        self._to_heads(conn)

    def _refuse(self, sock, answer: bool = True) -> None:
        """Closes a connection the server has no room for; with ``answer``, after a 503 sent without waiting
        (over TLS on a TLS connection; what does not go at once is dropped)."""
        self.shed += 1
        if answer:
            try:
                sock.setblocking(False)
                sock.send(_SHED)  # fits in the socket buffer; never waits
            except OSError:
                pass
        self.shutdown_request(sock)

    def _close(self, conn: _Connection) -> None:
        self.shutdown_request(conn.sock)
        with self._count_lock:
            self._open -= 1

    def _to_heads(self, conn: _Connection) -> None:
        self._incoming.append(conn)
        try:
            self._wake_write.send(b"x")
        except OSError:  # the wake-up socket is full: the head reader has wake-ups pending anyway
            pass

    # ------------------------------------------------------------------ the head reader
    def _read_heads(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ)
        waiting = {}  # socket -> _Connection

        def settle(conn: _Connection, outcome) -> None:
            """Dispatches or closes ``conn`` (_HEAD_IN, _GONE), or has it wait for the event ``outcome``."""
            if outcome in (_HEAD_IN, _GONE):
                if conn.sock in waiting:
                    selector.unregister(conn.sock)
                    del waiting[conn.sock]
                self._dispatch(conn) if outcome is _HEAD_IN else self._close(conn)
            elif conn.sock not in waiting:
                waiting[conn.sock] = conn
                selector.register(conn.sock, outcome, conn)
            elif selector.get_key(conn.sock).events != outcome:
                selector.modify(conn.sock, outcome, conn)

        while not self._closing:
            soonest = min((c.deadline for c in waiting.values()), default=None)
            wait = None if soonest is None else max(0.0, soonest - time.monotonic())
            for key, _ in selector.select(wait):
                if key.fileobj is not self._wake_read:
                    settle(key.data, self._advance(key.data))
                    continue
                try:
                    self._wake_read.recv(4096)
                except OSError:
                    pass
                while self._incoming:  # new connections, and kept-alive ones back from a worker
                    conn = self._incoming.popleft()
                    # A pipelined request may be in whole. Else read now what came, or start the handshake: a
                    # worker's reads can leave decrypted bytes in the SSL object (``pending()``), which select
                    # does not see; recv hands them out first.
                    settle(conn, _HEAD_IN if conn.head_complete() else self._advance(conn))
            now = time.monotonic()
            for conn in [c for c in waiting.values() if c.deadline <= now]:
                settle(conn, _GONE)  # its head did not come in time (or it idled too long): closed, no worker held
        for conn in list(waiting.values()):
            settle(conn, _GONE)
        selector.close()

    def _advance(self, conn: _Connection):
        """Moves ``conn`` on with what its socket holds now, never waiting: its TLS handshake, then the bytes of
        its request head. Returns the event it waits for (``selectors.EVENT_READ`` or ``EVENT_WRITE``),
        ``_HEAD_IN`` (its head is in, or too long: http.server answers 431) or ``_GONE``."""
        try:
            if conn.handshaking:
                conn.sock.do_handshake()
                conn.handshaking = False
            # A TLS recv hands out at most the rest of one record (16 KiB at most, under MAX_HEAD), so nothing
            # stays decrypted in the SSL object behind it; the next record is in the kernel, seen by select.
            chunk = conn.sock.recv(MAX_HEAD)
        except (BlockingIOError, ssl.SSLWantReadError):
            return selectors.EVENT_READ
        except ssl.SSLWantWriteError:
            return selectors.EVENT_WRITE
        except OSError:  # a reset, or a failed handshake (a plain request, no client certificate): no answer
            return _GONE
        if not chunk:  # the client went away
            return _GONE
        if not conn.buffer:  # a keep-alive connection's next request starts: its head has a few seconds
            conn.deadline = min(conn.deadline, time.monotonic() + self.header_timeout)
        seen, conn.buffer = len(conn.buffer), conn.buffer + chunk
        return _HEAD_IN if conn.head_complete(seen) or len(conn.buffer) > MAX_HEAD else selectors.EVENT_READ

    def _dispatch(self, conn: _Connection) -> None:
        """A connection whose request head is in, to the workers (503 when they are all busy and
        ``num_threads`` more requests wait)."""
        try:
            self._pending.put_nowait(conn)
        except queue.Full:
            self._refuse(conn.sock)
            with self._count_lock:
                self._open -= 1

    # ------------------------------------------------------------------ workers
    def _work(self) -> None:
        while True:
            conn = self._pending.get()
            if conn is None:
                return
            keep, handler = False, None
            try:
                handler = self.RequestHandlerClass(conn, conn.address, self)
                keep = not handler.close_connection
            except Exception:  # noqa: BLE001 -- one line per failure, the worker goes on
                self.handle_error(conn.sock, conn.address)
            if keep and not self._closing:
                conn.buffer, conn.deadline = handler.leftover, time.monotonic() + self.timeout  # idle keep-alive
                try:
                    conn.sock.setblocking(False)
                except OSError:
                    keep = False
            if keep and not self._closing:
                self._to_heads(conn)
            else:
                self._close(conn)

    def handle_error(self, request, client_address) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, CLIENT_GONE):
            return
        self.log(f"REST connection from {client_address[0]}: {type(err).__name__}: {err}")

    def server_close(self) -> None:
        super().server_close()
        self._closing = True
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass
        self._heads.join(timeout=10)
        for _ in self._workers:
            try:
                self._pending.put_nowait(None)
            except queue.Full:
                break
