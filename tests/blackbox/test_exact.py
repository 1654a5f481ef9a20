"""Exact reading: every dispatch read the way its consumer reads it.

- The Node-generated vectors (tests/vectors/dispatch.tsv, written by
  gen-dispatch.mjs from JSON.parse's reading): each accepted body reaches the
  controller parked on the key JSON.parse reads, as the exact bytes of its
  dequeuedMessage value; each refused body gets a 400 naming why, and nothing
  is delivered to the polls parked on every key a lenient reading could pick.
- (The same refusals through HAProxy: tests/interop/test_haproxy.py.)
- A tenant reusing another tenant's controller id (token_mode = enforce)
  ends nothing: both stay parked and each gets its own run.
- Request lines llhttp would take but RFC 9112 does not: HTTP/0.9, doubled
  spaces.
"""

import json
import time

import pytest

from conftest import (DECOY_KEYS, Conn, assert_ledger, dispatch_vectors, error_of,
                      make_message, poll_headers, read_payload, scrape)

VECTORS_ALL = dispatch_vectors()


def post(port, body):
    c = Conn(port)
    c.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
    r = c.read_response()
    c.close()
    return r


def poll_conn(port, dep, ver, cpu, mem, cid=None):
    c = Conn(port)
    c.request("GET", "/warm-start",
              poll_headers(deployment=dep, version=ver, cpu=cpu, memory=mem,
                           controller_id=cid))
    return c


def wait_parked_total(port, n):
    deadline = time.monotonic() + 10
    while scrape(port).parked_total < n:
        assert time.monotonic() < deadline, "polls never parked"
        time.sleep(0.01)


def test_vectors_refused_deliver_nothing(server):
    bad = [v for v in VECTORS_ALL if not v["ok"]]
    assert len(bad) >= 40
    polls = [poll_conn(server.port, *k) for k in DECOY_KEYS]
    wait_parked_total(server.port, len(polls))
    for v in bad:
        err = error_of(post(server.port, v["body"]))
        assert v["why"] in err, (v["label"], err)
    m = scrape(server.port)
    assert m.parked_now == len(polls)
    assert m.settled("matched") == 0
    assert m.dispatched("invalid") == len(bad)
    for c in polls:
        assert c.silent_for(0.05)
        c.close()


def pollable(v):
    """Whether a poll's headers can carry the key of vector <v>: UTF-8 text
    without a control character (a tab, say, which a JSON string can hold
    escaped, is refused in a key header)."""
    try:
        text = (v["dep"] + v["ver"]).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any(ord(ch) < 0x20 or ord(ch) == 0x7f for ch in text)


def test_vectors_accepted_deliver_their_exact_bytes(server):
    good = [v for v in VECTORS_ALL if v["ok"] and pollable(v)]
    assert len(good) >= 15
    for n, v in enumerate(good):
        c = poll_conn(server.port, v["dep"].decode("latin-1"), v["ver"].decode("latin-1"),
                      v["cpu"], v["mem"])
        wait_parked_total(server.port, n + 1)
        r = post(server.port, v["body"])
        assert r.status == 200 and json.loads(r.body) == {"didWarmStart": True}, \
            (v["label"], r, r.body[:300])
        got = c.read_response()
        assert got.status == 200, v["label"]
        assert got.body == v["payload"], v["label"]
        c.close()
    assert scrape(server.port).settled("matched") == len(good)


def test_vectors_no_poll_can_carry_find_nobody(server):
    """An accepted body whose key no poll can carry: its poll is a 400, so
    the dispatch finds nobody (false)."""
    odd = [v for v in VECTORS_ALL if v["ok"] and not pollable(v)]
    assert odd  # the tab in a friendlyId, at least
    for v in odd:
        c = poll_conn(server.port, v["dep"].decode("latin-1"), v["ver"].decode("latin-1"),
                      v["cpu"], v["mem"])
        assert c.read_response().status == 400, v["label"]
        c.close()
        r = post(server.port, v["body"])
        assert r.status == 200 and json.loads(r.body) == {"didWarmStart": False}, v["label"]
    assert_ledger(scrape(server.port))


# ---- tenants --------------------------------------------------------------

def test_enforce_other_tenant_reusing_a_controller_id_evicts_nothing(start_server):
    ti = pytest.importorskip("test_identity")
    v_dep, a_dep = "deployment_tenant_v", "deployment_tenant_a"
    tok_v, tok_a = ti.mint_many([
        {"secret": ti.SECRET, "deployment": v_dep, "version": ti.VER},
        {"secret": ti.SECRET, "deployment": a_dep, "version": ti.VER}])
    s = ti.enforce_server(start_server)
    cid = "controller_shared_id"
    v = poll_conn(s.port, tok_v, ti.VER, 0.5, 1, cid)
    wait_parked_total(s.port, 1)
    a = poll_conn(s.port, tok_a, ti.VER, 0.5, 1, cid)
    wait_parked_total(s.port, 2)
    m = scrape(s.port)
    assert m.parked_now == 2 and m.settled("replaced") == 0
    assert v.silent_for(0.1)

    def run(dep, run_id):
        msg = make_message(deployment=dep, version=ti.VER, cpu=0.5, memory=1, run_id=run_id)
        r = post(s.port, json.dumps({"dequeuedMessage": msg}))
        assert r.status == 200, r
        return json.loads(r.body)["didWarmStart"]

    assert run(v_dep, "run_v") is True
    assert read_payload(v)["run"]["friendlyId"] == "run_v"
    assert run(a_dep, "run_a") is True
    assert read_payload(a)["run"]["friendlyId"] == "run_a"
    # the same tenant's re-poll still replaces its own older poll
    v1 = poll_conn(s.port, tok_v, ti.VER, 0.5, 1, cid)
    wait_parked_total(s.port, 3)
    v2 = poll_conn(s.port, tok_v, ti.VER, 0.5, 1, cid)
    assert v1.read_response().status == 409
    wait_parked_total(s.port, 4)
    for c in (v, a, v1, v2):
        c.close()
    assert_ledger(s.port)


# ---- request lines ----------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"GET /healthz\r\n\r\n",                                    # HTTP/0.9
    b"GET  /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET /healthz  HTTP/1.1\r\nHost: a\r\n\r\n",
    b"\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\nGET  /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
])
def test_request_line_grammar(server, raw):
    c = Conn(server.port)
    first_ok = raw.startswith(b"\r\n")
    c.send(raw)
    if first_ok:
        assert c.read_response().status == 200
    r = c.read_response()
    assert r.status == 400, r
    assert r.version == "HTTP/1.1"
    c.close()


def test_request_line_doubled_space_split_across_reads(server):
    c = Conn(server.port)
    for b in b"GET / ":
        c.send(bytes([b]))
        time.sleep(0.002)
    c.send(b" healthz HTTP/1.1\r\nHost: a\r\n\r\n")
    assert c.read_response().status == 400
    c.close()
    # one space each, sent byte by byte, is fine
    c = Conn(server.port)
    for b in b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n":
        c.send(bytes([b]))
    assert c.read_response().status == 200
    c.close()
