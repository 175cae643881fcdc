"""The model server under a hostile user (issue 15, items 11-15): JSON depth, slow and aborted clients, the
connection cap, 413 from the header alone, memory under malformed traffic. Loading (item 10) and hot swaps
are tests/test_registry_loading.py's.

A tiny string model (``sentence`` -> its length) stands in for a GPT export: these are properties
of the server, not of the model. Every request goes to 127.0.0.1; every loop is bounded in count
and time.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench._servers import GOOD, KINDS, Client, drive, free_port, server_stats
from serving.errors import ServingError
from serving.model_registry import ModelRegistry
from serving.rest_json import MAX_JSON_DEPTH, json_depth, parse_body
from serving.server_config import ModelConfig
from tests.small_runs import ENV, ROOT, save_length_model, start_server, stop_servers, wait_for

HOST = "127.0.0.1"
THREADS, TIMEOUT_MS = 4, 1500


# ---------------------------------------------------------------------------------------------- item 11
def test_json_depth_limit():
    assert json_depth(b'{"a": [[1], [2]], "s": "[[[[\\"]]"}') == 3
    parse_body(b'{"x": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}")
    with pytest.raises(ServingError, match=f"nesting depth 1001 exceeds the limit of {MAX_JSON_DEPTH}") as err:
        parse_body(b"{" + b'"a": [' * 1000 + b"]" * 1000 + b"}")
    assert err.value.http_status == 400


# ---------------------------------------------------------------------------------------------- the server
def serve_length_model(root: Path, timeout_ms: int, header_ms: int = 5_000):
    """``python -m serving.server`` with THREADS REST threads, a ``timeout_ms`` request deadline and a
    ``header_ms`` header deadline: ``(process, gRPC port, REST port, its log)``."""
    save_length_model(root / "sst2" / "1")
    proc = start_server(root / "server.log", "--model_name=sst2", f"--model_base_path={root / 'sst2'}",
                        f"--rest_api_num_threads={THREADS}", f"--rest_api_timeout_in_ms={timeout_ms}",
                        f"--rest_api_header_timeout_in_ms={header_ms}", "--max_request_bytes=2000000")
    return (proc, *proc.ports, proc.log)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server with a 1.5 s request deadline (TIMEOUT_MS), shared by this module's tests."""
    started = serve_length_model(tmp_path_factory.mktemp("served"), TIMEOUT_MS)
    yield started
    stop_servers(started[0])


def request(port, data: bytes, timeout: float = 10.0) -> bytes:
    """Raw bytes to the server on a fresh connection; its answer, headers and body (b'' if closed at once)."""
    answer = b""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(data)
        try:
            while True:  # until the body announced by Content-Length is in, or the server closes
                chunk = s.recv(65536)
                answer += chunk
                head, _, body = answer.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                if not chunk or (length and len(body) >= length[0]):
                    return answer
        except ConnectionResetError:
            return answer


def post(path: str, body: bytes, length=None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n"
            ).encode() + body


def test_deep_json_is_400_invalid_argument(server):
    _, _, port, _ = server
    answer = request(port, post("/v1/models/sst2:predict", b'{"instances": ' + b"[" * 1000 + b"]" * 1000 + b"}"))
    assert answer.startswith(b"HTTP/1.1 400") and b"nesting depth 1001" in answer, answer


def test_lone_surrogates_and_huge_numbers_are_400_not_500(server):
    """Valid JSON the server cannot use: a lone surrogate in a text (predict input, example feature or its
    name), a version number or an int64 feature beyond 64 bits. Each is a 400 naming the value (before: 500)."""
    _, _, port, _ = server
    cases = [
        ("/v1/models/sst2:predict", b'{"instances": ["ok", "\\ud800"]}', b"lone surrogate"),
        ("/v1/models/sst2:predict", b'{"inputs": {"sentence": ["\\udfff x"]}}', b"lone surrogate"),
        ("/v1/models/sst2:classify", b'{"examples": [{"x": "\\ud800"}]}', b"lone surrogate"),
        ("/v1/models/sst2:classify", b'{"examples": [{"\\ud800": "x"}]}', b"lone surrogate"),
        ("/v1/models/sst2:classify", b'{"examples": [{"x": 99999999999999999999}]}', b"out of range for int64"),
        ("/v1/models/sst2/versions/99999999999999999999:predict", b'{"instances": ["a"]}', b"beyond the largest"),
    ]
    for path, body, message in cases:
        answer = request(port, post(path, body))
        assert answer.startswith(b"HTTP/1.1 400") and message in answer, (path, body, answer)
    answer = request(port, b"GET /v1/models/sst2/versions/99999999999999999999 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400") and b"beyond the largest" in answer, answer
    answer = request(port, post("/v1/models/sst2:predict", b'{"instances": ["abc"]}'))
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_413_comes_from_the_content_length_alone(server):
    _, _, port, _ = server
    start = time.monotonic()
    answer = request(port, post("/v1/models/sst2:predict", b"", length=999_999_999))  # the body never comes
    assert answer.startswith(b"HTTP/1.1 413") and b"999999999 bytes exceeds" in answer, answer
    assert time.monotonic() - start < TIMEOUT_MS / 1000  # answered before any read of the body could time out
    import http.client

    conn = http.client.HTTPConnection(HOST, port, timeout=30)  # a client that sends its 3 MB body anyway
    conn.request("POST", "/v1/models/sst2:predict", b"x" * 3_000_000)
    response = conn.getresponse()
    assert response.status == 413 and b"3000000 bytes exceeds" in response.read()
    conn.close()


def held(port: int, n: int) -> list:
    """``n`` connections that each send the start of a request head and then nothing."""
    socks = []
    for _ in range(n):
        s = socket.create_connection((HOST, port), timeout=30)
        s.sendall(b"POST /v1/models/sst2:predict HTTP/1.1\r\nHo")
        socks.append(s)
    return socks


def closed_by_server(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (EOF, no answer) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(100) == b""
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True


def test_partial_header_clients_hold_no_worker(tmp_path):
    """16 x THREADS connections that send a partial header and hold it, plus one that trickles its header a
    byte at a time: a complete request beside them is answered 200 (before: the first 2 x THREADS filled the
    workers and their queue and it got 503, for as long as the request deadline), and the server closes every
    partial one at its header deadline (2 s here), well before the 30 s request deadline, without a 503."""
    proc, _, port, _ = serve_length_model(tmp_path, 30_000, header_ms=2_000)
    try:
        slow = held(port, 16 * THREADS)
        trickler = socket.create_connection((HOST, port), timeout=30)
        trickler.sendall(b"GET /v1/models/sst2 HTTP/1.1\r\n")
        answer = request(port, b"GET /v1/models/sst2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer
        answer = request(port, post("/v1/models/sst2:predict", b'{"instances": ["abcd"]}'))
        assert answer.startswith(b"HTTP/1.1 200") and b"4" in answer.split(b"\r\n\r\n", 1)[1], answer
        trickled = 0
        try:
            for _ in range(100):  # one header byte every 0.2 s: a header that never ends
                trickler.sendall(b"X")
                trickled += 1
                time.sleep(0.2)
        except OSError:  # the server closed it at its header deadline
            pass
        assert trickled < 100, "a trickled header was never cut off"
        assert all(closed_by_server(s, 25) for s in slow)  # closed (EOF), none answered 503
        for s in [*slow, trickler]:
            s.close()
        wait_for(lambda: server_stats(proc.pid)["fds"] < 30, 30, "connections left open")
    finally:
        stop_servers(proc)


def test_connections_past_the_cap_get_503_and_none_waits_without_bound(tmp_path):
    """A RestServer capped at 8 open connections (in this process): 8 held, the 9th is answered 503 at once;
    once the held ones are closed at their header deadline the server serves again."""
    from serving.rest import RestServer

    save_length_model(tmp_path / "sst2" / "1")
    registry = ModelRegistry([ModelConfig("sst2", str(tmp_path / "sst2"))], log=lambda _: None)
    registry.poll()
    rest = RestServer(registry, HOST, 0, 2_000_000, THREADS, 30.0, log=lambda _: None, header_timeout=1.0,
                      max_connections=8)
    rest.start()
    try:
        slow = held(rest.port, 8)
        wait_for(lambda: rest._server._open == 8, 30, "the held connections were not all accepted")  # noqa: SLF001
        answer = request(rest.port, b"GET /v1/models/sst2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 503") and rest.shed == 1, answer
        assert all(closed_by_server(s, 25) for s in slow)
        for s in slow:
            s.close()
        answer = request(rest.port, b"GET /v1/models/sst2 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer
    finally:
        rest.stop()
        registry.stop()


def test_clients_that_go_away_leave_no_traceback(server):
    _, _, port, log_path = server
    before = log_path.read_text()
    for i in range(300):
        s = socket.create_connection((HOST, port), timeout=10)
        if i % 3 == 0:
            s.sendall(post("/v1/models/sst2:predict", b'{"instances": ["a"]}'))
        elif i % 3 == 1:
            s.sendall(post("/v1/models/sst2:predict", b'{"inst', length=5000))  # body cut off
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, not a clean close
        s.close()
    time.sleep(0.5)
    answer = request(port, post("/v1/models/sst2:predict", b'{"instances": ["abc"]}'))
    assert answer.startswith(b"HTTP/1.1 200") and b"3" in answer.split(b"\r\n\r\n", 1)[1], answer
    added = log_path.read_text()[len(before):]
    assert "Traceback" not in added and len(added.splitlines()) <= 3, added[-2000:]


class Count:
    """A results sink for ``drive`` that counts instead of keeping (kept results would be traced memory)."""

    def __init__(self):
        self.n = 0

    def append(self, _):
        self.n += 1


def malformed_kinds(grpc: bool) -> list:
    """Every malformed request kind, one 1 MB body in 45 (``bench.soak``'s kinds; REST only without gRPC)."""
    skip = ("big_",) if grpc else ("big_", "grpc")
    small = [k for k in KINDS if k not in GOOD and not k.startswith(skip)]
    return small * 4 + ["big_bad_json"] + small * 4 + ["big_ragged"]


def burst(clients, kinds, total: int, seconds: float) -> int:
    """``total`` requests of ``kinds`` from ``clients`` in parallel (bounded by ``seconds``); returns how many ran."""
    count, lock = Count(), threading.Lock()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=drive, args=(c, kinds, 5 * i, deadline, total // len(clients), count, lock))
               for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count.n


def test_memory_is_flat_under_malformed_traffic(server):
    """Malformed requests of every kind until RSS settles (the allocator's arenas fill up), then 5,000
    more: RSS at most 8% above. A check for gross leaks of the whole process (TensorFlow's side included);
    slow leaks in the Python request path are the next test's job, which measures them exactly.

    One request in 45 has a 1 MB body (``bench.soak`` sends more of them, for minutes). RSS keeps
    creeping up, more slowly, for thousands of requests: the allocators' fragmentation from the 1 MB
    bodies (small malformed requests alone stay flat to 0.1 MB over 12,000; malloc_trim after each big
    body does not flatten it). So the warm-up is at least 4,000 requests, in bursts of 1,000, until one
    moves RSS by under 1% (at most 8,000). With shorter warm-ups, loaded CI machines failed it twice:
    888 MB after 1,000 requests -> 947 MB, and 892 MB after 1,500 -> 937 MB (±5% then). Its power is
    coarse: with the shorter warm-up and ±5%, a leak planted in ``parse_body`` of 15 kB per parsed
    request failed it (916 -> 970 MB) and 10 kB did not; with this warm-up 15 kB passes ±5%."""
    proc, grpc_port, port, _ = server
    clients, bad = [Client(port, grpc_port) for _ in range(THREADS)], malformed_kinds(grpc=True)
    assert burst(clients, bad, 1000, 240) == 1000
    readings = [server_stats(proc.pid)["rss_mb"]]
    while len(readings) < 8:
        assert burst(clients, bad, 1000, 240) == 1000
        readings.append(server_stats(proc.pid)["rss_mb"])
        if len(readings) >= 4 and abs(readings[-1] / readings[-2] - 1) < 0.01:
            break
    after_warmup = readings[-1]
    done = burst(clients, bad, 5000, 240)
    end = server_stats(proc.pid)["rss_mb"]
    assert done == 5000 and proc.poll() is None
    # a leak grows RSS; the allocator handing pages back lowers it (by 16% once, on a loaded CI machine)
    assert end / after_warmup - 1 <= 0.08, {"warm-up": readings, "end": end}


def rest_front_growth(folder: str, windows: int = 2, per_window: int = 500) -> list:
    """Traced Python memory (bytes) kept by each window of ``per_window`` malformed REST requests, after
    a warm-up, by a ``RestServer`` + ``ModelRegistry`` in this process (as ``serving.server`` runs them)."""
    import gc
    import tracemalloc

    from serving.rest import RestServer

    save_length_model(Path(folder) / "sst2" / "1")
    registry = ModelRegistry([ModelConfig("sst2", str(Path(folder) / "sst2"))], log=lambda _: None)
    registry.poll()
    rest = RestServer(registry, HOST, 0, 2_000_000, THREADS, TIMEOUT_MS / 1000, log=lambda _: None)
    rest.start()
    clients = [Client(rest.port, free_port()) for _ in range(THREADS)]  # REST kinds only: no gRPC server
    bad = malformed_kinds(grpc=False)
    try:
        assert burst(clients, bad, 300, 120) == 300
        tracemalloc.start()
        assert burst(clients, bad, 300, 120) == 300
        grown = []
        for _ in range(windows):
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            assert burst(clients, bad, per_window, 120) == per_window
            gc.collect()
            grown.append(tracemalloc.get_traced_memory()[0] - before)
        return grown
    finally:
        tracemalloc.stop()
        rest.stop()
        registry.stop()


def test_rest_front_keeps_no_python_memory_per_malformed_request(tmp_path):
    """The REST front under ``tracemalloc``: after a warm-up, 500 malformed requests of every REST
    kind, 1 MB bodies included, leave under 500 bytes of Python memory each (measured: ~20). Unlike
    RSS, traced memory is not moved by the allocators' fragmentation, so a slow leak cannot hide in
    it: a leak planted in ``parse_body`` of 2 kB per parsed body fails it ([1200, 1159] bytes per
    request). It runs in a fresh process: traced memory is the whole process's, and inside the full
    suite's process something else allocates too (a clean-clone run saw 7 MB kept in each of the two
    windows, another 19.6 MB in one; never when this file ran alone; what it was is not known). Two
    windows, the smaller growth counts: a leak grows in every window, a one-off holding can land in one."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        grown = pool.submit(rest_front_growth, str(tmp_path)).result(timeout=600)
    assert min(grown) < 500 * 500, f"{[g // 500 for g in grown]} bytes of Python memory kept per request"


def test_server_flags_are_checked_before_anything_starts():
    proc = subprocess.run([sys.executable, "-m", "serving.server", "--model_base_path=/nonexistent",
                           "--max_num_load_retries=-1", "--rest_api_num_threads=0"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--max_num_load_retries=-1 must be >= 0" in proc.stderr and "--rest_api_num_threads" in proc.stderr
