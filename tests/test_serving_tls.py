"""TLS on both ports of ``python -m serving.server --ssl_config_file`` (serving/tls.py, serving/http_front.py)
and in ``serving.client``: the right CA (and, with client_verify, a client certificate) gets answers, anything
else gets none, nothing is answered in plain text, and a client that stalls its handshake holds no worker.

The certificates are made here with the ``openssl`` command line (EC keys: fast): a CA, a server certificate it
signs for IP:127.0.0.1 and DNS:localhost, a client certificate it signs, and a second CA that signed nothing of
these. Two servers serve a tiny string model (``sentence`` -> its ``length``): one checks no client certificates
and has one REST worker (the stalled-handshake test), the other has ``client_verify``; two more must stop at
start on bad config files. All four start at once. Every socket has a timeout and every loop a deadline.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from serving import tls
from serving.client import ServingClient
from serving.errors import ServingError
from serving.http_front import BoundedHTTPServer, DeadlineHandler
from tests.small_runs import ENV, ROOT, save_length_model, server_ready, spawn_server, stop_servers

HOST = "127.0.0.1"
HEADER_S = 2.5  # the one-way server's header deadline: a handshake and a request head must come within it
LENGTHS = {"sentence": ["abc", "hello"]}  # -> length [3, 5]
GARBAGE_PEM = "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
CURL_ENV = {k: v for k, v in os.environ.items() if k not in ("CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")}


# ---------------------------------------------------------------------------------------------- certificates
def openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True, timeout=30)


def make_certs(folder: Path) -> dict:
    """PEM files: ``ca``, ``other_ca`` (certificates), ``server``/``server_key`` and ``client``/``client_key``
    (signed by ``ca``)."""
    for ca in ("ca", "other_ca"):
        openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{ca}_key.pem", "-out", f"{ca}.pem", "-subj", f"/CN=test {ca}", "-days", "2",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    uses = {"server": "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            "client": "extendedKeyUsage=clientAuth\n"}
    for name, extensions in uses.items():
        (folder / f"{name}.ext").write_text(extensions)
        openssl(folder, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", f"{name}_key.pem", "-out", f"{name}.csr", "-subj", f"/CN=test {name}")
        openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca_key.pem",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem")
    return {name: str(folder / f"{name}.pem") for name in
            ("ca", "other_ca", "server", "server_key", "client", "client_key")}


def write_ssl_config(path: Path, client_verify: bool = False, **pem_files) -> Path:
    """An SSLConfig text proto as an operator writes it: each PEM field its file's lines, one quoted string a
    line (the text format joins adjacent strings)."""
    text = ""
    for field, file in pem_files.items():
        text += f"{field}:\n" + "".join(f'  "{line}\\n"\n' for line in Path(file).read_text().splitlines())
    path.write_text(text + f"client_verify: {str(client_verify).lower()}\n")
    return path


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict:
    return make_certs(tmp_path_factory.mktemp("certs"))


# ---------------------------------------------------------------------------------------------- servers
def spawn_tls_server(root: Path, config: Path, *flags: str):
    """``python -m serving.server`` on the length model with ``--ssl_config_file=config`` (not waited for)."""
    return spawn_server(root / f"{config.stem}.log", "--model_name=sst2", f"--model_base_path={root / 'sst2'}",
                        f"--ssl_config_file={config}", *flags)


def bad_configs(root: Path, certs: dict) -> dict:
    """Config file -> the start of the one line the server must exit with."""
    garbage = root / "garbage.pem"
    garbage.write_text(GARBAGE_PEM)
    return {write_ssl_config(root / "missing.config", server_key=certs["server_key"]): "server_cert missing",
            write_ssl_config(root / "garbage.config", server_key=certs["server_key"], server_cert=garbage):
                "server_key and server_cert do not load"}


@pytest.fixture(scope="module")
def launched(tmp_path_factory, certs):
    """Every server process of this module, started at once (each spends seconds of CPU importing TensorFlow):
    ``"bad"``, ``[(config, reason, process)]`` with a bad ssl config (the model is not needed: they must exit
    before loading it), and two servers of the length model. ``"one_way"`` checks no client certificates (its
    custom_ca is there but client_verify is off, as TF Serving reads it) and has one REST worker and a HEADER_S
    header deadline; ``"mutual"`` has client_verify."""
    root = tmp_path_factory.mktemp("served")
    bad = [(config, reason, spawn_tls_server(root, config)) for config, reason in bad_configs(root, certs).items()]
    save_length_model(root / "sst2" / "1")
    key_pair = {"server_key": certs["server_key"], "server_cert": certs["server"], "custom_ca": certs["ca"]}
    started = {
        "one_way": spawn_tls_server(root, write_ssl_config(root / "one_way.config", **key_pair),
                                    "--rest_api_num_threads=1",
                                    f"--rest_api_header_timeout_in_ms={int(HEADER_S * 1000)}"),
        "mutual": spawn_tls_server(root, write_ssl_config(root / "mutual.config", client_verify=True, **key_pair)),
    }
    try:
        yield {"bad": bad, **started}
    finally:
        for _, _, proc in bad:
            proc.kill()
        stop_servers(*started.values())


@pytest.fixture(scope="module")
def servers(launched) -> dict:
    """The two servers of ``launched``, ready."""
    for name in ("one_way", "mutual"):
        server_ready(launched[name])
    return {name: launched[name] for name in ("one_way", "mutual")}


# ---------------------------------------------------------------------------------------------- clients
def curl(*args: str) -> subprocess.CompletedProcess:
    """``curl`` with no CA but those given, no proxy and a 10 s limit; its stdout and exit code."""
    return subprocess.run(["curl", "-sS", "--noproxy", "*", "--max-time", "10", *args], env=CURL_ENV,
                          capture_output=True, text=True, timeout=30, check=False)


def client_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "serving.client", "--model_name=sst2", "--input=sentence=abc", "--timeout=10"]
    return subprocess.run([*command, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60,
                          check=False)


def lengths(client: ServingClient) -> list:
    try:
        return client.predict("sst2", LENGTHS)["length"].tolist()
    finally:
        client.close()


def tls_socket(port: int, certs: dict) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=certs["ca"])
    return context.wrap_socket(socket.create_connection((HOST, port), timeout=10), server_hostname=HOST)


def read_until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What ``sock`` receives until the server closes it, and the monotonic time it did; fails after ``seconds``."""
    data, deadline = b"", time.monotonic() + seconds
    try:
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return data, time.monotonic()


def answers(sock: socket.socket, count: int, seconds: float = 10.0) -> list[bytes]:
    """``count`` HTTP answers (heads and Content-Length bodies) read from ``sock`` within ``seconds``."""
    data, found, deadline = b"", [], time.monotonic() + seconds
    while len(found) < count:
        head, sep, rest = data.partition(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head) if sep else None
        if length and len(rest) >= int(length.group(1)):
            found.append(head + sep + rest[:int(length.group(1))])
            data = rest[int(length.group(1)):]
            continue
        assert time.monotonic() < deadline, (found, data[:200])
        chunk = sock.recv(65536)
        assert chunk, (found, data[:200])
        data += chunk
    return found


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


# ---------------------------------------------------------------------------------------------- the config file
def test_read_ssl_config_takes_tf_servings_format_and_names_the_file_in_each_refusal(certs, tmp_path):
    good = write_ssl_config(tmp_path / "good.config", client_verify=True, server_key=certs["server_key"],
                            server_cert=certs["server"], custom_ca=certs["ca"])
    config = tls.read_ssl_config(good)
    assert config.server_cert == Path(certs["server"]).read_text() and config.client_verify
    assert "PRIVATE KEY" not in repr(config)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text(GARBAGE_PEM)
    cases = {
        "missing": ("server_cert missing", {"server_key": certs["server_key"]}),
        "no_ca": ("client_verify needs custom_ca", {"server_key": certs["server_key"], "server_cert": certs["server"],
                                                    "client_verify": True}),
        "garbage": ("server_key and server_cert do not load", {"server_key": certs["server_key"],
                                                               "server_cert": garbage}),
        "mismatch": ("server_key and server_cert do not load", {"server_key": certs["client_key"],
                                                                "server_cert": certs["server"]}),
        "bad_ca": ("custom_ca does not load", {"server_key": certs["server_key"], "server_cert": certs["server"],
                                               "custom_ca": garbage}),
    }
    for name, (message, fields) in cases.items():
        with pytest.raises(ValueError, match=re.escape(f"{tmp_path / name}: {message}")):
            tls.read_ssl_config(write_ssl_config(tmp_path / name, **fields))
    (tmp_path / "paths").write_text(f'server_key: "{certs["server_key"]}"\nserver_cert: "{certs["server"]}"\n')
    with pytest.raises(ValueError, match="server_key must hold the PEM text itself"):
        tls.read_ssl_config(tmp_path / "paths")
    (tmp_path / "typo").write_text('server_certificate: "x"\n')
    with pytest.raises(ValueError, match="typo: not an SSLConfig text proto.*server_certificate"):
        tls.read_ssl_config(tmp_path / "typo")


def test_a_bad_ssl_config_stops_the_server_with_one_line_naming_the_file(launched):
    for config, reason, proc in launched["bad"]:
        out, _ = proc.communicate(timeout=120)
        err = proc.log.read_text()
        naming = [line for line in err.splitlines() if str(config) in line]
        assert proc.returncode == 1 and out == "", (out, err)
        assert len(naming) == 1 and naming[0].startswith(f"serving.server: {config}: {reason}"), err


# ---------------------------------------------------------------------------------------------- gRPC
def test_grpc_answers_a_client_with_the_ca_and_no_other(servers, certs):
    grpc_port = servers["one_way"].ports[0]
    assert lengths(ServingClient(HOST, grpc_port, ssl_ca_file=certs["ca"])) == [3, 5]
    for refused in (ServingClient(HOST, grpc_port, timeout=5),  # plain text
                    ServingClient(HOST, grpc_port, timeout=5, ssl_ca_file=certs["other_ca"])):
        with pytest.raises(ServingError) as err:
            lengths(refused)
        assert err.value.code.name == "UNAVAILABLE"


def test_the_client_command_over_tls(servers, certs):
    grpc_port, rest_port = servers["one_way"].ports
    with ThreadPoolExecutor(3) as pool:
        over_grpc, over_rest, without_ca = pool.map(lambda args: client_cli(*args), [
            (f"--port={grpc_port}", f"--ssl_ca_file={certs['ca']}"),
            (f"--port={rest_port}", "--protocol=rest", f"--ssl_ca_file={certs['ca']}"),
            (f"--port={grpc_port}", "--timeout=5")])
    for run in (over_grpc, over_rest):
        assert run.returncode == 0 and json.loads(run.stdout) == {"length": 3}, run.stderr
    assert without_ca.returncode == 1 and without_ca.stderr.startswith("serving.client: UNAVAILABLE:"), without_ca
    assert len(without_ca.stderr.strip().splitlines()) == 1, without_ca.stderr


# ---------------------------------------------------------------------------------------------- REST
def test_https_answers_curl_with_the_ca_and_no_other(servers, certs):
    url = f"https://{HOST}:{servers['one_way'].ports[1]}/v1/models/sst2"
    status = curl("--cacert", certs["ca"], url)
    assert status.returncode == 0 and json.loads(status.stdout)["model_version_status"][0]["state"] == "AVAILABLE"
    predict = curl("--cacert", certs["ca"], "-d", '{"instances": ["abc", "hello"]}', url + ":predict")
    assert predict.returncode == 0 and json.loads(predict.stdout) == {"predictions": [3, 5]}, predict.stderr
    assert curl(url).returncode == 60  # the server's certificate is not one the system trusts
    assert curl("--cacert", certs["other_ca"], url).returncode == 60
    assert ServingClient(HOST, servers["one_way"].ports[1], "rest", ssl_ca_file=certs["ca"]).predict(
        "sst2", LENGTHS)["length"].tolist() == [3, 5]


def test_nothing_is_answered_in_plain_text(servers, certs):
    """A plain HTTP request to a TLS REST port gets no HTTP answer (at most a TLS alert), then a close."""
    for server in servers.values():
        with socket.create_connection((HOST, server.ports[1]), timeout=10) as plain:
            plain.sendall(http_request("GET", "/v1/models/sst2"))
            answer, _ = read_until_closed(plain, 10)
        assert b"HTTP/" not in answer and b"sst2" not in answer, answer


def test_keep_alive_and_pipelined_requests_over_tls(servers, certs):
    """Two requests in one write (the first with a body of several TLS records), then a third on the same
    connection: each answered, in order (the connection goes back and forth between the workers and the
    head reader)."""
    body = json.dumps({"instances": ["a" * 70_000]}).encode()
    with tls_socket(servers["one_way"].ports[1], certs) as sock:
        sock.sendall(http_request("POST", "/v1/models/sst2:predict", body) + http_request("GET", "/v1/models/sst2"))
        first, second = answers(sock, 2)
        sock.sendall(http_request("GET", "/v1/models/sst2/metadata"))
        (third,) = answers(sock, 1)
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b'"predictions": [\n  70000\n ]\n}'), first
    assert second.startswith(b"HTTP/1.1 200") and b"AVAILABLE" in second, second
    assert third.startswith(b"HTTP/1.1 200") and b"signature_def" in third, third[:300]


def test_stalled_handshakes_hold_no_worker_and_are_closed_at_the_header_deadline(servers, certs):
    """With one REST worker: a connection that sends nothing, one that sends half a ClientHello and one that
    finishes its handshake and sends no request are all open while a real request is answered; each is
    closed HEADER_S after its accept."""
    port = servers["one_way"].ports[1]
    context = ssl.create_default_context(cafile=certs["ca"])
    hello = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=HOST)
    with pytest.raises(ssl.SSLWantReadError):
        hello.do_handshake()
    half_hello = outgoing.read()
    half_hello = half_hello[:len(half_hello) // 2]
    opened = time.monotonic()
    silent = socket.create_connection((HOST, port), timeout=10)
    halfway = socket.create_connection((HOST, port), timeout=10)
    halfway.sendall(half_hello)
    idle = tls_socket(port, certs)
    try:
        assert curl("--cacert", certs["ca"], f"https://{HOST}:{port}/v1/models/sst2").returncode == 0
        answered = time.monotonic() - opened
        closed = [read_until_closed(sock, HEADER_S + 10) for sock in (silent, halfway, idle)]
    finally:
        for sock in (silent, halfway, idle):
            sock.close()
    assert answered < HEADER_S, answered
    assert [data for data, _ in closed[::2]] == [b"", b""]  # (the half hello may get a TLS alert)
    assert all(HEADER_S - 0.3 < at - opened < HEADER_S + 3 for _, at in closed), [at - opened for _, at in closed]


# ---------------------------------------------------------------------------------------------- client_verify
def test_client_verify_refuses_clients_without_a_certificate_of_its_ca(servers, certs):
    grpc_port, rest_port = servers["mutual"].ports
    mine = {"ssl_client_cert_file": certs["client"], "ssl_client_key_file": certs["client_key"]}
    assert lengths(ServingClient(HOST, grpc_port, ssl_ca_file=certs["ca"], **mine)) == [3, 5]
    assert lengths(ServingClient(HOST, rest_port, "rest", ssl_ca_file=certs["ca"], **mine)) == [3, 5]
    with pytest.raises(ServingError) as err:
        lengths(ServingClient(HOST, grpc_port, timeout=5, ssl_ca_file=certs["ca"]))
    assert err.value.code.name == "UNAVAILABLE"
    url = f"https://{HOST}:{rest_port}/v1/models/sst2"
    with_cert = curl("--cacert", certs["ca"], "--cert", certs["client"], "--key", certs["client_key"], url)
    assert with_cert.returncode == 0 and "AVAILABLE" in with_cert.stdout, with_cert.stderr
    without = curl("--cacert", certs["ca"], url)
    assert without.returncode != 0 and without.stdout == "", without


# ---------------------------------------------------------------------------------------------- the HTTP front
class _Large(DeadlineHandler):
    def do_GET(self):  # noqa: N802 -- http.server's naming
        self.send_response(200)
        self.send_header("Content-Length", str(8 << 20))
        self.end_headers()
        self.wfile.write(b"x" * (8 << 20))


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_an_answer_larger_than_the_socket_buffer_arrives_whole(certs, tmp_path, over_tls):
    """8 MiB to a client that reads only after a moment (a socket file's write would send what fit in the
    socket buffer and drop the rest)."""
    config = write_ssl_config(tmp_path / "ssl.config", server_key=certs["server_key"], server_cert=certs["server"])
    context = tls.rest_context(tls.read_ssl_config(config)) if over_tls else None
    server = BoundedHTTPServer((HOST, 0), _Large, num_threads=1, timeout=10, ssl_context=context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        sock = tls_socket(port, certs) if over_tls else socket.create_connection((HOST, port), timeout=10)
        with sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            time.sleep(0.2)
            answer, _ = read_until_closed(sock, 30)
    finally:
        server.shutdown()
        server.server_close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert len(answer.partition(b"\r\n\r\n")[2]) == 8 << 20

