"""Exact reading: every dispatch read the way its consumer reads it.

- The Node-generated vectors (tests/vectors/dispatch.tsv, written by
  gen-dispatch.mjs from JSON.parse's reading): each accepted body reaches the
  controller parked on the key JSON.parse reads, as the exact bytes of its
  dequeuedMessage value; each refused body gets a 400 naming why, and nothing
  is delivered to the polls parked on every key a lenient reading could pick.
- The same refusals through HAProxy in front of three instances.
- A tenant reusing another tenant's controller id (token_mode = enforce)
  ends nothing: both stay parked and each gets its own run.
- Request lines llhttp would take but RFC 9112 does not: HTTP/0.9, doubled
  spaces.
"""

import json
import tempfile
import time
from pathlib import Path

import pytest

from conftest import (Conn, assert_ledger, make_message, poll_headers, read_payload,
                      scrape)

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "dispatch.tsv"


def load_vectors():
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


VECTORS_ALL = load_vectors()

# Every key a refused vector names, however it is read: polls parked on all
# of them must still be parked after the refusals.
DECOY_KEYS = [("deployment_a", "20261130.1", "0.5", "1"), ("deployment_a", "v", "1", "1"),
              ("A", "v", "1", "1"), ("B", "v", "1", "1"), ("d", "v", "1", "1"),
              ("A", "20261130.1", "0.5", "1"), ("B", "20261130.1", "0.5", "1")]


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


def error_of(r):
    assert r.status == 400, (r, r.body[:300])
    err = json.loads(r.body)["error"]
    assert isinstance(err, str) and err
    return err


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


# ---- through HAProxy ------------------------------------------------------

ISSUE_BODIES = ["leading-zero", "trailing-dot", "ctl-as-ws", "raw-lf-in-string",
                "raw-bel-in-string", "trailing-nul", "bom", "utf8-overlong-slash",
                "dup-deployment", "dup-friendlyId", "nul-in-friendlyId", "nul-in-dm-name"]


def test_issue_bodies_refused_through_haproxy(start_server):
    th = pytest.importorskip("test_haproxy")
    if th.HAPROXY is None:
        pytest.skip(th.WHY_SKIP)
    servers = [start_server() for _ in range(3)]
    with tempfile.TemporaryDirectory() as d:
        proxy = th.Proxy(servers, d)
        try:
            polls = [poll_conn(proxy.port, *k) for k in DECOY_KEYS]
            th.wait_total(servers, "parked_now", len(polls), "decoys parked")
            by_label = {v["label"]: v for v in VECTORS_ALL}
            for label in ISSUE_BODIES:
                v = by_label[label]
                assert not v["ok"]
                err = error_of(post(proxy.port, v["body"]))
                assert v["why"] in err, (label, err)
            assert th.total(servers, "parked_now") == len(polls)
            assert sum(scrape(s.port).settled("matched") for s in servers) == 0
            assert sum(scrape(s.port).dispatched("invalid") for s in servers) \
                == len(ISSUE_BODIES)
            for c in polls:
                c.close()
        finally:
            proxy.stop()


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
