"""Two things a new user hits first: opaque deployment ids, and host names to listen on.

Deployment ids are opaque strings: an id with dots (`deployment_app.v2.eu`)
is a bare id in every token_mode; only a value that decodes as a JWT (a
JSON header with "alg", a JSON payload) is read as a token.

`listen` and `dispatch_listen` take a host name as well as an address: it is
resolved when the server starts and every address it names is listened on
(addresses this host cannot bind are skipped with a warning); --check-config
does not resolve.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

import impair
from conftest import (BIN, check_sanitizers, clean_env, get, json_lines, make_message,
                      poll_headers, read_payload, request, run_binary)

SECRET = "tr_wdt_opaque_ids_41d7"
VER = "20261201.1"


def b64url(obj):
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# Each of these has exactly two dots and only base64url characters: the
# shape of a JWT, but not one.
DOTTED_IDS = [
    "deployment_app.v2.eu",
    "a.b.c",
    "deployment.abc.def",
    # a JSON object before the first dot, but no "alg": not a JWT header
    f"{b64url({'typ': 'JWT'})}.{b64url({'deployment': 'deployment_other'})}.c2ln",
    # a JWT header, but the payload is no JSON object
    f"{b64url({'alg': 'HS256'})}.{b64url([1])}.c2ln",
]


def dispatch_for(port, deployment, run_id):
    body = json.dumps({"dequeuedMessage": make_message(deployment=deployment, version=VER,
                                                       run_id=run_id)})
    r = request(port, "POST", "/warm-start", {"Content-Type": "application/json"}, body)
    assert r.status == 200, r
    return r.json()["didWarmStart"]


def token_checks(m):
    return {r: m.get("pilotlight_token_checks_total", result=r)
            for r in ("valid", "invalid", "legacy", "absent")}


@pytest.mark.parametrize("mode", ["disabled", "log"])
@pytest.mark.parametrize("dep", DOTTED_IDS)
def test_dotted_bare_id_parks_under_itself(start_server, mode, dep):
    env = {"PILOTLIGHT_TOKEN_SECRET": SECRET} if mode != "disabled" else None
    s = start_server("--token-mode", mode, env=env)
    w = s.park(deployment=dep, version=VER)
    m = s.wait_parked(1)
    r = get(s.port, "/debug/waiters")
    assert [k["deployment"] for k in r.json()["keys"]] == [dep], r
    if mode == "log":
        # With a JWT header it claims to be a token, and fails as one; the
        # verifier reads no payload before the signature, so it cannot call
        # it a bare id, but the key is the same in every mode.
        kind = "invalid" if dep.startswith(b64url({"alg": "HS256"})) else "legacy"
        want = {"valid": 0, "invalid": 0, "legacy": 0, "absent": 0, kind: 1}
        assert token_checks(m) == want
    assert dispatch_for(s.port, dep, "run_dotted") is True
    assert read_payload(w)["run"]["friendlyId"] == "run_dotted"


@pytest.mark.parametrize("dep", DOTTED_IDS[:2])
def test_dotted_bare_id_under_enforce_is_no_token(start_server, dep):
    s = start_server("--token-mode", "enforce", env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    r = s.request("GET", "/warm-start", poll_headers(deployment=dep, version=VER))
    assert r.status == 401, r
    assert r.json()["error"] == "a signed deployment token is required", r
    m = s.metrics()
    assert m.parked_total == 0
    assert token_checks(m) == {"valid": 0, "invalid": 0, "legacy": 1, "absent": 0}


def test_jwt_still_read_as_a_token(start_server):
    """The other side of the line: an (unsigned) JWT is keyed by its claim,
    and one without the claim is still refused."""
    s = start_server()
    tok = f"{b64url({'alg': 'HS256', 'typ': 'JWT'})}.{b64url({'deployment': 'deployment_j'})}.c2ln"
    w = s.park(deployment=tok, version=VER)
    s.wait_parked(1)
    assert dispatch_for(s.port, "deployment_j", "run_jwt") is True
    assert read_payload(w)["run"]["friendlyId"] == "run_jwt"
    no_claim = f"{b64url({'alg': 'HS256'})}.{b64url({'ver': 1})}.c2ln"
    r = s.request("GET", "/warm-start", poll_headers(deployment=no_claim, version=VER))
    assert r.status == 400 and "deployment claim" in r.json()["error"], r


# --------------------------------------------------------------------------
# Host names in listen / dispatch_listen
# --------------------------------------------------------------------------

def listening(s, roles=()):
    """The server's "listening" records, once one for each of <roles> is in
    (the harness waits for the first only)."""
    deadline = time.monotonic() + 10
    while True:
        recs = [rec for rec in s.log_lines() if rec.get("msg") == "listening"]
        if all(any(r["serves"] == role for r in recs) for role in roles) or \
                time.monotonic() > deadline:
            return recs
        time.sleep(0.02)


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def test_listen_localhost(start_server):
    want = sorted({ai[4][0] for ai in socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM)})
    s = start_server("--listen", "localhost:0", "--dispatch-listen", "localhost:0")
    recs = listening(s, roles=("controllers", "dispatch"))
    ctl = [r for r in recs if r["serves"] == "controllers"]
    dsp = [r for r in recs if r["serves"] == "dispatch"]
    # addresses this host cannot bind (::1 without IPv6) are skipped, said so
    skipped = {r["address"].rsplit(":", 1)[0].strip("[]") for r in s.log_lines()
               if r.get("msg") == "address not available here, skipped"}
    for group in (ctl, dsp):
        assert all(r["host"] == "localhost" for r in group), group
        got = sorted(r["address"].rsplit(":", 1)[0].strip("[]") for r in group)
        assert got and sorted(set(got) | skipped) == want, (got, skipped, want)
        assert len({port_of(r["address"]) for r in group}) == 1, group
    assert port_of(ctl[0]["address"]) != port_of(dsp[0]["address"])
    # each name kept its role: the controllers' side refuses /metrics
    assert get(port_of(ctl[0]["address"]), "/healthz").status == 200
    assert request(port_of(ctl[0]["address"]), "GET", "/metrics").status == 403
    assert get(port_of(dsp[0]["address"]), "/metrics").status == 200
    s.port = port_of(dsp[0]["address"])  # where the teardown reads the ledger


def test_listen_name_from_the_environment():
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, 0, type=socket.SOCK_STREAM)
    except OSError:
        pytest.skip(f"this host's name {name!r} does not resolve")
    # The environment is below flags in precedence: no harness --listen here.
    p = Proc([BIN], env={"PILOTLIGHT_LISTEN": f"{name}:0"})
    try:
        recs = p.wait_listening()
        assert recs and all(r["host"] == name for r in recs), recs
        addr = recs[0]["address"].rsplit(":", 1)[0].strip("[]")
        if addr.startswith("127.") or addr == "::1":  # the tests talk to loopback only
            c = socket.create_connection((addr, port_of(recs[0]["address"])), timeout=5)
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert c.recv(64).startswith(b"HTTP/1.1 200"), "no answer on the resolved address"
            c.close()
    finally:
        p.stop()


def test_dual_stack_any_address(start_server):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python")
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.bind(("::1", 0))
        probe.close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    s = start_server("--listen", "[::]:0")
    port = port_of(listening(s)[0]["address"])
    # libuv clears IPV6_V6ONLY: [::] takes IPv4 connections too
    assert get(port, "/healthz").status == 200
    c = socket.create_connection(("::1", port), timeout=5)
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert c.recv(64).startswith(b"HTTP/1.1 200")
    c.close()


def test_unresolvable_name_fails_start_clearly():
    # keep a missing or slow resolver from stretching the test
    rc, out, err = run_binary("--listen", "no-such-host.invalid:0",
                              env={"RES_OPTIONS": "timeout:1 attempts:1"}, timeout=15)
    assert rc == 1, err
    recs = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    assert any(r.get("msg") == "cannot resolve listen address"
               and r.get("host") == "no-such-host.invalid" for r in recs), err


def test_check_config_does_not_resolve():
    rc, out, err = run_binary("--listen", "no-such-host.invalid:8080",
                              "--dispatch-listen", "localhost:8081", "--check-config")
    assert rc == 0, err
    assert "listen = no-such-host.invalid:8080\n" in out
    assert "dispatch_listen = localhost:8081\n" in out


@pytest.mark.parametrize("value", ["localhost", "-x:80", "[localhost]:80", "10.1:80",
                                   "ho st:80"])
def test_malformed_host_refused(value):
    rc, out, err = run_binary("--listen", value)
    assert rc == 2 and "listen" in err and "HOST:PORT" in err, (rc, err)


# --------------------------------------------------------------------------
# A name with several addresses: its own /etc/hosts in a mount namespace
# --------------------------------------------------------------------------

class Proc:
    """pilotlight run under <prefix> (e.g. unshare), stopped like the
    harness's servers: SIGTERM, exit 0, no sanitizer report."""

    def __init__(self, argv, env=None):
        self.errf = impair.log_file()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.errf,
                                     env=clean_env(env))

    def stderr(self):
        self.errf.seek(0)
        return self.errf.read().decode("utf-8", "replace")

    def records(self):
        return json_lines(self.stderr())

    def wait_listening(self, n=1):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            recs = [r for r in self.records() if r.get("msg") == "listening"]
            if len(recs) >= n:
                time.sleep(0.1)  # the others follow at once
                return [r for r in self.records() if r.get("msg") == "listening"]
            if self.proc.poll() is not None:
                break
            time.sleep(0.01)
        raise AssertionError(f"not listening (exit {self.proc.poll()}):\n{self.stderr()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(12)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        check_sanitizers(self.stderr())
        assert rc == 0, self.stderr()


def _in_own_hosts(hosts_text, args):
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) to give pilotlight its own /etc/hosts")
    d = tempfile.mkdtemp()
    path = os.path.join(d, "hosts")
    with open(path, "w") as f:
        f.write(hosts_text)
    probe = subprocess.run([unshare, "-m", "sh", "-c", f"mount --bind {path} /etc/hosts"],
                           capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"cannot bind-mount a hosts file here: {probe.stderr.decode()[-200:]}")
    script = f'mount --bind {path} /etc/hosts && exec "$0" "$@"'
    return Proc([unshare, "-m", "sh", "-c", script, BIN] + list(args))


def test_every_address_of_a_name():
    # ::1 and two IPv4 loopbacks, one named twice; 192.0.2.1 (TEST-NET-1) is
    # no address of this host and is skipped with a warning.
    hosts = ("127.0.0.1 pl-multi\n::1 pl-multi\n127.0.0.1 pl-multi\n"
             "127.0.0.2 pl-multi\n192.0.2.1 pl-multi\n")
    p = _in_own_hosts(hosts, ["--listen", "pl-multi:0"])
    try:
        recs = p.wait_listening()
        addrs = sorted(r["address"].rsplit(":", 1)[0] for r in recs)
        ipv6 = "[::1]" in addrs
        assert addrs == sorted(["127.0.0.1", "127.0.0.2"] + (["[::1]"] if ipv6 else [])), recs
        port = port_of(recs[0]["address"])
        assert {port_of(r["address"]) for r in recs} == {port}
        skipped = [r for r in p.records() if r.get("msg") == "address not available here, skipped"]
        assert [r["address"] for r in skipped] == [f"192.0.2.1:{port}"] + \
            ([] if ipv6 else [f"[::1]:{port}"]), skipped
        for a in ("127.0.0.1", "127.0.0.2") + (("::1",) if ipv6 else ()):
            c = socket.create_connection((a, port), timeout=5)
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert c.recv(64).startswith(b"HTTP/1.1 200"), a
            c.close()
    finally:
        p.stop()


def test_a_name_with_no_usable_address_fails_start():
    p = _in_own_hosts("192.0.2.1 pl-nowhere\n", ["--listen", "pl-nowhere:0"])
    rc = p.proc.wait(15)
    assert rc == 1, p.stderr()
    assert any(r.get("msg") == "cannot listen" and r.get("host") == "pl-nowhere"
               for r in p.records()), p.stderr()
