"""Scale-out: three pilotlight instances behind HAProxy with
deploy/haproxy/haproxy.cfg, all on loopback.

A key's controllers and its dispatches must reach the same instance; the
proxy hashes the four key fields (headers for a poll, the JSON body for a
dispatch) onto a consistent-hash ring. These tests hold it to "every dispatch
is answered exactly as one instance would answer it", with numbers written
differently on the two sides and deployment tokens, and through the loss of
an instance (killed, or drained by SIGTERM): its controllers see their
connection close without a response (never a 502), poll again as a real
controller does, are parked on the survivors and matched again; with
PL_HAPROXY_RETRY_ON the proxy resends the polls and they see nothing.

Skipped, saying why, only where haproxy (2.6 or later) is not installed:
deploy/install-deps.sh --test installs Debian's.
"""

import base64
import contextlib
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import (DECOY_KEYS, HOST, Conn, ConnectionClosed, build_request, dispatch_raw, dispatch_vectors,
                      error_of, free_port, make_message, park, poll_headers, read_payload,
                      request, run_binary, scrape, assert_ledger)

REPO_ROOT = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg"


def _find_haproxy():
    exe = shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
        None)
    if exe is None:
        return None, "haproxy is not installed (deploy/install-deps.sh --test installs Debian's)"
    out = subprocess.run([exe, "-v"], capture_output=True, text=True, timeout=10).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < (2, 6):
        return None, f"haproxy at {exe} is older than 2.6 ({out.splitlines()[0] if out else '?'})"
    return exe, ""


HAPROXY, WHY_SKIP = _find_haproxy()
pytestmark = pytest.mark.skipif(HAPROXY is None, reason=WHY_SKIP)

CPUS = [0.25, 0.5, 1, 2, 4]
MEMORIES = [0.25, 0.5, 1, 2, 4, 8]
WAIT = 10.0     # bound on every wait below (generous: the suite also runs under ASan)


# --------------------------------------------------------------------------
# HAProxy in front of the instances
# --------------------------------------------------------------------------

class Proxy:
    """haproxy -db with the repository's config; servers, ports and sockets
    come in through the environment variables the config reads."""

    def __init__(self, servers, tmpdir, env=None):
        self.dir = tmpdir
        self.servers = servers
        self.extra_env = env or {}
        self.stats_sock = os.path.join(tmpdir, "haproxy.sock")
        self.log_path = os.path.join(tmpdir, "haproxy.log")
        self.proc = None
        for _ in range(3):  # the free port may be taken before haproxy binds it
            self.port = free_port()
            if self._start():
                return
        raise AssertionError(f"haproxy did not start:\n{self.log()[-3000:]}")

    def _start(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PL_")}
        env.update({
            "PL_HAPROXY_BIND": f"{HOST}:{self.port}",
            "PL_HAPROXY_STATS_SOCKET": self.stats_sock,
            "PL_HAPROXY_STATS_BIND": os.path.join(self.dir, "stats-http.sock"),
            "PL_HAPROXY_MAXCONN": "1000",
            "PL_HAPROXY_LOG_ROUTE": "1",         # routing strings in the log
        })
        env.update(self.extra_env)
        for i, s in enumerate(self.servers, 1):
            env[f"PL_SERVER_{i}"] = f"{HOST}:{s.port}"
        self.logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(HAPROXY_CFG)], env=env,
                                     stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.logf.close()
                return False
            try:
                if all(st == "UP" for st in self.states()):
                    socket.create_connection((HOST, self.port), timeout=1).close()
                    return True
            except (OSError, KeyError, IndexError):
                pass
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"haproxy never saw its servers UP:\n{self.log()[-3000:]}")

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def cli(self, command):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(5)
        s.connect(self.stats_sock)
        s.sendall(command.encode() + b"\n")
        out = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            out += data
        s.close()
        return out.decode()

    def states(self):
        """Status of servers pl1..pl3 ("UP", "DOWN", "UP 1/2", ...)."""
        lines = self.cli("show stat").splitlines()
        cols = lines[0].lstrip("# ").split(",")
        got = {}
        for ln in lines[1:]:
            row = dict(zip(cols, ln.split(",")))
            if row.get("pxname") == "pilotlight" and row.get("svname", "").startswith("pl"):
                got[row["svname"]] = row["status"]
        return [got[f"pl{i}"] for i in range(1, len(self.servers) + 1)]

    def wait_state(self, index, state):
        deadline = time.monotonic() + WAIT
        while self.states()[index] != state:
            assert time.monotonic() < deadline, \
                f"server pl{index + 1} never {state}: {self.states()}\n{self.log()[-3000:]}"
            time.sleep(0.02)

    def routing_keys(self):
        """[(method, routing string)] from the log, in completion order."""
        return re.findall(r'\{([^}]*)\} "(GET|POST) /warm-start', self.log())

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.logf.closed:
            self.logf.close()


@contextlib.contextmanager
def proxied(start_server, *server_args, env=None):
    """(proxy, [3 servers started with <server_args>]); HAProxy stops on
    leaving, then the fixture of conftest stops the servers (ledger, exit
    code 0)."""
    servers = [start_server(*server_args) for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        proxy = Proxy(servers, d, env=env)
        try:
            yield proxy, servers
        finally:
            proxy.stop()


@pytest.fixture
def cluster(start_server):
    with proxied(start_server) as c:
        yield c


@pytest.fixture
def resend_cluster(start_server):
    """HAProxy resending polls an instance closed (PL_HAPROXY_RETRY_ON, off
    by default for its memory)."""
    with proxied(start_server, env={"PL_HAPROXY_RETRY_ON": "conn-failure empty-response"}) as c:
        yield c


@pytest.fixture
def drain_cluster(start_server):
    """A drain delay long enough for the proxy's health checks (inter 1 s,
    fastinter 250 ms, fall 2) to see /readyz turn 503."""
    with proxied(start_server, "--drain-delay-ms", "2500") as (proxy, servers):
        yield proxy, servers
    # Drain the rest together rather than one after the other; the conftest
    # fixture then checks their exit codes.
    alive = [s for s in servers if s.proc.poll() is None]
    for s in alive:
        assert_ledger(s.port)
    for s in alive:
        s.sigterm()
    for s in alive:
        s.wait_exit()


# --------------------------------------------------------------------------
# Keys, controllers, dispatches
# --------------------------------------------------------------------------

def js_text(v):
    """JavaScript String(number), as a controller writes its headers."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def b64url(obj):
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def deployment_token(deployment):
    """A JWT-shaped deployment id carrying <deployment> (unsigned)."""
    claims = {"ver": 1, "deployment": deployment, "deployment_version": "20261130.1",
              "environment_id": "env_1", "environment_type": "PRODUCTION",
              "org_id": "org_1", "project_id": "proj_1", "exp": 4102444800}
    return f"{b64url({'alg': 'HS256', 'typ': 'JWT'})}.{b64url(claims)}.c2lnbmF0dXJl"


def key_of(i, prefix="deployment_hx"):
    """Key <i>: (deployment, version, cpu, memory), all sizes covered."""
    return (f"{prefix}{i:02d}", f"2026113{i % 3}.{i % 7}", CPUS[i % 5], MEMORIES[(i // 5) % 6])


def total(servers, attr):
    return sum(getattr(scrape(s.port), attr) for s in servers if s.proc.poll() is None)


def wait_total(servers, attr, want, what):
    deadline = time.monotonic() + WAIT
    while True:
        got = total(servers, attr)
        if got == want:
            return
        assert time.monotonic() < deadline, f"{what}: {attr} is {got}, want {want}"
        time.sleep(0.02)


class Controller:
    """A poll through the proxy, and what a real controller would do with
    its outcome."""

    def __init__(self, port, key, n, token=False, cpu_text=None, mem_text=None, dep_header=None):
        self.port, self.key = port, key
        dep, ver, cpu, mem = key
        if dep_header is None:
            dep_header = deployment_token(dep) if token else dep
        self.headers = poll_headers(deployment=dep_header,
                                    version=ver,
                                    cpu=js_text(cpu) if cpu_text is None else cpu_text,
                                    memory=js_text(mem) if mem_text is None else mem_text,
                                    controller_id=f"controller_hx_{n}")
        self.repolls = 0
        self.poll()

    def poll(self):
        self.conn = Conn(self.port, timeout=WAIT)
        self.conn.request("GET", "/warm-start", self.headers)

    def idle(self):
        """True while nothing came back. A close without a response is a
        network error to a real controller: it polls again (counted here).
        Any response is a failure: a real one exits on a non-2xx."""
        if self.conn.silent_for(0):
            return True
        if self.conn.buf:
            r = self.conn.read_response()
            raise AssertionError(f"controller {self.key} got an answer before any dispatch: {r}")
        self.conn.close()
        self.repolls += 1
        self.poll()
        return False

    def close(self):
        self.conn.close()


def dispatch_via(port, key, run_id, cpu_text=None, mem_text=None):
    """Dispatches a message for <key> through the proxy; returns
    (didWarmStart, message). Numbers are written by json.dumps (floats: 1.0,
    0.25) unless given as text."""
    dep, ver, cpu, mem = key
    m = make_message(deployment=dep, version=ver, cpu=float(cpu), memory=float(mem),
                     run_id=run_id)
    body = json.dumps({"dequeuedMessage": m})
    if cpu_text is not None:
        body = body.replace(f'"cpu": {json.dumps(float(cpu))}', f'"cpu": {cpu_text}', 1)
    if mem_text is not None:
        body = body.replace(f'"memory": {json.dumps(float(mem))}', f'"memory": {mem_text}', 1)
    c = Conn(port, timeout=WAIT)
    try:
        c.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    got = r.json()
    assert set(got) == {"didWarmStart"}, r
    return got["didWarmStart"], m


def check_payload(ctrl, msg):
    got = read_payload(ctrl.conn, timeout=WAIT)
    assert got == msg, f"controller {ctrl.key} got run {got['run']['friendlyId']}, " \
                       f"expected {msg['run']['friendlyId']}"


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------

def test_config_is_valid():
    env = dict(os.environ, PL_HAPROXY_STATS_SOCKET="/tmp/pilotlight-haproxy-check.sock")
    r = subprocess.run([HAPROXY, "-c", "-f", str(HAPROXY_CFG)], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_dispatch_timeout_outlasts_the_longest_confirmation():
    """HAProxy gives up on a dispatch after its server timeout and answers
    the supervisor 504, which reads as no warm start: the run is started
    elsewhere. Under delivery = confirm, pilotlight may hold a dispatch's
    answer for up to confirm_timeout_ms + confirm_wait_max_ms (an attempt
    starts within the first, and one whose payload all left is decided
    within the second: docs/delivery.md), and may still deliver the run
    then. The shipped proxy must wait longer than that, or one run could
    start twice."""
    rc, out, err = run_binary("--check-config")
    assert rc == 0, err
    conf = dict(ln.split(" = ", 1) for ln in out.splitlines() if " = " in ln)
    assert conf["delivery"] == "confirm"
    longest_ms = int(conf["confirm_timeout_ms"]) + int(conf["confirm_wait_max_ms"])
    m = re.search(r"^\s*http-request set-timeout server (\d+)(ms|s)\b.*\{ method GET \}",
                  HAPROXY_CFG.read_text(), re.M)
    assert m, "no server timeout for dispatches in haproxy.cfg"
    proxy_ms = int(m.group(1)) * (1000 if m.group(2) == "s" else 1)
    assert proxy_ms > longest_ms, (proxy_ms, longest_ms)


def test_fifty_keys_every_dispatch_answered_as_one_instance_would(cluster):
    proxy, servers = cluster
    keys = [key_of(i) for i in range(50)]
    wanted = {k: i % 3 for i, k in enumerate(keys)}      # 0, 1 or 2 controllers
    ctrls = {k: [] for k in keys}
    n = 0
    # Two rounds, each fully parked before the next, so FIFO order is known.
    for rnd in range(2):
        for i, k in enumerate(keys):
            if wanted[k] > rnd:
                ctrls[k].append(Controller(proxy.port, k, n, token=(i % 4 == 0)))
                n += 1
        wait_total(servers, "parked_now", n, f"round {rnd} to park")
    assert n == sum(wanted.values())

    # Each key's controllers sit on one instance, and every instance got some.
    per = [scrape(s.port) for s in servers]
    assert sum(m.keys_now for m in per) == sum(1 for k in keys if wanted[k]), \
        "a key's controllers were split across instances"
    assert all(m.parked_now > 0 for m in per), \
        f"keys not spread: {[m.parked_now for m in per]}"

    # Two dispatches per key: exactly what a single instance answers.
    results, hits = {}, 0
    for k in keys:
        results[k] = []
        for d in range(2):
            ok, msg = dispatch_via(proxy.port, k, f"run_{k[0]}_{d}")
            results[k].append(ok)
            if ok:
                hits += 1
                check_payload(ctrls[k][d], msg)     # FIFO: oldest first
        expected = [d < wanted[k] for d in range(2)]
        assert results[k] == expected, f"key {k}: {results[k]} != {expected}"

    per = [scrape(s.port) for s in servers]
    assert sum(m.dispatched("hit") for m in per) == hits
    assert sum(m.dispatched("miss") for m in per) == 2 * len(keys) - hits
    assert sum(m.parked_now for m in per) == 0
    for m in per:
        assert_ledger(m)
    # Poll and dispatch of a key hashed the same string.
    polls = {key for key, method in proxy.routing_keys() if method == "GET"}
    posts = {key for key, method in proxy.routing_keys() if method == "POST"}
    assert polls and polls <= posts, polls - posts


@pytest.mark.parametrize("cpu_hdr,mem_hdr,cpu_json,mem_json", [
    ("1", "1", "1.0", "1"),
    ("0.5", "0.25", "0.5", "0.25"),
    ("0.5", "1", "5E-1", "1.00"),
    ("1.0", "0.50", "1", "0.5"),
    ("2", "4", "2.00", "4e0"),
    ("4", "8", "4", "0.8e1"),
])
def test_numbers_written_differently_route_together(cluster, cpu_hdr, mem_hdr,
                                                     cpu_json, mem_json):
    proxy, servers = cluster
    # Several deployments per case: a routing mismatch cannot hide behind a
    # lucky hash (and the log check below catches it outright).
    case = f"{cpu_hdr}_{mem_hdr}".replace(".", "p")    # no dots: "a.b.c" looks like a JWT
    deps = [f"deployment_num_{case}_{j}" for j in range(6)]
    ctrls = []
    for j, dep in enumerate(deps):
        ctrls.append(Controller(proxy.port, (dep, "20261130.1", 0, 0), j, token=(j % 2 == 1),
                                cpu_text=cpu_hdr, mem_text=mem_hdr))
    wait_total(servers, "parked_now", len(deps), "polls to park")
    for c, dep in zip(ctrls, deps):
        key = (dep, "20261130.1", float(cpu_json), float(mem_json))
        ok, msg = dispatch_via(proxy.port, key, f"run_{dep}", cpu_text=cpu_json, mem_text=mem_json)
        assert ok, f"header {cpu_hdr}/{mem_hdr} vs JSON {cpu_json}/{mem_json} ({dep}) missed"
        got = read_payload(c.conn, timeout=WAIT)
        assert got["run"]["friendlyId"] == f"run_{dep}"
    seen = {}
    for key, method in proxy.routing_keys():
        seen.setdefault(key.split(" ")[0], set()).add(key)
    for dep in deps:
        assert len(seen.get(dep, ())) == 1, f"{dep}: routing strings {seen.get(dep)}"


def test_large_dispatch_body_still_routes(cluster):
    """The proxy hashes a dispatch from its buffered body: 12 KB (3-6 times
    a usual DequeuedMessage) must still fit (tune.bufsize 16384 allows ~15 KB)."""
    proxy, servers = cluster
    keys = [key_of(i, prefix="deployment_big") for i in range(6)]
    ctrls = [Controller(proxy.port, k, i) for i, k in enumerate(keys)]
    wait_total(servers, "parked_now", len(keys), "polls to park")
    for c in ctrls:
        dep, ver, cpu, mem = c.key
        m = make_message(deployment=dep, version=ver, cpu=cpu, memory=mem, run_id=f"run_{dep}")
        m["completedWaitpoints"] = [{"id": "waitpoint_1", "output": "x" * 12000}]
        body = json.dumps({"dequeuedMessage": m})
        assert len(body) > 12000
        resp = request(proxy.port, "POST", "/warm-start",
                       {"Content-Type": "application/json"}, body, timeout=WAIT)
        assert resp.status == 200 and resp.json() == {"didWarmStart": True}, resp
        check_payload(c, m)


def test_dispatch_body_larger_than_the_buffer_is_forwarded(cluster):
    """A body past tune.bufsize cannot be hashed, but HAProxy streams it to
    some instance, which answers it: a true (payload intact) or a false,
    never an error."""
    proxy, servers = cluster
    key = key_of(3, prefix="deployment_huge")
    c = Controller(proxy.port, key, 0)
    wait_total(servers, "parked_now", 1, "the poll to park")
    dep, ver, cpu, mem = key
    m = make_message(deployment=dep, version=ver, cpu=cpu, memory=mem, run_id="run_huge")
    m["completedWaitpoints"] = [{"id": "waitpoint_1", "output": "x" * 900_000}]
    body = json.dumps({"dequeuedMessage": m})
    assert 900_000 < len(body) < 1_048_576          # under pilotlight's max_body_bytes
    resp = request(proxy.port, "POST", "/warm-start",
                   {"Content-Type": "application/json"}, body, timeout=WAIT)
    assert resp.status == 200 and set(resp.json()) == {"didWarmStart"}, resp
    if resp.json()["didWarmStart"]:
        check_payload(c, m)
    else:
        c.close()


def test_controller_abort_reaches_the_instance(cluster):
    """A controller that gives up closes its connection (a FIN). The proxy
    must pass that on at once, or a dispatch could be 'delivered' to nobody."""
    proxy, servers = cluster
    key = key_of(7, prefix="deployment_abort")
    c = Controller(proxy.port, key, 0)
    wait_total(servers, "parked_now", 1, "the poll to park")
    before = sum(scrape(s.port).settled("disconnect") for s in servers)
    c.close()
    wait_total(servers, "parked_now", 0, "the abort to reach pilotlight")
    after = sum(scrape(s.port).settled("disconnect") for s in servers)
    assert after == before + 1
    ok, _ = dispatch_via(proxy.port, key, "run_after_abort")
    assert ok is False


def _lose_one(proxy, servers, how):
    keys = [key_of(i, prefix="deployment_loss") for i in range(50)]
    ctrls = [Controller(proxy.port, k, i) for i, k in enumerate(keys)]
    wait_total(servers, "parked_now", 50, "50 polls to park")
    per = [scrape(s.port).parked_now for s in servers]
    victim = max(range(3), key=lambda i: per[i])
    survivors = [s for i, s in enumerate(servers) if i != victim]
    parked_before = sum(scrape(s.port).parked_total for s in survivors)

    if how == "kill":
        servers[victim].proc.kill()
        servers[victim].proc.wait()
        servers[victim].stopped = True      # no clean exit to check
    else:
        servers[victim].sigterm()
    proxy.wait_state(victim, "DOWN")

    # The victim's controllers are parked again on the survivors, without
    # ever receiving a response (a real controller exits on a 502).
    deadline = time.monotonic() + WAIT
    while True:
        for c in ctrls:
            c.idle()
        if total(survivors, "parked_now") == 50:
            break
        assert time.monotonic() < deadline, \
            f"only {total(survivors, 'parked_now')} of 50 polls parked on the survivors"
        time.sleep(0.02)
    assert sum(scrape(s.port).parked_total for s in survivors) - parked_before == per[victim]
    if how == "term":
        assert servers[victim].wait_exit() == 0

    # Every key, the lost instance's included, is matched again.
    for c in ctrls:
        ok, msg = dispatch_via(proxy.port, c.key, f"run_{c.key[0]}_after_{how}")
        assert ok, f"key {c.key} not matched after losing pl{victim + 1} " \
                   f"(it held {per[victim]} polls)"
        check_payload(c, msg)
    return per[victim], sum(c.repolls for c in ctrls)


@pytest.mark.parametrize("setup,how,seen", [("cluster", "kill", True),
                                            ("resend_cluster", "kill", False),
                                            ("drain_cluster", "term", True)],
                         ids=["killed", "killed-proxy-resends", "drained"])
def test_a_lost_instance_s_controllers_park_again_and_match(request, setup, how, seen):
    """<seen>: each of the lost instance's controllers saw a close without a
    response (never the 502) and polled again by itself, as a real one
    does; otherwise the proxy re-sent the polls and no controller saw it."""
    proxy, servers = request.getfixturevalue(setup)
    moved, repolls = _lose_one(proxy, servers, how)
    assert moved > 0
    assert repolls == (moved if seen else 0)


def test_dotted_bare_ids_route_as_pilotlight_keys_them(cluster):
    """Ids are opaque: a bare id with two dots is hashed whole, as pilotlight
    keys it; only a value with a JWT header is read for its claim."""
    proxy, servers = cluster
    hs256 = b64url({"alg": "HS256"})
    cases = []                                   # (header value, key deployment)
    for j in range(4):
        cases.append((f"deployment_app{j}.v2.eu", f"deployment_app{j}.v2.eu"))
        cases.append((f"a{j}.b.c", f"a{j}.b.c"))
        # a JSON object first, but no "alg": a bare id
        no_alg = f"{b64url({'typ': 'JWT'})}.{b64url({'deployment': f'deployment_na{j}'})}.c2ln"
        cases.append((no_alg, no_alg))
        # a JWT header, but no JSON object after it: a bare id
        no_obj = f"{hs256}.{b64url([j])}.c2ln"
        cases.append((no_obj, no_obj))
        # a token whose claim has dots: keyed by the claim
        cases.append((deployment_token(f"deployment_tok{j}.v2.eu"), f"deployment_tok{j}.v2.eu"))
    ctrls = []
    for n, (value, dep) in enumerate(cases):
        key = (dep, "20261201.1", CPUS[n % 5], MEMORIES[n % 6])
        ctrls.append(Controller(proxy.port, key, n, dep_header=value))
    wait_total(servers, "parked_now", len(cases), "polls to park")
    assert all(scrape(s.port).parked_now > 0 for s in servers), "keys not spread"
    for c in ctrls:
        ok, msg = dispatch_via(proxy.port, c.key, f"run_dot_{c.key[0][:24]}")
        assert ok, f"{c.headers['x-trigger-deployment-id']} (key {c.key[0]}) missed"
        check_payload(c, msg)
    # HAProxy logs a request once its stream ends, a moment after the answer.
    deadline = time.monotonic() + WAIT
    while True:
        routed = {"GET": set(), "POST": set()}
        for key, method in proxy.routing_keys():
            routed[method].add(key)
        deps = [{k.split(" ")[0] for k in routed[m]} for m in ("GET", "POST")]
        if deps[0] == deps[1] == {dep for _, dep in cases} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert routed["GET"] == routed["POST"], routed
    assert {k.split(" ")[0] for k in routed["GET"]} == {dep for _, dep in cases}


def test_client_cannot_choose_the_route(cluster):
    """The routing string travels in x-pilotlight-route: a client's own
    header of that name is dropped, whether or not the proxy sets one."""
    proxy, servers = cluster
    key = ("deployment_forged", "20261201.2", 1, 2)
    c = Controller(proxy.port, key, 0)
    c.conn.close()
    c.headers["x-pilotlight-route"] = "evil_route_1"
    c.poll()
    wait_total(servers, "parked_now", 1, "the poll to park")
    ok, msg = dispatch_via(proxy.port, key, "run_forged")
    assert ok
    check_payload(c, msg)
    # Without a version the proxy sets no route: the client's is gone anyway.
    bad = Conn(proxy.port, timeout=WAIT)
    headers = dict(c.headers, **{"x-pilotlight-route": "evil_route_2"})
    del headers["x-trigger-deployment-version"]
    bad.request("GET", "/warm-start", headers)
    assert bad.read_response().status == 400
    bad.close()
    # HAProxy logs a request once its stream ends, a moment after the answer.
    deadline = time.monotonic() + WAIT
    while not (re.search(r' \{\} "GET /warm-start', proxy.log()) and
               ("deployment_forged 20261201.2 1 2", "GET") in proxy.routing_keys()):
        assert time.monotonic() < deadline, proxy.log()[-2000:]
        time.sleep(0.05)
    assert "evil_route" not in proxy.log()


# --------------------------------------------------------------------------
# A drain under traffic
# --------------------------------------------------------------------------

class Fleet:
    """Controllers parked through the proxy, all on one selector thread. Each
    polls again at once after a run (its next idle period) and after a close
    without a response (a network error: a real controller backs off first,
    which would only hide how soon the proxy lets it find its key's new
    instance). Any other answer is recorded: a real controller exits on it."""

    def __init__(self, port, keys, per_key):
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.runs = {}          # run id -> [key of each controller given it]
        self.answers = []       # responses other than a run
        self.closes = 0         # closes without a response
        self.done = threading.Event()
        self.requests = []
        for n, (dep, ver, cpu, mem) in enumerate(k for k in keys for _ in range(per_key)):
            h = poll_headers(deployment=dep, version=ver, cpu=js_text(cpu), memory=js_text(mem),
                             controller_id=f"controller_fleet_{n}")
            self.requests.append(((dep, ver, cpu, mem), build_request("GET", "/warm-start", h)))
            self._poll(n)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _poll(self, n):
        s = socket.create_connection((HOST, self.port), timeout=WAIT)
        s.sendall(self.requests[n][1])
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ, [n, b""])

    def _answered(self, n, raw):
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        with self.lock:
            if status == 200:
                rid = json.loads(body)["run"]["friendlyId"]
                self.runs.setdefault(rid, []).append(self.requests[n][0])
            else:
                self.answers.append(head.split(b"\r\n", 1)[0].decode())

    @staticmethod
    def _complete(buf):
        """The length of the whole response in <buf>, or 0 while partial."""
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return 0
        m = re.search(rb"\r\ncontent-length:\s*(\d+)", buf[:end], re.I)
        total = end + 4 + (int(m.group(1)) if m else 0)
        return total if len(buf) >= total else 0

    def _run(self):
        while not self.done.is_set():
            for sk, _ in self.sel.select(0.05):
                s, st = sk.fileobj, sk.data
                try:
                    data = s.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionResetError:
                    data = b""
                st[1] += data
                if data and not self._complete(st[1]):
                    continue
                if data:
                    self._answered(st[0], st[1])
                elif st[1]:
                    with self.lock:
                        self.answers.append(f"cut short: {st[1][:80]!r}")
                else:
                    with self.lock:
                        self.closes += 1
                self.sel.unregister(s)
                s.close()
                self._poll(st[0])

    def stop(self):
        self.done.set()
        self.thread.join(WAIT)
        for sk in list(self.sel.get_map().values()):
            sk.fileobj.close()
        self.sel.close()


class Dispatches:
    """The supervisor: dispatches at <rate> a second, keys in turn, on one
    kept-alive connection through the proxy (a new one after an error)."""

    def __init__(self, port, keys, rate):
        self.port, self.keys, self.rate = port, keys, rate
        self.sent = []          # (monotonic time, run id, key, answer)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        conn, i, due = None, 0, time.monotonic()
        while not self.done.is_set():
            key = self.keys[i % len(self.keys)]
            rid = f"run_flow_{i}"
            i += 1
            dep, ver, cpu, mem = key
            body = json.dumps({"dequeuedMessage": make_message(
                deployment=dep, version=ver, cpu=float(cpu), memory=float(mem), run_id=rid)})
            t = time.monotonic()
            try:
                if conn is None:
                    conn = Conn(self.port, timeout=WAIT)
                conn.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
                r = conn.read_response()
                answer = r.json()["didWarmStart"] if r.status == 200 else f"status {r.status}"
            except (OSError, ConnectionClosed) as e:
                answer = f"error: {e!r}"
                if conn is not None:
                    conn.close()
                conn = None
            self.sent.append((t, rid, key, answer))
            due = max(due + 1 / self.rate, time.monotonic() - 1)
            self.done.wait(max(0.0, due - time.monotonic()))
        if conn is not None:
            conn.close()

    def stop(self):
        self.done.set()
        self.thread.join(WAIT * 2)


def drain_under_traffic(proxy, servers, keys, per_key, rate, victim=None):
    """Parks <per_key> controllers on each key, dispatches at <rate> a
    second, and drains one instance (SIGTERM) in the middle of it. Returns
    what happened, with times relative to the SIGTERM."""
    fleet = Fleet(proxy.port, keys, per_key)
    flow = None
    try:
        wait_total(servers, "parked_now", len(keys) * per_key, "the fleet to park")
        per = [scrape(s.port).parked_now for s in servers]
        if victim is None:
            victim = max(range(len(servers)), key=lambda i: per[i])
        survivors = [s for i, s in enumerate(servers) if i != victim]
        flow = Dispatches(proxy.port, keys, rate)
        time.sleep(1.5)
        t_term = time.monotonic()
        servers[victim].sigterm()
        proxy.wait_state(victim, "DOWN")
        t_down = time.monotonic()
        assert servers[victim].wait_exit() == 0
        t_exit = time.monotonic()
        time.sleep(1.5)
        flow.stop()
        hits = {rid for _, rid, _, a in flow.sent if a is True}
        deadline = time.monotonic() + WAIT
        while True:
            with fleet.lock:
                got = set(fleet.runs)
            if hits <= got or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        wait_total(survivors, "parked_now", len(keys) * per_key, "the fleet to park again")
    finally:
        if flow is not None:
            flow.stop()
        fleet.stop()
    return dict(
        victim=victim, parked_on_victim=per[victim], sent=len(flow.sent), hits=len(hits),
        down_after=t_down - t_term, exit_after=t_exit - t_term,
        misses=[(round(t - t_term, 3), rid) for t, rid, _, a in flow.sent if a is False],
        errors=[(round(t - t_term, 3), rid, a) for t, rid, _, a in flow.sent
                if a is not True and a is not False],
        wrong=[(rid, keys_got) for rid, keys_got in fleet.runs.items()
               if rid not in hits or keys_got != [next(k for _, r, k, _ in flow.sent
                                                       if r == rid)]],
        undelivered=sorted(hits - set(fleet.runs)),
        answers=fleet.answers, closes=fleet.closes)


def test_drain_behind_haproxy_loses_no_dispatch(start_server):
    """One of three instances drains (SIGTERM, the 2 s drain delay the
    deploy files use) while 300 controllers wait on 100 keys and runs are
    dispatched 60 a second. The shipped config takes the instance out on its
    /readyz 503 and closes its sessions at that moment (on-marked-down
    shutdown-sessions), so its controllers poll again where their keys now
    go. Without it they stayed parked on the draining instance until its
    listener closed, while their keys' dispatches went elsewhere: 31-32
    misses a drain.

    What remains is the hand-over itself: a dispatch for one of the drained
    instance's keys that reaches HAProxy after the mark-down and before
    any of that key's controllers has parked again (a few milliseconds)
    misses. It is not a loss of the proxy's making and cannot be closed by
    it; the test allows it only in that instant (measured: 3 runs of 35 had
    one such miss). Every other dispatch hits, none fails, and
    every run answered true reached exactly one controller of its key."""
    servers = [start_server("--drain-delay-ms", "2000") for _ in range(3)]
    keys = [key_of(i, prefix="deployment_flow") for i in range(100)]
    with tempfile.TemporaryDirectory() as d:
        proxy = Proxy(servers, d)
        try:
            got = drain_under_traffic(proxy, servers, keys, per_key=3, rate=60)
        finally:
            proxy.stop()
    print(json.dumps(got, default=str))
    # The victim's controllers saw their polls closed, and parked again on
    # the survivors (drain_under_traffic waited for all of them).
    assert got["parked_on_victim"] > 0 and got["closes"] > 0, got
    assert got["sent"] > 200, got
    assert got["answers"] == [], "a controller was answered (a real one exits)"
    assert got["undelivered"] == [] and got["wrong"] == [], got
    # The mark-down is seen through the stats socket, polled every 20 ms:
    # "the instant" is 100 ms either side of when it was seen.
    lost = got["misses"] + got["errors"]
    outside = [m for m in lost if abs(m[0] - got["down_after"]) > 0.1]
    assert outside == [] and len(lost) <= 2, \
        f"dispatches lost during the drain (mark-down seen at {got['down_after']:.3f} s): {lost}"


# --------------------------------------------------------------------------
# Refused dispatch bodies (tests/vectors/dispatch.tsv) through the proxy
# --------------------------------------------------------------------------

# Bodies a lenient JSON reader would read one way or another: the proxy,
# which reads the body to route it, must not make one deliverable.
PROXY_REFUSED_BODIES = ["leading-zero", "trailing-dot", "ctl-as-ws", "raw-lf-in-string",
                        "raw-bel-in-string", "trailing-nul", "bom", "utf8-overlong-slash",
                        "dup-deployment", "dup-friendlyId", "nul-in-friendlyId",
                        "nul-in-dm-name"]


def test_refused_bodies_stay_refused_through_haproxy(start_server):
    servers = [start_server() for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        proxy = Proxy(servers, d)
        try:
            polls = [park(proxy.port, wait=False, deployment=dep, version=ver, cpu=cpu,
                          memory=mem) for dep, ver, cpu, mem in DECOY_KEYS]
            wait_total(servers, "parked_now", len(polls), "decoys parked")
            by_label = {v["label"]: v for v in dispatch_vectors()}
            for label in PROXY_REFUSED_BODIES:
                v = by_label[label]
                assert not v["ok"]
                err = error_of(dispatch_raw(proxy.port, v["body"]))
                assert v["why"] in err, (label, err)
            assert total(servers, "parked_now") == len(polls)
            assert sum(scrape(s.port).settled("matched") for s in servers) == 0
            assert sum(scrape(s.port).dispatched("invalid") for s in servers) \
                == len(PROXY_REFUSED_BODIES)
            for c in polls:
                c.close()
        finally:
            proxy.stop()
