"""The harness of the pytest suites: start the real binary, talk real HTTP.

Shared by tests/blackbox/ (pilotlight alone) and tests/interop/ (pilotlight
with other programs); tests import its helpers with `from conftest import`.
Everything here uses the standard library only. Each test gets its own server
(via the `server` / `start_server` fixtures) bound to 127.0.0.1:0; the port is
read from the "listening" JSON log line. On teardown the server gets SIGTERM
and must exit 0 with no sanitizer report on stderr.
"""

import copy
import ctypes
import json
import os
import sys
import re
import select
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "harness"))
import impair  # noqa: E402  standard library only: namespaces, limits

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = os.environ.get("PILOTLIGHT_BIN", str(REPO_ROOT / "build" / "pilotlight"))
HOST = "127.0.0.1"
# The black-box suite's valgrind pass (tests/run.sh) sets this: the server
# runs 20-50 times slower under tests/harness/valgrind-wrap.sh.
UNDER_VALGRIND = bool(os.environ.get("PL_VALGRIND_BIN"))


def built_shim(name):
    """The path of tests/<name>, an LD_PRELOAD shim tests/meson.build builds
    beside the binary under test (under valgrind, beside the real one), or
    in build/."""
    real = os.environ.get("PL_VALGRIND_BIN", BIN)
    for d in (Path(real).resolve().parent, REPO_ROOT / "build"):
        p = d / "tests" / name
        if p.is_file():
            return str(p)
    pytest.fail(f"tests/{name} not built (ninja -C build)")


# Sockets and servers get generous bounds: the suite also runs under ASan.
IO_TIMEOUT = 5.0
START_TIMEOUT = 10.0
STOP_TIMEOUT = 12.0
SANITIZER_MARKS = ("AddressSanitizer", "runtime error:", "LeakSanitizer")

# 1,000 parked polls need more descriptors than the usual soft limit of 1024,
# in this process and in the server (which inherits the limit).
impair.raise_fd_limit()


# --------------------------------------------------------------------------
# The example DequeuedMessage and messages derived from it
# --------------------------------------------------------------------------

def _load_example():
    # The example docs/protocol.md shows: a DequeuedMessage as the
    # supervisor sends it.
    with open(Path(__file__).resolve().parent / "blackbox" / "data" / "dequeued-message.json", "rb") as f:
        return json.loads(f.read())


EXAMPLE = _load_example()
EX_DEPLOYMENT = EXAMPLE["deployment"]["friendlyId"]
EX_VERSION = EXAMPLE["backgroundWorker"]["version"]
EX_CPU = EXAMPLE["run"]["machine"]["cpu"]
EX_MEMORY = EXAMPLE["run"]["machine"]["memory"]


def js_number(v):
    """JavaScript String(number) for the small values controllers send."""
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def make_message(deployment=None, version=None, cpu=None, memory=None,
                 run_id=None):
    """A deep copy of the example with the given key fields / run id set."""
    m = copy.deepcopy(EXAMPLE)
    if deployment is not None:
        m["deployment"]["friendlyId"] = deployment
    if version is not None:
        m["backgroundWorker"]["version"] = version
    if cpu is not None:
        m["run"]["machine"]["cpu"] = cpu
    if memory is not None:
        m["run"]["machine"]["memory"] = memory
    if run_id is not None:
        m["run"]["friendlyId"] = run_id
    return m


def key_of(i, prefix="deployment_k"):
    """Key number <i> as (deployment, version, cpu, memory)."""
    return (f"{prefix}{i}", "20261130.1", 0.5, 1)


# --------------------------------------------------------------------------
# The dispatch vectors: bodies read the way Node's JSON.parse reads them
# (tests/vectors/dispatch.tsv, written by gen-dispatch.mjs)
# --------------------------------------------------------------------------

VECTORS = REPO_ROOT / "tests" / "vectors" / "dispatch.tsv"


def dispatch_vectors():
    """Every vector: accepted ones with the key and the exact payload bytes
    JSON.parse reads, refused ones with the text of their error."""
    out = []
    for line in VECTORS.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        f = line.split("\t")
        body = bytes.fromhex(f[1])
        if f[0] == "ok":
            out.append(dict(ok=True, body=body, label=f[8], dep=bytes.fromhex(f[2]),
                            ver=bytes.fromhex(f[3]), cpu=f[4], mem=f[5],
                            payload=body[int(f[6]):int(f[6]) + int(f[7])]))
        else:
            # the text is as it appears inside the JSON error body
            out.append(dict(ok=False, body=body, label=f[3], why=json.loads(f'"{f[2]}"')))
    return out


# Every key a refused vector names, however it is read: polls parked on all
# of them must still be parked after the refusals.
DECOY_KEYS = [("deployment_a", "20261130.1", "0.5", "1"), ("deployment_a", "v", "1", "1"),
              ("A", "v", "1", "1"), ("B", "v", "1", "1"), ("d", "v", "1", "1"),
              ("A", "20261130.1", "0.5", "1"), ("B", "20261130.1", "0.5", "1")]


# --------------------------------------------------------------------------
# Raw HTTP
# --------------------------------------------------------------------------

class Response:
    def __init__(self, version, status, reason, headers, body):
        self.version = version
        self.status = status
        self.reason = reason
        self.header_list = headers          # [(name, value)] as received
        self.headers = {}                   # lower-case name -> joined value
        for k, v in headers:
            k = k.lower()
            self.headers[k] = v if k not in self.headers else self.headers[k] + ", " + v
        self.body = body

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def __repr__(self):
        return f"<Response {self.status} {self.reason!r} {self.headers} {self.body[:200]!r}>"


class ConnectionClosed(Exception):
    pass


def build_request(method, path, headers=None, body=None, version="HTTP/1.1",
                  host=True):
    """Request bytes. <headers> is a list of pairs or a dict; Content-Length
    is added for a bytes body unless a length or chunked encoding is given."""
    items = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    names = {k.lower() for k, _ in items}
    if host and "host" not in names:
        items.insert(0, ("Host", "pilotlight.test"))
    if isinstance(body, str):
        body = body.encode()
    if body is not None and "content-length" not in names \
            and "transfer-encoding" not in names:
        items.append(("Content-Length", str(len(body))))
    head = f"{method} {path} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in items) + "\r\n"
    return head.encode("latin-1") + (body or b"")


class Conn:
    """One client connection with a receive buffer, so pipelined responses
    and interim (1xx) responses can be read one by one."""

    def __init__(self, port, timeout=IO_TIMEOUT, rcvbuf=None, host=HOST):
        """<rcvbuf>: a receive buffer this small (set before connecting, so
        the window stays small): a client that is slow to take a payload.
        <host>: an IPv4 or IPv6 address (without brackets)."""
        if rcvbuf is None:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.sock = socket.socket(family, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            self.sock.settimeout(timeout)
            self.sock.connect((host, port))
        self.buf = b""
        self.eof = False
        self.timeout = timeout

    # -- sending
    def send(self, data):
        self.sock.sendall(data)

    def request(self, method, path, headers=None, body=None, **kw):
        self.send(build_request(method, path, headers, body, **kw))

    # -- receiving
    def _fill(self, deadline):
        if self.eof:
            raise ConnectionClosed("connection closed by server")
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out waiting for the server")
        self.sock.settimeout(left)
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise ConnectionClosed("connection closed by server")
        self.buf += data

    def _read_until(self, marker, deadline):
        while marker not in self.buf:
            self._fill(deadline)
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def _read_exact(self, n, deadline):
        while len(self.buf) < n:
            self._fill(deadline)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, timeout=None, head_request=False):
        """Reads one response (a 1xx interim response counts as one)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        head = self._read_until(b"\r\n\r\n", deadline).decode("latin-1")
        lines = head[:-4].split("\r\n")
        parts = lines[0].split(" ", 2)
        assert len(parts) >= 2 and parts[0].startswith("HTTP/"), f"bad status line {lines[0]!r}"
        version, status = parts[0], int(parts[1])
        reason = parts[2] if len(parts) > 2 else ""
        headers = []
        for ln in lines[1:]:
            k, sep, v = ln.partition(":")
            assert sep, f"bad header line {ln!r}"
            headers.append((k.strip(), v.strip()))
        resp = Response(version, status, reason, headers, b"")
        if 100 <= status < 200 or status in (204, 304) or head_request:
            return resp
        te = resp.headers.get("transfer-encoding", "").lower()
        if "chunked" in te:
            body = b""
            while True:
                size_line = self._read_until(b"\r\n", deadline)
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:  # trailers up to an empty line
                    while self._read_until(b"\r\n", deadline) != b"\r\n":
                        pass
                    break
                body += self._read_exact(size, deadline)
                self._read_exact(2, deadline)
            resp.body = body
        elif "content-length" in resp.headers:
            resp.body = self._read_exact(int(resp.headers["content-length"]), deadline)
        else:
            while True:
                try:
                    self._fill(deadline)
                except ConnectionClosed:
                    break
            resp.body, self.buf = self.buf, b""
        return resp

    def silent_for(self, seconds):
        """True if nothing arrives (no bytes, no close) for <seconds>."""
        if self.buf or self.eof:
            return False
        r, _, _ = select.select([self.sock], [], [], seconds)
        if not r:
            return True
        try:
            self.sock.settimeout(0.5)
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
        self.buf += data
        return False

    def wait_closed(self, timeout=IO_TIMEOUT):
        """Waits for the server to close; returns the bytes received first
        (b"" for a close without any response)."""
        deadline = time.monotonic() + timeout
        got = self.buf
        self.buf = b""
        while not self.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout(f"server did not close; got {got[:200]!r}")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            except socket.timeout:
                continue
            if not data:
                self.eof = True
            got += data
        return got

    def close(self, rst=False):
        if self.sock.fileno() < 0:
            return
        if rst:
            reset_close(self.sock)
        else:
            self.sock.close()


def reset_close(sock):
    """Closes with SO_LINGER 0: the kernel sends RST."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def request(port, method, path, headers=None, body=None, timeout=IO_TIMEOUT, host=HOST):
    """One request on a fresh connection; returns the final response."""
    c = Conn(port, timeout, host=host)
    try:
        c.request(method, path, headers, body)
        r = c.read_response()
        while 100 <= r.status < 200:
            r = c.read_response()
        return r
    finally:
        c.close()


def get(port, path, headers=None, host=HOST):
    return request(port, "GET", path, headers, host=host)


def poll_headers(deployment=EX_DEPLOYMENT, version=EX_VERSION, cpu=EX_CPU,
                 memory=EX_MEMORY, controller_id=None, omit=(), extra=None):
    """Headers of a controller long-poll; numbers become JS strings."""
    if controller_id is None:
        poll_headers.n += 1
        controller_id = f"controller_{os.getpid()}_{poll_headers.n}"
    h = {
        "x-trigger-workload-controller-id": controller_id,
        "x-trigger-deployment-id": deployment,
        "x-trigger-deployment-version": version,
        "x-trigger-machine-cpu": cpu if isinstance(cpu, str) else js_number(cpu),
        "x-trigger-machine-memory": memory if isinstance(memory, str) else js_number(memory),
        "x-trigger-worker-instance-name": "node-1",
    }
    for k in omit:
        del h[k]
    h.update(extra or {})
    return h


poll_headers.n = 0


# --------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\S+)?$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Metrics:
    def __init__(self, text):
        self.text = text
        self.samples = {}   # (name, ((label, value), ...)) -> float
        self.types = {}     # family name -> type
        self.names = set()
        for ln in text.splitlines():
            ln = ln.strip()
            if not ln:
                continue
            if ln.startswith("#"):
                p = ln.split()
                if len(p) >= 4 and p[1] == "TYPE":
                    self.types[p[2]] = p[3]
                continue
            m = _SAMPLE.match(ln)
            assert m, f"unparsable metrics line {ln!r}"
            labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
            self.samples[(m.group(1), labels)] = float(m.group(3))
            self.names.add(m.group(1))

    def get(self, name, **labels):
        """Value of one sample; 0 if the family exists but not this label
        set; KeyError if the family is missing altogether."""
        if name not in self.names:
            raise KeyError(f"metric {name} missing from /metrics")
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def sum(self, name, **labels):
        if name not in self.names:
            raise KeyError(f"metric {name} missing from /metrics")
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items()
                   if n == name and want <= set(ls))

    def settled(self, outcome):
        return self.get("pilotlight_settled_total", outcome=outcome)

    def dispatched(self, result):
        return self.get("pilotlight_dispatch_total", result=result)

    @property
    def parked_now(self):
        return self.get("pilotlight_parked_now")

    @property
    def parked_total(self):
        return self.get("pilotlight_parked_total")

    @property
    def keys_now(self):
        return self.get("pilotlight_keys_now")


def scrape(port, conn=None, host=HOST):
    """/metrics on a fresh connection, or over <conn> (kept open)."""
    if conn is None:
        r = get(port, "/metrics", host=host)
    else:
        conn.request("GET", "/metrics")
        r = conn.read_response()
    assert r.status == 200, r
    return Metrics(r.body.decode("utf-8"))


def assert_ledger(m, host=HOST):
    """parked_now + sum(settled_total) == parked_total (+ adopted_total, the
    polls a binary upgrade handed over from the older process)."""
    if not isinstance(m, Metrics):
        m = scrape(m, host=host)
    now, settled, total = m.parked_now, m.sum("pilotlight_settled_total"), m.parked_total
    total += m.samples.get(("pilotlight_adopted_total", ()), 0.0)
    assert now + settled == total, \
        f"ledger broken: parked_now {now} + settled {settled} != parked_total {total}"
    return m


def wait_metrics(port, pred, timeout=5.0, what="condition", conn=None, host=HOST):
    """Scrapes (over <conn> if given) until pred(metrics) is true; returns
    those metrics."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(port, conn, host)
        if pred(m):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; metrics:\n{m.text}")
        time.sleep(0.02)


def wait_parked(port, n, timeout=5.0, host=HOST):
    return wait_metrics(port, lambda m: m.parked_now == n, timeout,
                        f"parked_now == {n}", host=host)


# --------------------------------------------------------------------------
# Controller polls and dispatches
# --------------------------------------------------------------------------

def park(port, wait=True, host=HOST, **kw):
    """Sends a long-poll on its own connection and returns the Conn. With
    <wait>, returns only once the poll reached the engine (parked_total
    went up), so a later dispatch is ordered after it."""
    before = scrape(port, host=host).parked_total if wait else 0
    c = Conn(port, host=host)
    c.request("GET", "/warm-start", poll_headers(**kw))
    if wait:
        wait_metrics(port, lambda m: m.parked_total >= before + 1,
                     what="the poll to reach the engine", host=host)
    return c


def dispatch_raw(port, body, headers=None, conn=None, host=HOST):
    """POST /warm-start with <body> (bytes/str, or an object sent as JSON)."""
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    if conn is not None:
        conn.request("POST", "/warm-start", h, body)
        return conn.read_response()
    return request(port, "POST", "/warm-start", h, body, host=host)


def dispatch(port, message=None, conn=None, host=HOST):
    """Dispatches {"dequeuedMessage": message}; asserts a well-formed 200
    and returns didWarmStart."""
    if message is None:
        message = EXAMPLE
    r = dispatch_raw(port, {"dequeuedMessage": message}, conn=conn, host=host)
    assert r.status == 200, r
    body = r.json()
    assert set(body) == {"didWarmStart"} and isinstance(body["didWarmStart"], bool), r
    return body["didWarmStart"]


def error_of(r):
    """The error a 400 answer names (a non-empty string)."""
    assert r.status == 400, (r, r.body[:300])
    err = json.loads(r.body)["error"]
    assert isinstance(err, str) and err
    return err


def read_payload(conn, timeout=IO_TIMEOUT):
    """Reads a matched poll's response; asserts 200 JSON; returns the object."""
    r = conn.read_response(timeout=timeout)
    assert r.status == 200, r
    assert r.headers.get("content-type", "").split(";")[0].strip().lower() \
        == "application/json", r
    return r.json()


# --------------------------------------------------------------------------
# The server process
# --------------------------------------------------------------------------

def free_port():
    """A port on HOST that nothing listens on now, for a program that takes
    its port on the command line (the server binds 127.0.0.1:0 itself)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PILOTLIGHT_")}
    env.update(extra or {})
    return env


def check_sanitizers(text, what="pilotlight"):
    for mark in SANITIZER_MARKS:
        assert mark not in text, f"{what}: sanitizer report on stderr:\n{text[-6000:]}"


def json_lines(text):
    """The JSON log records in <text>, other lines skipped."""
    out = []
    for ln in text.splitlines():
        try:
            out.append(json.loads(ln))
        except ValueError:
            pass
    return out


def split_address(address):
    """("host", port) of "host:port" or "[v6]:port" (the host unbracketed)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def wait_stopped(pid, timeout=5.0):
    """Until /proc says <pid> is stopped (SIGSTOP takes effect later)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop")


class Server:
    def __init__(self, args=(), env=None, listen=True, preexec_fn=None, binary=None):
        self.args = [binary or BIN] + (["--listen", f"{HOST}:0"] if listen else []) + list(args)
        self.errf = impair.log_file()
        self.outf = impair.log_file()
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=self.outf, stderr=self.errf,
                                     env=clean_env(env), preexec_fn=preexec_fn)
        self.port = None
        self.address = None
        self.host = HOST  # where this test reaches it (see _wait_listening)
        self.conns = []
        self.stopped = False
        self._wait_listening()

    def stderr(self):
        self.errf.seek(0)
        return self.errf.read().decode("utf-8", "replace")

    def log_lines(self):
        return json_lines(self.stderr())

    def _wait_listening(self):
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for rec in self.log_lines():
                if rec.get("msg") == "listening" and "address" in rec:
                    self.address = rec["address"]
                    host, self.port = split_address(self.address)
                    # A wildcard is reached on loopback; a given address
                    # (--listen 127.0.0.2:P, [::1]:P) at that address.
                    if host not in ("0.0.0.0", "::"):
                        self.host = host
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        rc = self.proc.poll()
        if rc is None:
            self.proc.kill()
            self.proc.wait()
        raise AssertionError(f"no 'listening' log line (exit {rc}); args {self.args}; "
                             f"stderr:\n{self.stderr()[-4000:]}")

    def sigterm(self):
        self.proc.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout=STOP_TIMEOUT):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"pilotlight did not exit within {timeout}s of SIGTERM; "
                                 f"stderr:\n{self.stderr()[-4000:]}")

    def stop(self):
        """SIGTERM (if still running), bounded wait; asserts exit 0 and a
        clean stderr."""
        if self.stopped:
            return
        self.stopped = True
        try:
            if self.proc.poll() is None:
                self.sigterm()
            rc = self.wait_exit()
        finally:
            for c in self.conns:
                c.close()
        err = self.stderr()
        check_sanitizers(err)
        assert rc == 0, f"pilotlight exited {rc}; stderr:\n{err[-4000:]}"

    # -- conveniences bound to this server's address
    def conn(self):
        c = Conn(self.port, host=self.host)
        self.conns.append(c)
        return c

    def park(self, wait=True, **kw):
        c = park(self.port, wait=wait, host=self.host, **kw)
        self.conns.append(c)
        return c

    def get(self, path, headers=None):
        return get(self.port, path, headers, host=self.host)

    def request(self, method, path, headers=None, body=None):
        return request(self.port, method, path, headers, body, host=self.host)

    def dispatch(self, message=None, conn=None):
        return dispatch(self.port, message, conn, host=self.host)

    def dispatch_raw(self, body, headers=None, conn=None):
        return dispatch_raw(self.port, body, headers, conn, host=self.host)

    def metrics(self):
        return scrape(self.port, host=self.host)

    def wait_parked(self, n, timeout=5.0):
        return wait_parked(self.port, n, timeout, host=self.host)

    def wait_metrics(self, pred, timeout=5.0, what="condition"):
        return wait_metrics(self.port, pred, timeout, what, host=self.host)


PR_SET_CHILD_SUBREAPER = 36


@pytest.fixture
def subreaper():
    """This process adopts orphaned descendants: a binary upgrade's new
    process outlives its parent, the server this test started."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    yield
    libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.fixture
def start_server():
    """start_server(*flags, env={...}) -> Server. All servers started are
    stopped at teardown: clients closed, the ledger checked while still
    running, then SIGTERM, exit code 0, no sanitizer report."""
    servers = []

    def start(*args, env=None):
        if not os.access(BIN, os.X_OK):
            pytest.fail(f"pilotlight binary not found at {BIN} (set PILOTLIGHT_BIN)")
        s = Server(args, env)
        servers.append(s)
        return s

    yield start
    errors = []
    for s in servers:
        try:
            if not s.stopped and s.proc.poll() is None:
                for c in s.conns:
                    c.close()
                assert_ledger(s.port, host=s.host)
        except Exception as e:  # still stop the server
            errors.append(e)
        try:
            s.stop()
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


@pytest.fixture
def server(start_server):
    """A server with default settings."""
    return start_server()


def run_binary(*args, env=None, timeout=5.0):
    """Runs pilotlight to completion (for --help, --check-config, bad
    config); returns (rc, stdout, stderr). A run that does not finish within
    <timeout> is killed and fails the test."""
    if not os.access(BIN, os.X_OK):
        pytest.fail(f"pilotlight binary not found at {BIN} (set PILOTLIGHT_BIN)")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([BIN] + list(args), stdin=subprocess.DEVNULL,
                             stdout=out, stderr=err, env=clean_env(env))
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        out.seek(0)
        err.seek(0)
        o = out.read().decode("utf-8", "replace")
        e = err.read().decode("utf-8", "replace")
    check_sanitizers(e, f"pilotlight {' '.join(args)}")
    assert rc is not None, f"pilotlight {' '.join(args)} did not exit within {timeout}s; " \
                           f"stdout {o[-2000:]!r} stderr {e[-2000:]!r}"
    return rc, o, e


# --------------------------------------------------------------------------
# pl-loadgen, the load generator (loadtest/)
# --------------------------------------------------------------------------

LOADGEN = os.environ.get("PL_LOADGEN_BIN",
                         str(REPO_ROOT / "build" / "loadtest" / "pl-loadgen"))


def loadgen(server, *args, **kw):
    """Runs pl-loadgen against pilotlight <server>, reading its CPU and
    metrics; returns (json records, stdout)."""
    return run_loadgen(server.port, "--server-pid", str(server.proc.pid),
                       "--label", "pilotlight", "--metrics", *args, **kw)


def run_loadgen(port, *args, timeout=60, json_only=True):
    if not os.access(LOADGEN, os.X_OK):
        pytest.fail(f"pl-loadgen not found at {LOADGEN} (set PL_LOADGEN_BIN)")
    cmd = [LOADGEN, "--target", f"127.0.0.1:{port}"] + \
        (["--json"] if json_only else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{cmd} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    recs = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    return recs, p.stdout


def no_errors(rec):
    assert rec["errors"] == {"dispatch": 0, "controller": 0, "connection": 0}, rec
