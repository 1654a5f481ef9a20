"""HTTP/1.1 behaviour: keep-alive, pipelining, chunked bodies, 100-continue,
HTTP/1.0, Connection: close, header and idle timeouts."""

import json
import select
import time

from conftest import (EXAMPLE, build_request, make_message, poll_headers,
                      read_payload)


def send_poll_and_wait(s, conn, **kw):
    """Sends a long-poll on <conn> and waits until it reached the engine."""
    before = s.metrics().parked_total
    conn.request("GET", "/warm-start", poll_headers(**kw))
    s.wait_metrics(lambda m: m.parked_total >= before + 1, what="poll parked")


# -- keep-alive and pipelining ------------------------------------------------------

def test_keepalive_repoll_on_same_connection(server):
    c = server.conn()
    for i in range(3):
        send_poll_and_wait(server, c, controller_id="controller_keepalive")
        msg = make_message(run_id=f"run_keepalive_{i}")
        assert server.dispatch(msg) is True
        assert read_payload(c) == msg
    m = server.metrics()
    assert m.settled("matched") == 3 and m.settled("replaced") == 0


def test_repoll_after_204_on_same_connection(start_server):
    s = start_server("--park-timeout-ms", "200", "--connection-timeout-ms", "150")
    c = s.conn()
    for _ in range(2):
        c.request("GET", "/warm-start", poll_headers(controller_id="controller_t"))
        r = c.read_response()
        assert r.status == 204, r
    send_poll_and_wait(s, c, controller_id="controller_t")
    assert s.dispatch() is True
    assert read_payload(c) == EXAMPLE


def test_three_pipelined_healthz_answered_in_order(server):
    c = server.conn()
    c.send(build_request("GET", "/healthz") * 3)
    for _ in range(3):
        assert c.read_response().status == 200
    # Different routes, answered in the order sent.
    c.send(build_request("GET", "/healthz") + build_request("GET", "/nope")
           + build_request("GET", "/connect"))
    assert c.read_response().status == 200
    assert c.read_response().status == 404
    r = c.read_response()
    assert r.status == 200 and "keepaliveMs" in r.json(), r


def test_many_pipelined_requests_in_one_send(server):
    c = server.conn()
    c.send(build_request("GET", "/healthz") * 500)
    for i in range(500):
        assert c.read_response().status == 200, i
    assert c.silent_for(0.05)


def test_head_response_has_no_body(server):
    """Whatever the status, a HEAD response carries no content (RFC 9110
    9.3.2): a pipelined request behind it must parse cleanly."""
    c = server.conn()
    c.send(build_request("HEAD", "/healthz") + build_request("GET", "/connect"))
    r = c.read_response(head_request=True)
    assert r.status in (200, 405), r
    r = c.read_response()
    assert r.status == 200 and r.json()["keepaliveMs"] == 300000, r


def test_request_pipelined_behind_parked_poll_waits_for_it(server):
    c = server.conn()
    before = server.metrics().parked_total
    c.send(build_request("GET", "/warm-start", poll_headers())
           + build_request("GET", "/connect"))
    server.wait_metrics(lambda m: m.parked_total >= before + 1, what="poll parked")
    assert c.silent_for(0.2), "something was answered while the poll was parked"
    msg = make_message(run_id="run_pipelined")
    assert server.dispatch(msg) is True
    assert read_payload(c) == msg
    r = c.read_response()
    assert r.status == 200 and r.json() == {"connectionTimeoutMs": 30000,
                                            "keepaliveMs": 300000}, r


def test_pipelined_dispatches_on_one_connection(server):
    w = [server.park(controller_id=f"controller_p{i}") for i in range(2)]
    c = server.conn()
    bodies = [json.dumps({"dequeuedMessage": make_message(run_id=f"run_p{i}")})
              for i in range(3)]
    c.send(b"".join(build_request("POST", "/warm-start",
                                  {"Content-Type": "application/json"}, b)
                    for b in bodies))
    results = [c.read_response().json()["didWarmStart"] for _ in range(3)]
    assert results == [True, True, False]
    assert read_payload(w[0])["run"]["friendlyId"] == "run_p0"
    assert read_payload(w[1])["run"]["friendlyId"] == "run_p1"


# -- bodies ---------------------------------------------------------------------------

def test_chunked_dispatch_body(server):
    w = server.park()
    msg = make_message(run_id="run_chunked")
    body = json.dumps({"dequeuedMessage": msg}).encode()
    c = server.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")
    pieces = [body[:10], body[10:500], body[500:]]
    for i, p in enumerate(pieces):
        ext = b";note=x" if i == 1 else b""
        c.send(b"%x%s\r\n%s\r\n" % (len(p), ext, p))
        time.sleep(0.03)
    c.send(b"0\r\n\r\n")
    r = c.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    assert read_payload(w) == msg
    # The connection is still usable afterwards.
    c.request("GET", "/healthz")
    assert c.read_response().status == 200


def test_expect_100_continue(server):
    w = server.park()
    body = json.dumps({"dequeuedMessage": EXAMPLE}).encode()
    c = server.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    r = c.read_response(timeout=3)
    assert r.status == 100, r
    c.send(body)
    r = c.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    assert read_payload(w) == EXAMPLE


def test_body_split_across_sends(server):
    w = server.park()
    body = json.dumps({"dequeuedMessage": EXAMPLE}).encode()
    c = server.conn()
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
    time.sleep(0.05)
    c.send(b"ication/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:7])
    time.sleep(0.05)
    c.send(body[7:])
    r = c.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    read_payload(w)


# -- connection management ---------------------------------------------------------------

def test_http10_request_is_answered_then_closed(server):
    c = server.conn()
    c.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    r = c.read_response()
    assert r.status == 200, r
    assert c.wait_closed(timeout=3) == b""


def test_http10_connect_body(server):
    c = server.conn()
    c.send(b"GET /connect HTTP/1.0\r\n\r\n")
    r = c.read_response()
    assert r.status == 200 and r.json()["keepaliveMs"] == 300000, r
    assert c.wait_closed(timeout=3) == b""


def test_connection_close_is_honoured(server):
    c = server.conn()
    c.request("GET", "/connect", {"Connection": "close"})
    r = c.read_response()
    assert r.status == 200, r
    assert c.wait_closed(timeout=3) == b""


def test_connection_close_on_matched_poll(server):
    c = server.conn()
    before = server.metrics().parked_total
    c.request("GET", "/warm-start", dict(poll_headers(), Connection="close"))
    server.wait_metrics(lambda m: m.parked_total >= before + 1)
    assert server.dispatch() is True
    assert read_payload(c) == EXAMPLE
    assert c.wait_closed(timeout=3) == b""


def test_header_names_are_case_insensitive(server):
    c = server.conn()
    h = {k.upper() if i % 2 else k.title(): v for i, (k, v) in enumerate(poll_headers().items())}
    before = server.metrics().parked_total
    c.request("GET", "/warm-start", h)
    server.wait_metrics(lambda m: m.parked_total >= before + 1)
    assert server.dispatch() is True
    assert read_payload(c) == EXAMPLE


def _drip_until_answer(c, first, drip, limit_s):
    """Sends <first>, then one byte of <drip> every 100 ms until the server
    answers or closes; returns the seconds it took."""
    t0 = time.monotonic()
    c.send(first)
    i = 0
    while time.monotonic() - t0 < limit_s:
        r, _, _ = select.select([c.sock], [], [], 0.1)
        if r:
            break
        try:
            c.send(drip[i % len(drip):i % len(drip) + 1])
        except (BrokenPipeError, ConnectionResetError):
            break
        i += 1
    return time.monotonic() - t0


def test_slow_request_line_gets_408_and_close(start_server):
    s = start_server("--header-timeout-ms", "500")
    c = s.conn()
    took = _drip_until_answer(c, b"GET /hea", b"aaaaaaaaaa", 4.0)
    assert 0.4 <= took < 3.0, f"answered after {took:.2f}s with header timeout 500 ms"
    r = c.read_response(timeout=2)
    assert r.status == 408, r
    assert c.wait_closed(timeout=2) == b""


def test_slow_headers_get_408_and_close(start_server):
    s = start_server("--header-timeout-ms", "500")
    c = s.conn()
    took = _drip_until_answer(c, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ",
                              b"bbbbbbbbbb", 4.0)
    assert 0.4 <= took < 3.0, f"answered after {took:.2f}s with header timeout 500 ms"
    r = c.read_response(timeout=2)
    assert r.status == 408, r
    assert c.wait_closed(timeout=2) == b""


def test_silent_new_connection_is_closed(start_server):
    s = start_server("--header-timeout-ms", "500", "--idle-timeout-ms", "500")
    c = s.conn()
    got = c.wait_closed(timeout=4)
    assert got == b"" or got.startswith(b"HTTP/1.1 408"), got[:200]


def test_idle_keepalive_connection_is_closed(start_server):
    s = start_server("--idle-timeout-ms", "500")
    c = s.conn()
    c.request("GET", "/healthz")
    assert c.read_response().status == 200
    t0 = time.monotonic()
    assert c.silent_for(0.2), "closed well before the idle timeout"
    assert c.wait_closed(timeout=4) == b""
    took = time.monotonic() - t0
    assert 0.35 <= took < 3.0, f"closed after {took:.2f}s with idle timeout 500 ms"


def test_parked_poll_outlives_idle_and_header_timeouts(start_server):
    s = start_server("--idle-timeout-ms", "300", "--header-timeout-ms", "300")
    w = s.park()
    assert w.silent_for(1.0), "parked poll was answered or closed by an idle/header timeout"
    assert s.dispatch() is True
    assert read_payload(w) == EXAMPLE
