"""400s for bad poll headers and bad dispatch bodies, dispatch misses, and
the 413 / 431 / 414 limits."""

import base64
import copy
import json

import pytest

from conftest import (EXAMPLE, assert_ledger, make_message, poll_headers,
                      read_payload)


def error_of(resp):
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), resp
    return body["error"]


# -- long-poll headers -------------------------------------------------------------

CID = "x-trigger-workload-controller-id"
DEP = "x-trigger-deployment-id"
VER = "x-trigger-deployment-version"
CPU = "x-trigger-machine-cpu"
MEM = "x-trigger-machine-memory"

BAD_HEADERS = [
    # (id, header named in the error, omit, overrides)
    ("missing-controller-id", CID, (CID,), {}),
    ("missing-deployment-id", DEP, (DEP,), {}),
    ("missing-version", VER, (VER,), {}),
    ("missing-cpu", CPU, (CPU,), {}),
    ("missing-memory", MEM, (MEM,), {}),
    ("empty-controller-id", CID, (), {CID: ""}),
    ("empty-deployment-id", DEP, (), {DEP: ""}),
    ("cpu-abc", CPU, (), {CPU: "abc"}),
    ("cpu-empty", CPU, (), {CPU: ""}),
    ("cpu-trailing-garbage", CPU, (), {CPU: "1x"}),
    ("memory-empty", MEM, (), {MEM: ""}),
    ("memory-abc", MEM, (), {MEM: "abc"}),
    ("memory-two-dots", MEM, (), {MEM: "0.5.1"}),
]


@pytest.mark.parametrize("named,omit,over", [b[1:] for b in BAD_HEADERS],
                         ids=[b[0] for b in BAD_HEADERS])
def test_bad_poll_header_is_400_naming_it(server, named, omit, over):
    c = server.conn()
    c.request("GET", "/warm-start", poll_headers(omit=omit, extra=over))
    r = c.read_response()
    assert r.status == 400, r
    assert named in error_of(r).lower(), r
    m = assert_ledger(server.metrics())
    assert m.parked_total == 0 and m.parked_now == 0


def _unverified_token(claims):
    """A JWT read (not verified) with token_mode = disabled: its deployment
    claim is the key's deployment."""
    def b64(obj):
        raw = json.dumps(obj).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    return f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64(claims)}.c2lnbmF0dXJl"


# A key no dispatch body can name (dispatch bodies are UTF-8 JSON, and a
# control character in a header is none a controller sends): refused, not
# parked to wait out every poll. Header values go out as latin-1, so each
# character below is one byte on the wire.
BAD_TEXT = [
    ("deployment-id-not-utf8", DEP, "deployment_A\xff"),
    ("deployment-id-overlong", DEP, "deployment_\xc0\xaf"),
    ("deployment-id-surrogate", DEP, "deployment_\xed\xa0\x80"),
    ("deployment-id-cut-short", DEP, "deployment_\xe2\x82"),
    ("deployment-id-tab", DEP, "deploy\tment"),
    ("deployment-claim-control", DEP, _unverified_token({"deployment": "deployment_\u0001"})),
    ("version-not-utf8", VER, "20251130.1\xff"),
    ("version-tab", VER, "20251130\t1"),
    ("controller-id-not-utf8", CID, "controller_\xfe"),
    ("controller-id-tab", CID, "controller\t1"),
]


@pytest.mark.parametrize("named,value", [b[1:] for b in BAD_TEXT], ids=[b[0] for b in BAD_TEXT])
def test_key_header_that_is_not_text_is_400_naming_it(server, named, value):
    c = server.conn()
    c.request("GET", "/warm-start", poll_headers(extra={named: value}))
    r = c.read_response(timeout=3)
    assert r.status == 400, r
    err = error_of(r)
    assert err.startswith(named) and ("UTF-8" in err or "control character" in err), err
    m = assert_ledger(server.metrics())
    assert m.parked_total == 0 and m.parked_now == 0


def test_key_in_utf8_parks_and_matches(server):
    """Text beyond ASCII is a key like any other: the header's UTF-8 bytes
    match the same characters in a dispatch body, escaped or not."""
    dep = "d\u00e9ploiement_\u65e5\u672c"
    c = server.park(deployment=dep.encode().decode("latin-1"),
                    version="v\u00b2".encode().decode("latin-1"))
    assert server.dispatch(make_message(deployment=dep, version="v\u00b2")) is True
    assert read_payload(c)["deployment"]["friendlyId"] == dep


# -- dispatch bodies ----------------------------------------------------------------

def _without(path):
    m = copy.deepcopy(EXAMPLE)
    *parents, last = path
    node = m
    for p in parents:
        node = node[p]
    del node[last]
    return {"dequeuedMessage": m}


def _with(path, value):
    m = copy.deepcopy(EXAMPLE)
    *parents, last = path
    node = m
    for p in parents:
        node = node[p]
    node[last] = value
    return {"dequeuedMessage": m}


DM = "dequeuedmessage"
BAD_BODIES = [
    # (id, body, text the error must contain, lower-cased)
    ("not-json", b"{not json", None),
    ("truncated-json", json.dumps({"dequeuedMessage": EXAMPLE}).encode()[:-3], None),
    ("empty-body", b"", None),
    ("json-array", b"[]", DM),
    ("no-dequeuedMessage", b"{}", DM),
    ("other-key-only", b'{"message": {}}', DM),
    ("dequeuedMessage-string", b'{"dequeuedMessage": "x"}', DM),
    ("dequeuedMessage-array", b'{"dequeuedMessage": []}', DM),
    ("dequeuedMessage-null", b'{"dequeuedMessage": null}', DM),
    ("dequeuedMessage-number", b'{"dequeuedMessage": 5}', DM),
    ("no-deployment", _without(["deployment"]), DM + ".deployment"),
    ("no-friendlyId", _without(["deployment", "friendlyId"]), DM + ".deployment.friendlyid"),
    ("friendlyId-number", _with(["deployment", "friendlyId"], 7), DM + ".deployment.friendlyid"),
    ("friendlyId-null", _with(["deployment", "friendlyId"], None), DM + ".deployment.friendlyid"),
    ("deployment-string", _with(["deployment"], "deployment_x"), DM + ".deployment"),
    ("no-backgroundWorker", _without(["backgroundWorker"]), DM + ".backgroundworker"),
    ("no-version", _without(["backgroundWorker", "version"]), DM + ".backgroundworker.version"),
    ("version-number", _with(["backgroundWorker", "version"], 20261130.1),
     DM + ".backgroundworker.version"),
    ("no-run", _without(["run"]), DM + ".run"),
    ("no-machine", _without(["run", "machine"]), DM + ".run.machine"),
    ("no-cpu", _without(["run", "machine", "cpu"]), DM + ".run.machine.cpu"),
    ("cpu-string", _with(["run", "machine", "cpu"], "0.5"), DM + ".run.machine.cpu"),
    ("cpu-null", _with(["run", "machine", "cpu"], None), DM + ".run.machine.cpu"),
    ("cpu-bool", _with(["run", "machine", "cpu"], True), DM + ".run.machine.cpu"),
    ("no-memory", _without(["run", "machine", "memory"]), DM + ".run.machine.memory"),
    ("memory-string", _with(["run", "machine", "memory"], "0.5"), DM + ".run.machine.memory"),
    ("memory-object", _with(["run", "machine", "memory"], {}), DM + ".run.machine.memory"),
]


@pytest.mark.parametrize("body,named", [b[1:] for b in BAD_BODIES],
                         ids=[b[0] for b in BAD_BODIES])
def test_bad_dispatch_body_is_400_and_waiter_untouched(server, body, named):
    waiter = server.park()  # of the example's key
    r = server.dispatch_raw(body)
    assert r.status == 400, r
    err = error_of(r)
    if named is not None:
        assert named in err.lower(), r
    # The waiter of that key got nothing and is still parked.
    assert waiter.silent_for(0.05)
    m = assert_ledger(server.metrics())
    assert m.parked_now == 1 and m.dispatched("invalid") == 1
    assert m.dispatched("hit") == 0 and m.dispatched("miss") == 0
    # A valid dispatch then matches it.
    msg = make_message(run_id="run_valid_after_invalid")
    assert server.dispatch(msg) is True
    assert read_payload(waiter) == msg


def test_dispatch_miss_is_false_and_nothing_is_queued(server):
    assert server.dispatch() is False
    m = server.metrics()
    assert m.dispatched("miss") == 1 and m.parked_now == 0
    late = server.park()
    server.wait_parked(1)
    assert late.silent_for(0.3), "a poll parked after a missed dispatch received it"
    assert server.dispatch(make_message(run_id="run_second")) is True
    assert read_payload(late)["run"]["friendlyId"] == "run_second"


def test_dispatch_other_key_does_not_match(server):
    w = server.park()
    for msg in (make_message(deployment=EXAMPLE["deployment"]["friendlyId"] + "x"),
                make_message(version="20261130.2"),
                make_message(cpu=1),
                make_message(memory=1)):
        assert server.dispatch(msg) is False
    assert w.silent_for(0.05)
    assert server.dispatch() is True
    assert read_payload(w) == EXAMPLE


# -- limits ---------------------------------------------------------------------------

def test_body_over_limit_is_413_before_body_is_sent(start_server):
    s = start_server("--max-body-bytes", "1024")
    c = s.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: 5000\r\n\r\n")
    r = c.read_response(timeout=3)  # decided from Content-Length alone
    assert r.status == 413, r
    assert c.wait_closed(timeout=3) == b""  # the unread body cannot be skipped
    assert s.metrics().dispatched("hit") == 0


def test_expect_100_continue_over_limit_gets_413_not_100(start_server):
    s = start_server("--max-body-bytes", "1024")
    c = s.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Expect: 100-continue\r\nContent-Length: 5000\r\n\r\n")
    r = c.read_response(timeout=3)
    assert r.status == 413, r


def test_body_at_limit_is_accepted(start_server):
    s = start_server("--max-body-bytes", "4096")
    w = s.park()
    body = json.dumps({"dequeuedMessage": EXAMPLE}).encode()
    assert len(body) < 4096
    body = body + b" " * (4096 - len(body))  # trailing whitespace is valid JSON
    r = s.dispatch_raw(body)
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    assert read_payload(w) == EXAMPLE


def test_chunked_body_over_limit_is_413(start_server):
    s = start_server("--max-body-bytes", "1024")
    w = s.park()
    c = s.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    try:
        for _ in range(4):
            c.send(b"200\r\n" + b" " * 0x200 + b"\r\n")
        c.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before the end of the body
    r = c.read_response(timeout=3)
    assert r.status == 413, r
    assert w.silent_for(0.05)


def test_headers_over_limit_is_431(start_server):
    s = start_server("--max-header-bytes", "1024")
    # Well under the limit: fine.
    assert s.request("GET", "/healthz", {"X-Pad": "a" * 200}).status == 200
    c = s.conn()
    try:
        c.request("GET", "/healthz", {"X-Pad": "a" * 3000})
    except (BrokenPipeError, ConnectionResetError):
        pass
    r = c.read_response(timeout=3)
    assert r.status == 431, r


def test_many_headers_over_limit_is_431(start_server):
    s = start_server("--max-header-bytes", "1024")
    c = s.conn()
    try:
        c.request("GET", "/healthz", [(f"X-H{i}", "v" * 20) for i in range(80)])
    except (BrokenPipeError, ConnectionResetError):
        pass
    r = c.read_response(timeout=3)
    assert r.status == 431, r


def test_url_over_limit_is_414(start_server):
    s = start_server("--max-url-bytes", "256")
    assert s.get("/healthz?" + "a" * 100).status == 200
    c = s.conn()
    try:
        c.request("GET", "/healthz?" + "a" * 1000)
    except (BrokenPipeError, ConnectionResetError):
        pass
    r = c.read_response(timeout=3)
    assert r.status == 414, r


def test_deeply_nested_body_is_400_and_server_lives(server):
    w = server.park()
    for body in (b"[" * 200000,
                 b'{"dequeuedMessage":' + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b"}"):
        r = server.dispatch_raw(body)
        assert r.status == 400, r
    assert server.dispatch() is True
    assert read_payload(w) == EXAMPLE
