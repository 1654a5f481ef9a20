"""The key ring: several real instances on loopback addresses (127.0.0.2,
.3, .4, one port each) that list each other with --ring-peers, or find each
other with --ring-dns.

Nothing here computes a key's owner: the tests check that the instances
agree (each names the same owner, the owner parks the key, the others
answer 307 to it), that redirects followed as a client follows them land
where they should, and that membership changes move exactly the polls
they must. A client here follows a 307 the way a controller's or a
supervisor's fetch does: the same request on a new connection to the
Location, without the Authorization header when the host changes.

Every instance started is checked at teardown: the ledger adds up (from
/metrics while it runs, from its "ledger" log line once it has exited),
no error was logged, and it exits 0 with no sanitizer report (except one
the test killed with SIGKILL). Timings are read from /metrics with bounds
generous enough for valgrind; the measured ones are printed.
"""
import hashlib
import hmac
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

import pytest

from conftest import (BIN, IO_TIMEOUT, Conn, Server, assert_ledger, check_sanitizers,
                      json_lines, key_of, make_message, poll_headers, run_binary)
from impair import private_hosts, show
from test_upgrade import logged, stalling_program, stop_adopted, wait_logged

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
CHECK_MS = 100
CHECK_TIMEOUT_MS = 300
RING_FLAGS = ("--ring-check-ms", str(CHECK_MS), "--ring-check-timeout-ms", str(CHECK_TIMEOUT_MS))
# For this long after it joins, an instance sends a dispatch that missed to
# where the key's polls were before it joined (the others may not have seen
# it yet); a dispatch probing for a key's owner waits it out.
JOIN_WINDOW_S = (2 * CHECK_MS + CHECK_TIMEOUT_MS) / 1000
SETTLE_S = 20.0     # views of the ring agree well within this, valgrind included
QUIET_S = 1.0       # no redirect for this long: every sweep that was due has run
MALFORMED = "malformed pl_hop, pl_exp, pl_nonce or pl_sig"
TOKEN = "tok_ring_8f0c2a61d7"
SIG_TTL_S = 10
SKEW_S = 30


# --------------------------------------------------------------------------
# Addresses, metrics and redirects
# --------------------------------------------------------------------------

def free_port_on(hosts, avoid=()):
    """A port nothing listens on at any of <hosts> (each binds it in turn)."""
    for _ in range(100):
        socks = []
        try:
            family = socket.AF_INET6 if ":" in hosts[0] else socket.AF_INET
            first = socket.socket(family)
            socks.append(first)
            first.bind((hosts[0], 0))
            port = first.getsockname()[1]
            if port in avoid:
                continue
            for h in hosts[1:]:
                s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET)
                socks.append(s)
                s.bind((h, port))
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError(f"no port free on all of {hosts}")


def name_of(host, port):
    """A ring member's name: "host:port", an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def members(s):
    return s.metrics().get("pilotlight_ring_members")


def counters(s):
    """What the ring and the engine counted: compared before and after
    requests that must change nothing."""
    m = s.metrics()
    out = {"parked_now": m.parked_now, "parked_total": m.parked_total,
           "settled": m.sum("pilotlight_settled_total"),
           "dispatch": m.sum("pilotlight_dispatch_total")}
    for route in ("poll", "dispatch"):
        out[f"redirects_{route}"] = m.get("pilotlight_ring_redirects_total", route=route)
        out[f"hop_served_{route}"] = m.get("pilotlight_ring_hop_served_total", route=route)
    return out


def wait_members(servers, n, timeout=SETTLE_S):
    """Until every one of <servers> counts <n> members; returns the time."""
    t0 = time.monotonic()
    for s in servers:
        s.wait_metrics(lambda m: m.get("pilotlight_ring_members") == n, timeout,
                       f"{s.address} to count {n} ring members")
    return time.monotonic() - t0


class Location:
    """A 307's Location, checked to be http://HOST:PORT/warm-start?QUERY."""

    def __init__(self, r):
        assert r.status == 307 and r.body == b"", r
        self.url = r.headers["location"]
        u = urllib.parse.urlsplit(self.url)
        assert u.scheme == "http" and u.path == "/warm-start" and u.port, self.url
        self.host, self.port = u.hostname, u.port
        self.name = name_of(self.host, self.port)
        self.target = f"{u.path}?{u.query}"
        self.query = dict(urllib.parse.parse_qsl(u.query, strict_parsing=True))


def message_body(key, run_id):
    """A dispatch body whose dequeuedMessage is written with odd spacing, and
    those exact bytes (what the poll must receive)."""
    dep, ver, cpu, mem = key
    payload = json.dumps(make_message(dep, ver, cpu, mem, run_id), indent=1).encode()
    return b'{ "dequeuedMessage" :\n' + payload + b' }', payload


def post(host, port, target, body, headers=None):
    """One POST on a fresh connection; the response."""
    c = Conn(port, host=host)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", target, h, body)
        return c.read_response()
    finally:
        c.close()


def answer(r):
    """didWarmStart of a well-formed dispatch answer."""
    assert r.status == 200, r
    return r.json()["didWarmStart"]


def signature(token, exp, hops, member, nonce, path, body):
    """The redirect's signature as a peer computes it: HMAC-SHA256 under the
    dispatch token of "pl2\\n<exp>\\n<hops>\\n<member>\\n<nonce>\\n<path>\\n"
    and the body's SHA-256. Instances of every version in a ring must agree
    on it, so it is pinned here."""
    msg = f"pl2\n{exp}\n{hops}\n{member}\n{nonce}\n{path}\n".encode() + \
        hashlib.sha256(body).digest()
    return hmac.new(token.encode(), msg, hashlib.sha256).hexdigest()


def readable(conns, wait):
    """The connections among <conns> with something to read (bytes or a
    close) within <wait> seconds."""
    ready = [c for c in conns if c.buf or c.eof]
    if ready:
        return ready
    r, _, _ = select.select([c.sock for c in conns], [], [], wait) if conns else ([], [], [])
    return [c for c in conns if c.sock in r]


# --------------------------------------------------------------------------
# The instances
# --------------------------------------------------------------------------

class Ring:
    """Instances on <hosts> (HOSTS[:n] by default), instance i on
    hosts[i]:port, each listing all of them. <flags>: for every instance;
    <per>: (i, host) -> flags of instance i alone; <dispatch_port>: the
    port of their dispatch listeners, when they have one."""

    def __init__(self, n, flags=(), per=None, hosts=None, dispatch_port=None):
        self.hosts = hosts or HOSTS[:n]
        self.port = free_port_on(self.hosts, avoid=(dispatch_port,))
        self.names = [name_of(h, self.port) for h in self.hosts]
        self.flags, self.per, self.dispatch_port = list(flags), per, dispatch_port
        self.servers = [None] * len(self.hosts)
        self.extra = []        # other instances (not ring members) to check at teardown
        self.killed = set()    # SIGKILLed: no exit status to check
        self.allowed = {}      # server -> error messages it may log
        self.conns = []        # client connections, closed before the ledger is read

    def args(self, i):
        return ["--listen", self.names[i], "--ring-peers", ",".join(self.names),
                "--ring-self", self.names[i], *RING_FLAGS, *self.flags,
                *(self.per(i, self.hosts[i]) if self.per else ())]

    def start(self, i, *extra, env=None, args=None, preexec_fn=None):
        """Starts instance i (<args> instead of its usual ones)."""
        if not os.access(BIN, os.X_OK):
            pytest.fail(f"pilotlight binary not found at {BIN} (set PILOTLIGHT_BIN)")
        s = Server((self.args(i) if args is None else list(args)) + list(extra), env,
                   listen=False, preexec_fn=preexec_fn)
        # s.ctl: where polls go; s.host, s.port: dispatches and /metrics
        s.ctl = (s.host, s.port)
        if self.dispatch_port:
            s.port = self.dispatch_port
        self.servers[i] = s
        return s

    def up(self):
        return [s for i, s in enumerate(self.servers) if s is not None and i not in self.killed
                and s.proc.poll() is None]

    def kill(self, i):
        self.killed.add(i)
        self.servers[i].proc.kill()
        self.servers[i].proc.wait()

    def conn(self, host, port):
        c = Conn(port, host=host)
        self.conns.append(c)
        return c

    def poll(self, s, key, cid, target="/warm-start"):
        """A raw poll for <key> sent to <s>; its Conn."""
        c = self.conn(*s.ctl)
        c.request("GET", target, poll_headers(*key, controller_id=cid))
        return c

    def owner(self, s, key, headers=None):
        """The name of <key>'s owner as <s> sees it, from a dispatch for a key
        nobody polls: 307 names another, a plain answer (false) is <s>."""
        body, _ = message_body(key, "run_probe")
        r = post(s.host, s.port, "/warm-start", body, headers)
        if r.status == 307:
            return Location(r).name
        assert answer(r) is False, r
        return name_of(s.host, s.port)

    def keys_owned(self, prefix, want, headers=None, count=1):
        """{member name: [key]} for fresh keys key_of(i, prefix) until each
        member in <want> owns <count>, as the first instance up sees it."""
        out = {}
        for i in range(400):
            key = key_of(i, prefix)
            out.setdefault(self.owner(self.up()[0], key, headers), []).append(key)
            if all(len(out.get(w, ())) >= count for w in want):
                return out
        raise AssertionError(f"not {count} keys owned by each of {want}: {out}")

    def teardown(self):
        errors = []
        for c in self.conns:
            c.close()
        everyone = [(i, s) for i, s in enumerate(self.servers) if s is not None]
        everyone += [(None, s) for s in self.extra]
        for i, s in everyone:
            if i in self.killed:
                continue
            try:
                if s.proc.poll() is None:
                    for c in s.conns:
                        c.close()
                    assert_ledger(s.port, host=s.host)
            except Exception as e:  # still stop every instance
                errors.append(e)
        for i, s in everyone:
            try:
                if i in self.killed:
                    check_sanitizers(s.stderr(), s.address)
                    continue
                s.stop()
                check_exit_ledger(s)
                errs = [r for r in s.log_lines() if r.get("level") == "error"
                        and r.get("msg") not in self.allowed.get(s, ())]
                assert not errs, f"{s.address} logged errors: {errs}"
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]


def check_exit_ledger(s):
    """The "ledger" line an instance logs as it exits adds up, nothing left parked."""
    recs = [r for r in s.log_lines() if r.get("msg") == "ledger"]
    assert recs, f"{s.address}: no ledger line at exit"
    r = recs[-1]
    settled = sum(r["settled"].values())
    assert r["parked_now"] == 0 and r["parked_total"] + r["adopted"] == settled, r


@pytest.fixture
def ring():
    """ring(n, flags=(), per=None, start=range(n)) -> Ring with instances
    <start> running and agreeing on who is up."""
    made = []

    def make(n, flags=(), per=None, start=None, dispatch_port=None):
        r = Ring(n, flags, per, dispatch_port=dispatch_port)
        made.append(r)
        idx = list(range(n)) if start is None else list(start)
        for i in idx:
            r.start(i)
        wait_members([r.servers[i] for i in idx], len(idx))
        time.sleep(JOIN_WINDOW_S)
        return r
    yield make
    errors = []
    for r in made:
        try:
            r.teardown()
        except Exception as e:
            errors.append(e)
    if errors:
        raise errors[0]


class Poller:
    """A controller's long poll that follows 307s: the same request, headers
    kept, on a new connection to the Location. <s> is the instance its
    controller is configured with."""

    def __init__(self, ring, key, cid, s, target="/warm-start"):
        self.ring, self.key, self.cid, self.home = ring, key, cid, s
        self.followed = []      # the Locations followed
        self.refused = []       # ... of which these refused the connection
        self.conn = None
        self.send(*s.ctl, target)

    def send(self, host, port, target="/warm-start"):
        if self.conn is not None:
            self.conn.close()
        self.at = name_of(host, port)
        self.conn = self.ring.conn(host, port)
        self.conn.request("GET", target, poll_headers(*self.key, controller_id=self.cid))

    def follow(self, timeout=IO_TIMEOUT):
        """Reads a 307 and follows it; returns its Location. A Location that
        refuses the connection (an instance that just left, named by one
        that has not seen it leave yet) is given up as a controller gives
        it up: it polls its own instance again, a check period later."""
        loc = Location(self.conn.read_response(timeout))
        self.followed.append(loc)
        try:
            self.send(loc.host, loc.port, loc.target)
        except ConnectionRefusedError:
            self.refused.append(loc.name)
            time.sleep(CHECK_MS / 1000)
            self.send(*self.home.ctl)
        return loc

    def take(self, timeout=IO_TIMEOUT):
        """The payload it was answered with."""
        r = self.conn.read_response(timeout)
        assert r.status == 200, r
        return r.body


def settle(pollers, timeout=SETTLE_S):
    """Follows every redirect the pollers get until none comes for QUIET_S
    (long enough for every sweep that was due)."""
    deadline = time.monotonic() + timeout
    while True:
        ready = readable([p.conn for p in pollers], QUIET_S)
        if not ready:
            return
        assert time.monotonic() < deadline, "redirects kept coming"
        for p in pollers:
            if p.conn in ready:
                p.follow()


def deliver_each(pollers, via):
    """Dispatches one run per poller's key through <via> (following its
    redirect): each answers true and reaches that poller."""
    for n, p in enumerate(pollers):
        run_id = f"run_each_{n}_{p.key[0]}"
        body, payload = message_body(p.key, run_id)
        r = post(via.host, via.port, "/warm-start", body)
        if r.status == 307:
            loc = Location(r)
            r = post(loc.host, loc.port, loc.target, body)
        assert answer(r) is True, (p.key, p.at, r)
        assert p.take() == payload, p.key


def wait_readable(conns, n, timeout=SETTLE_S):
    deadline = time.monotonic() + timeout
    while True:
        got = readable(conns, 0.05)
        if len(got) >= n or time.monotonic() > deadline:
            return got


# --------------------------------------------------------------------------
# Keys split between instances
# --------------------------------------------------------------------------

def check_split(ring, servers, names, keys, tag):
    """Polls every key at every one of <servers>: exactly one parks it, the
    others answer 307 naming that one; following each 307 parks there
    without a hop counted. Returns {key: owner index} and the parked polls,
    each key's direct poll first."""
    conns = {}
    for k, key in enumerate(keys):
        for j, s in enumerate(servers):
            conns[k, j] = ring.poll(s, key, f"ctl_{tag}_{k}_{j}")
    for s in servers:
        s.wait_metrics(lambda m: m.parked_total + m.get("pilotlight_ring_redirects_total",
                                                        route="poll") >= len(keys),
                       SETTLE_S, f"{s.address} to park or redirect every poll")
    parked = []
    for s in servers:
        r = s.get("/debug/waiters")
        assert r.status == 200, r
        parked.append({k["deployment"]: k["parked"] for k in r.json()["keys"]})
    owners, polls = {}, {}
    for k, key in enumerate(keys):
        at = [j for j in range(len(servers)) if key[0] in parked[j]]
        if len(at) != 1:
            said = [conns[k, j].read_response(0.5) if j not in at else "parked"
                    for j in range(len(servers))]
            raise AssertionError(f"{key[0]} parked at {[names[j] for j in at]}; the instances "
                                 f"{names} answered {said}")
        owners[key] = o = at[0]
        assert parked[o][key[0]] == 1
        polls[key] = [conns[k, o]]
        for j in range(len(servers)):
            if j == o:
                continue
            loc = Location(conns[k, j].read_response())
            assert loc.name == names[o] and loc.query == {"pl_hop": "1"}, (key, j, loc.url)
            c = ring.conn(loc.host, loc.port)
            c.request("GET", loc.target, poll_headers(*key, controller_id=f"ctl_{tag}_{k}_{j}"))
            polls[key].append(c)
    assert not readable([conns[k, owners[key]] for k, key in enumerate(keys)], 0.2)
    for j, s in enumerate(servers):
        mine = sum(1 for o in owners.values() if o == j)
        s.wait_metrics(lambda m: m.parked_now == len(servers) * mine, SETTLE_S,
                       f"{s.address} to hold every poll of its {mine} keys")
        m = s.metrics()
        assert m.get("pilotlight_ring_redirects_total", route="poll") == len(keys) - mine
        assert m.get("pilotlight_ring_hop_served_total", route="poll") == 0
    return owners, polls


def test_each_key_has_one_owner_every_instance_names(ring, request):
    r = ring(3)
    keys = [key_of(i, "deployment_split") for i in range(36)]
    owners, polls = check_split(r, r.servers, r.names, keys, "split")
    share = [sum(1 for o in owners.values() if o == j) for j in range(3)]
    show(request, f"36 keys over 3 instances: {share}")
    # 36 keys: the chance that one instance owns none is about 1e-6
    assert all(share), share
    # a dispatch for each key through an instance that does not own it
    # reaches the key's first poll, the one sent straight to the owner
    for k, key in enumerate(keys):
        via = r.servers[(owners[key] + 1) % 3]
        body, payload = message_body(key, f"run_split_{k}")
        first = post(via.host, via.port, "/warm-start", body)
        loc = Location(first)
        assert loc.name == r.names[owners[key]] and loc.query == {"pl_hop": "1"}, loc.url
        assert answer(post(loc.host, loc.port, loc.target, body)) is True
        assert polls[key][0].read_response().body == payload
        assert not readable(polls[key][1:], 0)
    for j, s in enumerate(r.servers):
        m = s.metrics()
        assert m.dispatched("hit") == share[j] and m.dispatched("miss") == 0
        assert m.get("pilotlight_ring_redirects_total", route="dispatch") == \
            sum(1 for o in owners.values() if (o + 1) % 3 == j)


# --------------------------------------------------------------------------
# Dispatches redirected
# --------------------------------------------------------------------------

def test_redirected_dispatch_delivers_the_payload_byte_for_byte(ring):
    r = ring(2)
    by = r.keys_owned("deployment_bytes", [r.names[1]])
    key = by[r.names[1]][0]
    a, b = r.servers
    p = Poller(r, key, "ctl_bytes", b)
    b.wait_parked(1)
    ca, cb = counters(a), counters(b)  # the probes for an owned key counted too
    body, payload = message_body(key, "run_bytes")
    loc = Location(post(a.host, a.port, "/warm-start", body))
    assert loc.name == r.names[1] and loc.query == {"pl_hop": "1"}, loc.url
    assert answer(post(loc.host, loc.port, loc.target, body)) is True
    assert p.take() == payload
    # a run nobody waits for: redirected the same way, false from the owner
    body, _ = message_body(key, "run_nobody")
    loc = Location(post(a.host, a.port, "/warm-start", body))
    assert answer(post(loc.host, loc.port, loc.target, body)) is False
    da = {k: v - ca[k] for k, v in counters(a).items()}
    db = {k: v - cb[k] for k, v in counters(b).items()}
    assert da["redirects_dispatch"] == 2
    assert da["dispatch"] == 0  # counted where answered only
    assert db["dispatch"] == 2 and b.metrics().dispatched("hit") == 1
    assert db["hop_served_dispatch"] == 0 and db["redirects_dispatch"] == 0


def test_signed_redirect_stands_in_for_the_bearer_token(ring):
    """A dispatch with the bearer token at a member that does not own its key
    is redirected with a signature that stands in for the token: for that
    body, that hop, the member it names, a short while, once. Replayed,
    presented elsewhere, changed or expired, it is refused 401 and delivers
    nothing; as the redirecting client sends it, it works, once."""
    r = ring(3, flags=("--dispatch-token", TOKEN))
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    a, b, c = r.servers
    key = r.keys_owned("deployment_signed", [r.names[1]], bearer)[r.names[1]][0]
    p = Poller(r, key, "ctl_signed", b)
    b.wait_parked(1)
    body, payload = message_body(key, "run_signed")
    # without the token: refused before anything else
    assert post(a.host, a.port, "/warm-start", body).status == 401
    t0 = int(time.time())
    loc = Location(post(a.host, a.port, "/warm-start", body, bearer))
    t1 = int(time.time())
    q = loc.query
    assert set(q) == {"pl_hop", "pl_exp", "pl_nonce", "pl_sig"} and q["pl_hop"] == "1", loc.url
    assert loc.name == r.names[1], loc.url
    exp, nonce = int(q["pl_exp"]), q["pl_nonce"]
    assert t0 + SIG_TTL_S <= exp <= t1 + SIG_TTL_S, (exp, t0, t1)
    assert re.fullmatch(r"[0-9a-f]{32}", nonce), nonce
    assert q["pl_sig"] == signature(TOKEN, exp, 1, r.names[1], nonce, "/warm-start", body)

    def target(exp_s, sig, hop=1, n=nonce):
        return f"/warm-start?pl_hop={hop}&pl_exp={exp_s}&pl_nonce={n}&pl_sig={sig}"

    def sig_for(exp_s, hop=1, member=r.names[1], n=nonce, token=TOKEN, bd=body):
        return signature(token, exp_s, hop, member, n, "/warm-start", bd)
    now = int(time.time())
    tampered = body.replace(b"run_signed", b"run_sigNed")
    other = "f" * 32
    refused = [
        ("a tampered body", loc.target, tampered),
        ("another token", target(exp, sig_for(exp, token="tok_other")), body),
        ("a changed pl_exp", target(exp + 1, q["pl_sig"]), body),
        ("a changed pl_hop", target(exp, q["pl_sig"], hop=2), body),
        ("a changed pl_nonce", target(exp, q["pl_sig"], n=other), body),
        ("an expired signature", target(now - SKEW_S - 2, sig_for(now - SKEW_S - 2)), body),
        ("a signature made to last",
         target(now + 600, sig_for(now + 600)), body),
        ("no signature", "/warm-start?pl_hop=1", body),
        ("no nonce", f"/warm-start?pl_hop=1&pl_exp={exp}&pl_sig={q['pl_sig']}", body),
        ("no expiry", f"/warm-start?pl_hop=1&pl_nonce={nonce}&pl_sig={q['pl_sig']}", body),
    ]
    before = counters(b)
    for what, tgt, bd in refused:
        resp = post(b.host, b.port, tgt, bd)
        assert resp.status == 401, (what, resp)
        assert resp.headers.get("www-authenticate") == "Bearer", (what, resp)
    # a signature is for the dispatch path only
    sig = signature(TOKEN, exp, 1, r.names[1], nonce, "/warm-start", b"")
    cn = r.conn(b.host, b.port)
    cn.request("GET", f"/debug/waiters?pl_hop=1&pl_exp={exp}&pl_nonce={nonce}&pl_sig={sig}")
    assert cn.read_response().status == 401
    # for b, it is nothing at c (which would otherwise sign it anew for b)
    cb_ = counters(c)
    resp = post(c.host, c.port, loc.target, body)
    assert resp.status == 401, resp
    assert counters(c) == cb_
    assert counters(b) == before
    assert not readable([p.conn], 0.1), "a refused dispatch reached the poll"
    # as a redirecting client sends it: no Authorization, the Location as given
    assert answer(post(loc.host, loc.port, loc.target, body)) is True
    assert p.take() == payload
    # ... and once only: the same Location again delivers nothing
    q2 = Poller(r, key, "ctl_signed_2", b)
    b.wait_parked(1)
    resp = post(loc.host, loc.port, loc.target, body)
    assert resp.status == 401, resp
    assert not readable([q2.conn], 0.2), "a replayed dispatch reached a poll"
    mb = b.metrics()
    assert mb.dispatched("hit") == 1 and mb.sum("pilotlight_dispatch_total") == 1


# --------------------------------------------------------------------------
# Hop marks
# --------------------------------------------------------------------------

def test_hop_marks_are_served_where_they_land(ring):
    r = ring(2)
    a, b = r.servers
    by = r.keys_owned("deployment_hop", r.names)
    kb, ka = by[r.names[1]][0], by[r.names[0]][0]
    misses = a.metrics().dispatched("miss")  # the probes answered at a
    # pl_hop=1 at a member that does not own the key: parked there, counted,
    # and sent on to the owner a check period later
    p = Poller(r, kb, "ctl_hop1", a, "/warm-start?pl_hop=1")
    a.wait_metrics(lambda m: m.get("pilotlight_ring_hop_served_total", route="poll") == 1)
    loc = p.follow(SETTLE_S)
    assert loc.name == r.names[1] and loc.query == {"pl_hop": "1"}, loc.url
    b.wait_parked(1)
    assert a.metrics().settled("moved") == 1
    assert b.metrics().get("pilotlight_ring_hop_served_total", route="poll") == 0
    # a dispatch marked pl_hop=2 is answered where it lands: false at a,
    # where nothing waits for it, and the poll at b gets nothing; one marked
    # pl_hop=1 that misses at a is sent on once more, to the owner as a sees it
    redirects = a.metrics().get("pilotlight_ring_redirects_total", route="dispatch")
    body, _ = message_body(kb, "run_hop2")
    assert answer(post(a.host, a.port, "/warm-start?pl_hop=2", body)) is False
    body, _ = message_body(kb, "run_hop1")
    loc = Location(post(a.host, a.port, "/warm-start?pl_hop=1", body))
    assert loc.name == r.names[1] and loc.query == {"pl_hop": "2"}, loc.url
    ma = a.metrics()
    assert ma.get("pilotlight_ring_hop_served_total", route="dispatch") == 2
    assert ma.get("pilotlight_ring_redirects_total", route="dispatch") == redirects + 1
    assert ma.dispatched("miss") == misses + 1
    assert not readable([p.conn], 0.1)
    # pl_hop=2 at a: parked there too, and sent on
    q = Poller(r, kb, "ctl_hop2", a, "/warm-start?pl_hop=2")
    assert q.follow(SETTLE_S).name == r.names[1]
    assert a.metrics().get("pilotlight_ring_hop_served_total", route="poll") == 2
    # at the owner a hop mark changes nothing and counts nothing
    body, payload = message_body(kb, "run_owner_hop2")
    assert answer(post(b.host, b.port, "/warm-start?pl_hop=2", body)) is True
    assert p.take() == payload
    s = Poller(r, ka, "ctl_owner_hop1", a, "/warm-start?pl_hop=1")
    a.wait_metrics(lambda m: m.parked_now >= 1)
    body, payload = message_body(ka, "run_owner_hop1")
    assert answer(post(a.host, a.port, "/warm-start", body)) is True
    assert s.take() == payload
    assert a.metrics().get("pilotlight_ring_hop_served_total", route="poll") == 2
    assert b.metrics().get("pilotlight_ring_hop_served_total", route="dispatch") == 0
    # parameters that are not hop marks are left alone
    body, _ = message_body(kb, "run_other_params")
    loc = Location(post(a.host, a.port, "/warm-start?pl_hopx=9&x=1&xpl_hop=7", body))
    assert loc.name == r.names[1] and loc.query == {"pl_hop": "1"}


MALFORMED_QUERIES = [
    "pl_hop=3", "pl_hop=-1", "pl_hop=", "pl_hop", "pl_hop=1x", "pl_hop=+1", "pl_hop=0x1",
    "pl_hop=99999999999999999999", "pl_hop=1&pl_hop=7", "pl_exp=soon", "pl_exp=",
    "pl_exp=1e9", "pl_sig=abc", "pl_sig=" + "A" * 64, "pl_sig=" + "0" * 63 + "g",
    "pl_sig=" + "0" * 65, "pl_hop=1&pl_exp=1&pl_sig=" + "f" * 63, "pl_nonce=abc",
    "pl_nonce=" + "0" * 31 + "G",
]


def test_malformed_hop_marks_are_refused_without_effect(ring):
    """Each malformed mark, on a poll and on a dispatch, at the owner and at
    the other: 400 naming it, and nothing parked, counted, redirected or
    delivered."""
    r = ring(2)
    by = r.keys_owned("deployment_bad", r.names)
    keys = [by[n][0] for n in r.names]
    polls = [Poller(r, keys[i], f"ctl_bad_{i}", s) for i, s in enumerate(r.servers)]
    for s in r.servers:
        s.wait_parked(1)
    before = [counters(s) for s in r.servers]
    for query in MALFORMED_QUERIES:
        for s in r.servers:
            for key in keys:
                c = r.poll(s, key, "ctl_malformed", f"/warm-start?{query}")
                resp = c.read_response()
                assert resp.status == 400 and MALFORMED in resp.json()["error"], (query, resp)
                body, _ = message_body(key, "run_malformed")
                resp = post(s.host, s.port, f"/warm-start?{query}", body)
                assert resp.status == 400 and MALFORMED in resp.json()["error"], (query, resp)
    assert [counters(s) for s in r.servers] == before
    assert not readable([p.conn for p in polls], 0.1)


def test_a_draining_instance_sends_on_what_reaches_it(ring):
    """SIGTERM with a drain delay: the instance leaves the ring at once and
    still answers until the delay ends; pl_hop=1 is sent on as pl_hop=2,
    pl_hop=2 is served there (and its poll sent on a check period later)."""
    r = ring(2, per=lambda i, h: ["--drain-delay-ms", "60000"] if i == 0 else [])
    a, b = r.servers
    key = r.keys_owned("deployment_drain", [r.names[0]])[r.names[0]][0]
    a.sigterm()
    a.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 0, SETTLE_S,
                   "the draining instance to leave the ring")
    wait_members([b], 1)
    assert a.get("/readyz").status == 503
    for hop, want in ((None, "1"), (1, "2")):
        tgt = "/warm-start" if hop is None else f"/warm-start?pl_hop={hop}"
        loc = Location(r.poll(a, key, f"ctl_drain_{hop}", tgt).read_response())
        assert loc.name == r.names[1] and loc.query == {"pl_hop": want}, loc.url
        body, _ = message_body(key, f"run_drain_{hop}")
        loc = Location(post(a.host, a.port, tgt, body))
        assert loc.name == r.names[1] and loc.query == {"pl_hop": want}, loc.url
    body, _ = message_body(key, "run_drain_2")
    assert answer(post(a.host, a.port, "/warm-start?pl_hop=2", body)) is False
    p = Poller(r, key, "ctl_drain_2", a, "/warm-start?pl_hop=2")
    loc = p.follow(SETTLE_S)
    assert loc.name == r.names[1] and loc.query == {"pl_hop": "1"}, loc.url
    b.wait_parked(1)
    m = a.metrics()
    assert m.get("pilotlight_ring_hop_served_total", route="poll") == 1
    assert m.get("pilotlight_ring_hop_served_total", route="dispatch") == 1
    assert m.settled("moved") == 1
    assert_ledger(m)
    a.sigterm()  # a second signal: closes at once
    assert a.wait_exit() == 0


# --------------------------------------------------------------------------
# Membership
# --------------------------------------------------------------------------

def test_a_member_that_joins_takes_its_keys_and_only_those(ring, request):
    """Two of three listed instances up, 30 keys' polls parked on them; the
    third starts: the polls of the keys it now owns get 307 to it (settled
    "moved" where they were), the others stay where they are."""
    r = ring(3, start=[0, 1])
    a, b = r.servers[:2]
    keys = [key_of(i, "deployment_join") for i in range(30)]
    pollers = [Poller(r, key, f"ctl_join_{n}", a) for n, key in enumerate(keys)]
    settle(pollers)
    before = {p.key: p.at for p in pollers}
    assert set(before.values()) <= set(r.names[:2])
    assert sum(s.metrics().parked_now for s in (a, b)) == len(keys)
    t0 = time.monotonic()
    c = r.start(2)
    wait_members(r.servers, 3)
    took = time.monotonic() - t0
    # the moves are made on each ring change, before /metrics counts 3
    wait_readable([p.conn for p in pollers], 1)
    time.sleep(QUIET_S)
    moved = [p for p in pollers if p.conn in readable([q.conn for q in pollers], 0)]
    show(request, f"join: all three count 3 members {took:.2f} s after the start;"
                  f" {len(moved)} of {len(keys)} polls moved")
    # 30 keys: the chance that none or all move is about 1e-5
    assert 0 < len(moved) < len(keys)
    for p in moved:
        loc = p.follow()
        assert loc.name == r.names[2] and loc.query == {"pl_hop": "1"}, loc.url
    c.wait_parked(len(moved))
    settle(pollers)
    for p in pollers:
        assert p.at == (r.names[2] if p in moved else before[p.key]), p.key
    m = [s.metrics() for s in r.servers]
    for j in (0, 1):
        assert m[j].settled("moved") == sum(1 for p in moved if before[p.key] == r.names[j])
    assert m[2].get("pilotlight_ring_hop_served_total", route="poll") == 0
    deliver_each(pollers, a)


def test_a_dispatch_that_misses_at_a_new_member_tries_the_previous_owner(ring):
    """While the others may not have seen a new member yet, a poll of a key
    it now owns can still be parked where the key was before: a dispatch
    that misses at the new member is sent there (once), not answered false.
    The first instance checks its peers once a minute, so it still sees two
    members when the third has joined."""
    def per(i, host):
        return {0: ("--ring-check-ms", "60000"), 2: ("--ring-check-timeout-ms", "3000")}.get(i, ())
    r = ring(3, per=per, start=[1, 0])
    a, b = r.servers[:2]
    # the first's own misses are sent on too (its check period makes it new
    # for minutes), so the second names the owners
    keys = [k for k in (key_of(i, "deployment_aftermiss") for i in range(60))
            if r.owner(b, k) == r.names[0]]
    c = r.start(2)
    wait_members([b, c], 3)
    assert a.metrics().get("pilotlight_ring_members") == 2
    key = next(k for k in keys if r.owner(b, k) == r.names[2])
    p = Poller(r, key, "ctl_aftermiss", a)
    a.wait_parked(1)
    body, payload = message_body(key, "run_aftermiss")
    loc = Location(post(c.host, c.port, "/warm-start", body))
    assert loc.name == r.names[0] and loc.query == {"pl_hop": "1"}, loc.url
    assert answer(post(loc.host, loc.port, loc.target, body)) is True
    assert p.take() == payload
    assert c.metrics().get("pilotlight_ring_redirects_total", route="dispatch") == 1
    assert a.metrics().get("pilotlight_ring_hop_served_total", route="dispatch") == 0


def test_sigterm_moves_the_polls_then_leaves(ring, request):
    """SIGTERM: the instance leaves the ring first, its parked polls answered
    307 to their keys' new owners before it closes; the others drop it."""
    r = ring(3)
    keys = [key_of(i, "deployment_term") for i in range(30)]
    pollers = [Poller(r, key, f"ctl_term_{n}", r.servers[0]) for n, key in enumerate(keys)]
    settle(pollers)
    c = r.servers[2]
    on_c = [p for p in pollers if p.at == r.names[2]]
    assert 0 < len(on_c) < len(keys)
    c.wait_parked(len(on_c))
    t0 = time.monotonic()
    c.sigterm()
    for p in on_c:  # a 307 before the connection closes
        loc = p.follow(SETTLE_S)
        assert loc.name in r.names[:2] and loc.query == {"pl_hop": "1"}, loc.url
    wait_members(r.servers[:2], 2)
    dropped = time.monotonic() - t0
    assert c.wait_exit() == 0
    settle(pollers)
    refused = sum(len(p.refused) for p in pollers)
    show(request, f"SIGTERM: {len(on_c)} polls redirected; the others dropped it within"
                  f" {dropped:.2f} s; redirects to it refused afterwards: {refused}")
    assert all(p.at in r.names[:2] for p in pollers)
    assert not readable([p.conn for p in pollers if p not in on_c], 0)
    m = json_lines(c.stderr())
    assert any(x.get("msg") == "ring: parked polls sent to their keys' owners" and
               x.get("moved") == len(on_c) for x in m), c.stderr()[-3000:]
    deliver_each(pollers, r.servers[1])


def test_a_killed_member_leaves_the_ring_at_once(ring, request):
    r = ring(3)
    keys = [key_of(i, "deployment_kill") for i in range(12)]
    pollers = [Poller(r, key, f"ctl_kill_{n}", r.servers[0]) for n, key in enumerate(keys)]
    settle(pollers)
    victim = r.servers[1]
    t0 = time.monotonic()
    r.kill(1)
    seen = {}
    deadline = t0 + SETTLE_S
    while len(seen) < 2 and time.monotonic() < deadline:
        for j in (0, 2):
            if j not in seen and members(r.servers[j]) == 2:
                seen[j] = time.monotonic() - t0
        time.sleep(0.01)
    show(request, "SIGKILL: the others counted 2 members after "
                  + ", ".join(f"{v * 1000:.0f} ms" for v in seen.values()))
    assert len(seen) == 2, seen
    assert max(seen.values()) < 3.0, seen
    # its polls' connections ended; their controllers poll again
    orphans = [p for p in pollers if p.at == r.names[1]]
    for p in orphans:
        p.conn.wait_closed(SETTLE_S)
        p.send(r.servers[0].host, r.servers[0].port)
    settle(pollers)
    assert all(p.at != r.names[1] for p in pollers), [p.refused for p in pollers]
    deliver_each(pollers, r.servers[2])
    assert victim.proc.returncode == -signal.SIGKILL


def test_a_stopped_member_leaves_and_comes_back(ring, request):
    """A member that accepts connections but answers nothing (SIGSTOP) is
    out after two checks unanswered within the timeout; back once it
    answers again."""
    r = ring(2)
    a, b = r.servers
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        out = wait_members([a], 1)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    back = wait_members([a, b], 2)
    show(request, f"SIGSTOP: out after {out:.2f} s; back {back:.2f} s after SIGCONT")
    key = r.keys_owned("deployment_stop", [r.names[1]])[r.names[1]][0]
    p = Poller(r, key, "ctl_stop", a)
    assert p.follow().name == r.names[1]
    deliver_each([p], a)


def test_a_binary_upgrade_keeps_the_polls_and_the_place_in_the_ring(ring, subreaper,
                                                                      request):
    """SIGUSR2 on a member: the new process adopts its parked polls and,
    once it sees the others, keeps those of the keys it owns (all of them);
    dispatches redirected to it reach them. The other member never sees it
    leave: its check connection is handed over, or checked again at once."""
    r = ring(2, flags=["--upgrade-binary", BIN])
    a, b = r.servers
    keys = r.keys_owned("deployment_upgrade", [r.names[1]], count=3)[r.names[1]]
    pollers = [Poller(r, key, f"ctl_upgrade_{n}", a) for n, key in enumerate(keys)]
    for p in pollers:
        assert p.follow().name == r.names[1]
    b.wait_parked(len(keys))
    changes = a.metrics().get("pilotlight_ring_changes_total")
    t0 = time.monotonic()
    b.proc.send_signal(signal.SIGUSR2)
    assert b.wait_exit(timeout=60) == 0
    new = wait_logged(b, "upgrade: adopted")[-1]["pid"]
    try:
        wait_members([a, b], 2)
        m = b.metrics()
        assert m.parked_now == len(keys) and m.settled("moved") == 0, m.text
        assert not readable([p.conn for p in pollers], QUIET_S)
        show(request, f"upgrade: the new process had its polls and the ring"
                      f" {time.monotonic() - t0:.2f} s after SIGUSR2")
        assert a.metrics().get("pilotlight_ring_changes_total") == changes
        deliver_each(pollers, a)
        assert_ledger(b.metrics())
        for c in r.conns:
            c.close()
    finally:
        stop_adopted(b, new)  # then the teardown reads its ledger line and its errors


def test_a_ring_change_while_polls_are_held_for_an_upgrade(ring, tmp_path, request):
    """A member's upgrade stalls (the new process never answers READY), so
    its parked polls are held for the hand-over; a member joins meanwhile.
    What the member knew of its keys before the change no longer counts:
    a new poll of a key the newcomer now owns gets 307 to it at once,
    although the key's entry lives on in the held polls. When the upgrade
    is abandoned, the held polls of those keys are sent there too."""
    step_ms = 4000
    marker = tmp_path / "marker"
    r = ring(3, start=[1])
    b = r.servers[1]
    a = r.start(0, "--upgrade-binary", stalling_program(tmp_path),
                env={"PILOTLIGHT_UPGRADE_STEP_TIMEOUT_MS": str(step_ms),
                     "STALL_MODE": "reads", "STALL_MARKER": str(marker)})
    r.allowed[a] = {"upgrade failed: still serving"}
    wait_members([a, b], 2)
    time.sleep(JOIN_WINDOW_S)
    keys = r.keys_owned("deployment_heldring", [r.names[0]], count=24)[r.names[0]]
    held = [r.poll(a, key, f"ctl_held_{n}") for n, key in enumerate(keys)]
    a.wait_parked(len(keys))
    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGUSR2)
    while not marker.exists():
        assert time.monotonic() - t0 < SETTLE_S, "the stalling program did not start"
        time.sleep(0.005)
    c = r.start(2)
    wait_members([a, b, c], 3)
    fresh = [Poller(r, key, f"ctl_fresh_{n}", a) for n, key in enumerate(keys)]
    answered = wait_readable([p.conn for p in fresh], len(keys), timeout=QUIET_S)
    moved = [p for p in fresh if p.conn in answered]
    pending = not logged(a, "upgrade failed: still serving")
    took = time.monotonic() - t0
    show(request, f"upgrade held {len(keys)} polls; a member joined: {len(moved)} new polls"
                  f" sent to it {took:.2f} s after SIGUSR2 (hand-over still pending: {pending})")
    assert pending, f"the upgrade ended before the new polls were checked ({took:.2f} s)"
    # 24 keys: the chance that none or all move is about 1e-4
    assert 0 < len(moved) < len(keys)
    for p in moved:
        loc = p.follow()
        assert loc.name == r.names[2] and loc.query == {"pl_hop": "1"}, loc.url
    c.wait_parked(len(moved))
    assert not readable(held, 0)  # nothing is moved while held
    wait_logged(a, "upgrade failed: still serving", timeout=SETTLE_S)
    gone = {p.key for p in moved}
    held_moved = [h for h, key in zip(held, keys) if key in gone]
    assert set(wait_readable(held_moved, len(held_moved))) == set(held_moved)
    for h in held_moved:
        loc = Location(h.read_response())
        assert loc.name == r.names[2] and loc.query == {"pl_hop": "1"}, loc.url
    assert not readable([h for h in held if h not in held_moved], QUIET_S)
    assert a.metrics().settled("moved") == len(moved)
    for h in held:  # the polls a keeps: the fresh ones take the runs below
        if h not in held_moved:
            h.close()
    a.wait_metrics(lambda m: m.parked_now == len(keys) - len(moved), SETTLE_S,
                   "the held polls closed")
    deliver_each(fresh, b)


# --------------------------------------------------------------------------
# dispatch_listen
# --------------------------------------------------------------------------

def test_dispatch_listener_redirects_to_the_owners_dispatch_port(ring):
    """Each instance with a dispatch listener at the same port: a dispatch
    is sent to the owner's host at that port, a poll to the owner's
    controller port (its name in the ring)."""
    dport = free_port_on(HOSTS[:2])
    r = ring(2, per=lambda i, h: ["--dispatch-listen", name_of(h, dport)], dispatch_port=dport)
    a, b = r.servers
    key = r.keys_owned("deployment_dl", [name_of(HOSTS[1], dport)])[name_of(HOSTS[1], dport)][0]
    p = Poller(r, key, "ctl_dl", a)
    assert p.follow().name == r.names[1]
    b.wait_parked(1)
    body, payload = message_body(key, "run_dl")
    loc = Location(post(a.host, dport, "/warm-start", body))
    assert loc.name == name_of(HOSTS[1], dport) and loc.query == {"pl_hop": "1"}, loc.url
    # the controllers' listener does not take a dispatch, redirected or not
    assert post(*b.ctl, loc.target, body).status == 403
    assert answer(post(loc.host, loc.port, loc.target, body)) is True
    assert p.take() == payload
    assert a.metrics().get("pilotlight_ring_redirects_total", route="dispatch") >= 1


# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------

LONG = "h" * 70 + ":8080"
REFUSED = [
    (["--ring-peers", "10.0.0.1:8080,10.0.0.2:8080"], "must be one of ring_peers"),
    (["--ring-peers", "10.0.0.1:8080,10.0.0.2:8080", "--ring-self", "10.0.0.3:8080"],
     "must be one of ring_peers"),
    (["--ring-peers", "10.0.0.1:8080", "--ring-self", "10.0.0.1:8080",
      "--ring-dns", "pl.svc:8080"], "a ring takes one or the other"),
    (["--ring-peers", "10.0.0.1:8080,10.0.0.2", "--ring-self", "10.0.0.1:8080"],
     '"10.0.0.2" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,::1:8080", "--ring-self", "10.0.0.1:8080"],
     '"::1:8080" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,[::1]8080", "--ring-self", "10.0.0.1:8080"],
     '"[::1]8080" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,10.0.0.2:0", "--ring-self", "10.0.0.1:8080"],
     '"10.0.0.2:0" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,10.0.0.2:65536", "--ring-self", "10.0.0.1:8080"],
     '"10.0.0.2:65536" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,a/b:8080", "--ring-self", "10.0.0.1:8080"],
     '"a/b:8080" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,u@h:8080", "--ring-self", "10.0.0.1:8080"],
     '"u@h:8080" is not host:port'),
    (["--ring-peers", "10.0.0.1:8080,:8080", "--ring-self", "10.0.0.1:8080"],
     '":8080" is not host:port'),
    (["--ring-peers", f"10.0.0.1:8080,{LONG}", "--ring-self", "10.0.0.1:8080"],
     f'"{LONG}" is not host:port'),
    (["--ring-peers", ",".join(f"h{i}:1" for i in range(65)), "--ring-self", "h0:1"],
     "more than 64 members"),
    (["--ring-peers", "10.0.0.1:8080", "--ring-self", "10.0.0.1"],
     'ring_self: "10.0.0.1" is not host:port'),
    (["--ring-self", "10.0.0.1:8080"], "ring_self is set but neither"),
    (["--ring-dns", "pl.svc"], 'ring_dns: "pl.svc" is not name:port'),
    (["--ring-dns", "pl.svc:8080"], "its port is not listen's (0)"),
]


@pytest.mark.parametrize("args,why", REFUSED, ids=[w for _, w in REFUSED])
def test_ring_settings_refused_at_start_and_by_check_config(args, why):
    for check in ([], ["--check-config"]):
        rc, out, err = run_binary(*check, "--listen", "127.0.0.1:0", *args, timeout=15)
        assert rc == 2, (check, args, rc, out, err)
        assert why in err, (check, args, err)
        assert "listening" not in err


def test_ring_settings_from_the_environment_are_checked_alike():
    rc, out, err = run_binary("--listen", "127.0.0.1:0", timeout=15,
                              env={"PILOTLIGHT_RING_PEERS": "10.0.0.1:8080,10.0.0.2:8080",
                                   "PILOTLIGHT_RING_SELF": "10.0.0.9:8080"})
    assert rc == 2 and "must be one of ring_peers" in err, err


def write_conf(path, **settings):
    path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))


def hup_until(s, msg):
    """SIGHUP; waits until <msg> is logged once more."""
    def count():
        return sum(1 for x in s.log_lines() if x.get("msg") == msg)
    n = count()
    s.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + SETTLE_S
    while count() <= n:
        assert time.monotonic() < deadline, f"no {msg!r} after SIGHUP:\n{s.stderr()[-3000:]}"
        time.sleep(0.02)
    return [x for x in s.log_lines() if x.get("msg") == msg][-1]


def test_a_static_ring_grows_and_shrinks_by_reload(ring, tmp_path):
    """A static list grown by SIGHUP, member by member: the newcomer and
    the members that took the new list first disagree with the others for a
    moment, and nothing is lost meanwhile: every poll is moved at most
    twice, every run dispatched through any member reaches its poll. Then
    shrunk the same way. A ring setting that does not load fails the reload
    as a whole."""
    r = ring(3, start=[])
    confs = [tmp_path / f"ring{i}.conf" for i in range(3)]
    two, three = ",".join(r.names[:2]), ",".join(r.names)
    for i in range(3):
        write_conf(confs[i], ring_peers=three if i == 2 else two, ring_self=r.names[i],
                   ring_check_ms=CHECK_MS, ring_check_timeout_ms=CHECK_TIMEOUT_MS)
    a, b = (r.start(i, args=["--listen", r.names[i], "--config", str(confs[i])])
            for i in range(2))
    wait_members([a, b], 2)
    pollers = [Poller(r, key_of(i, "deployment_grow"), f"ctl_grow_{i}", (a, b)[i % 2])
               for i in range(24)]
    settle(pollers)
    c = r.start(2, args=["--listen", r.names[2], "--config", str(confs[2])])
    for i, s in ((0, a), (1, b)):
        write_conf(confs[i], ring_peers=three, ring_self=r.names[i], ring_check_ms=CHECK_MS,
                   ring_check_timeout_ms=CHECK_TIMEOUT_MS)
        hup_until(s, "reloaded")
    wait_members([a, b, c], 3)
    settle(pollers)
    assert all(len(p.followed) <= 3 for p in pollers), [len(p.followed) for p in pollers]
    moved = sum(s.metrics().settled("moved") for s in (a, b, c))
    assert moved > 0 and c.metrics().parked_now > 0
    # every poll is where a dispatch through a member finds it
    deliver_each(pollers, a)
    # ... and shrunk: c leaves the lists, then goes
    for i, s in ((0, a), (1, b)):
        write_conf(confs[i], ring_peers=two, ring_self=r.names[i], ring_check_ms=CHECK_MS,
                   ring_check_timeout_ms=CHECK_TIMEOUT_MS)
        hup_until(s, "reloaded")
    wait_members([a, b], 2)
    # a ring setting that does not load fails the reload as a whole
    write_conf(confs[0], ring_peers=two, ring_self=r.names[2], max_waiters=502)
    rec = hup_until(a, "reload failed: configuration unchanged")
    assert "must be one of ring_peers" in rec["error"], rec
    r.allowed[a] = {"reload failed: configuration unchanged"}
    m = a.metrics()
    assert m.get("pilotlight_config_max_waiters") != 502
    assert m.get("pilotlight_ring_members") == 2


def test_views_that_never_agree_bounce_nothing(ring):
    """Two member lists (a counts b and c, b and c count only each other):
    views that never agree. No poll is redirected more than twice, and each
    ends up parked somewhere that serves it."""
    r = ring(3, start=[])
    names = r.names
    a = r.start(0)
    b = r.start(1, args=["--listen", names[1], "--ring-peers", ",".join(names[1:]),
                         "--ring-self", names[1], *RING_FLAGS])
    c = r.start(2, args=["--listen", names[2], "--ring-peers", ",".join(names[1:]),
                         "--ring-self", names[2], *RING_FLAGS])
    wait_members([a], 3)
    wait_members([b, c], 2)
    pollers = [Poller(r, key_of(i, "deployment_split"), f"ctl_split_{i}", (a, b, c)[i % 3])
               for i in range(30)]
    deadline = time.monotonic() + 10 * CHECK_MS / 1000 + 2
    while time.monotonic() < deadline:
        ready = readable([p.conn for p in pollers], 0.05)
        for p in pollers:
            if p.conn in ready:
                p.follow()
    assert max(len(p.followed) for p in pollers) <= 2, [len(p.followed) for p in pollers]
    assert a.metrics().get("pilotlight_ring_agreed") == 0
    assert sum(s.metrics().parked_now for s in (a, b, c)) == len(pollers)


# --------------------------------------------------------------------------
# ring_dns
# --------------------------------------------------------------------------

HOSTS_FILE = "127.0.0.1 localhost\n::1 localhost\n"


def localhost_addresses(preexec=None):
    code = ("import socket;print(' '.join(sorted({a[4][0] for a in "
            "socket.getaddrinfo('localhost', 0, type=socket.SOCK_STREAM)})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       preexec_fn=preexec, timeout=30)
    return set(p.stdout.split()) if p.returncode == 0 else set()


def members_hosts(path, addrs):
    path.write_text(HOSTS_FILE + "".join(f"{a} ringmembers\n" for a in addrs))


def test_a_member_joining_by_dns_is_seen_by_all_within_a_check(tmp_path, request):
    """ring_dns looked up once a minute: a new member is in the name's
    answer for everyone, but only the newcomer looks at once. Its checks
    show the others a view other than theirs, so they look up the name at
    once too: all count it, and agree, within a few check periods, not a
    minute."""
    hosts = [tmp_path / f"hosts{i}" for i in range(3)]
    try:
        members_hosts(hosts[0], HOSTS[:2])
        code = "import socket;socket.getaddrinfo('ringmembers', 0)"
        ok = subprocess.run([sys.executable, "-c", code], preexec_fn=private_hosts(hosts[0]),
                            timeout=30, capture_output=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        pytest.skip("a private /etc/hosts (a mount namespace, root) is not available")
    r = Ring(3)
    try:
        def start(i):
            return r.start(i, args=["--listen", r.names[i], "--ring-dns",
                                    f"ringmembers:{r.port}", *RING_FLAGS,
                                    "--ring-resolve-ms", "60000"],
                           preexec_fn=private_hosts(hosts[i]))
        for i in range(2):
            members_hosts(hosts[i], HOSTS[:2])
        a, b = start(0), start(1)
        wait_members([a, b], 2)
        # the name now has three addresses, for everyone; a and b would
        # not look again for a minute
        for i in range(3):
            members_hosts(hosts[i], HOSTS[:3])
        t0 = time.monotonic()
        c = start(2)
        took = wait_members([a, b, c], 3, timeout=20)
        for s in (a, b, c):
            s.wait_metrics(lambda m: m.get("pilotlight_ring_agreed") == 1, SETTLE_S,
                           "the views to agree")
        show(request, f"join by DNS looked up once a minute: all three count it "
                      f"{time.monotonic() - t0:.2f} s after it started ({took:.2f} s)")
        assert took < 10, took  # a look-up a minute would take 60 s
    finally:
        r.teardown()


def test_ring_dns_finds_each_instance_by_its_own_address(tmp_path, request):
    """Two instances, on 127.0.0.1:P and [::1]:P, with --ring-dns
    localhost:P and no ring_self: both addresses are this host's, and each
    instance must take the one it listens on as itself; then they split the
    keys as any ring does."""
    both = {"127.0.0.1", "::1"}
    preexec, how = None, "this machine's resolver"
    if not both <= localhost_addresses():
        hosts = tmp_path / "hosts"
        hosts.write_text(HOSTS_FILE)
        try:
            ok = both <= localhost_addresses(private_hosts(hosts))
        except (OSError, subprocess.SubprocessError):
            ok = False
        if not ok:
            pytest.skip("localhost does not resolve to both 127.0.0.1 and ::1 here, and a"
                        " private /etc/hosts (a mount namespace, root) is not available")
        preexec, how = private_hosts(hosts), "a private /etc/hosts"
    try:
        free_port_on(["127.0.0.1", "::1"])
    except AssertionError:
        pytest.skip("127.0.0.1 and ::1 cannot both be bound at one port here")
    r = Ring(2, hosts=["127.0.0.1", "::1"])
    try:
        for i, name in enumerate(r.names):
            r.start(i, args=["--listen", name, "--ring-dns", f"localhost:{r.port}",
                             *RING_FLAGS, "--ring-resolve-ms", "500"], preexec_fn=preexec)
        wait_members(r.servers, 2)
        keys = [key_of(i, "deployment_dns") for i in range(16)]
        owners, _ = check_split(r, r.servers, r.names, keys, "dns")
        show(request, f"ring_dns through {how}: 16 keys split "
                      f"{[sum(1 for o in owners.values() if o == j) for j in (0, 1)]}")
    finally:
        r.teardown()
