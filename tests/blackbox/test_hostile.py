"""Hostile input on raw sockets: each case has the exact status and the exact
connection end (closed by the server, or kept alive) that RFC 9112 / RFC 9110
and docs/protocol.md call for. After every case the server must still answer
/healthz, a bystander poll parked before the case must still be matched, and
the ledger must balance.

How the connection end is told apart: after the first answer the test sends a
probe (GET /connect) on the same connection. A kept-alive connection answers
it; a closed one gives EOF. Any other answer before the probe's (an answer to
a request smuggled inside the first one) is a failure.

Expected statuses, and where they come from:
  400 + close  malformed framing or syntax (RFC 9112 2.2, 5.1, 6.1, 6.3, 7.1;
               RFC 9112 3.2 for Host)
  501 + close  a transfer coding the server does not implement (RFC 9112 6.1,
               SHOULD) and an unknown method (RFC 9110 9.1, SHOULD); the
               parser cannot go on after either, so the connection ends
  414 / 431 / 413 / 417 + close  the configured limits, unknown Expect
Where the RFC leaves a choice (bare LF as a line end, obs-fold replaced by
SP, a duplicate identical Content-Length, the HTTP/2 preface) the test pins
the server's current, conforming choice; the comment on the case says so.
"""

import json
import socket
import time

import pytest

from conftest import (EXAMPLE, ConnectionClosed, assert_ledger,
                      build_request, make_message, poll_headers, read_payload)

BYSTANDER = dict(deployment="deployment_bystander", controller_id="controller_bystander")
PROBE = b"GET /connect HTTP/1.1\r\nHost: x\r\n\r\n"
FIRST_TIMEOUT = 3.0

# A valid dispatch for a key nobody waits on: if it gets through, the answer
# is 200 {"didWarmStart":false}, which makes a wrongly accepted request plain.
DBODY = json.dumps({"dequeuedMessage": make_message(run_id="run_hostile")}).encode()
DL = b"%d" % len(DBODY)
POST = b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
HEALTHZ = GET + b"\r\n"


def chunked(body, size=500):
    out = b""
    for i in range(0, len(body), size):
        part = body[i:i + size]
        out += b"%x\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\n\r\n"


def headers_n(n):
    """GET /healthz with exactly <n> header lines (Host included)."""
    return (b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
            + b"".join(b"X-H%d: v\r\n" % i for i in range(n - 1)) + b"\r\n")


# -- observing one case -----------------------------------------------------------

class Outcome:
    def __init__(self, first, end, extra):
        self.first = first      # Response, or None (closed / silent)
        self.end = end          # "close" | "keep" | "silent"
        self.extra = extra      # answers seen between the first and the probe's

    def __repr__(self):
        st = self.first.status if self.first else None
        return (f"status={st} end={self.end} first={self.first!r} "
                f"extra={self.extra!r}")


def observe(conn, data):
    """Sends <data>, reads the first answer, then finds out how the
    connection ended (see the module docstring)."""
    try:
        conn.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may answer and close before a long input is sent
    try:
        first = conn.read_response(timeout=FIRST_TIMEOUT)
    except ConnectionClosed:
        return Outcome(None, "close", [])
    except socket.timeout:
        return Outcome(None, "silent", [])
    extra = []
    try:
        conn.send(PROBE)
    except (BrokenPipeError, ConnectionResetError):
        pass
    deadline = time.monotonic() + FIRST_TIMEOUT
    while time.monotonic() < deadline:
        try:
            r = conn.read_response(timeout=max(0.05, deadline - time.monotonic()))
        except ConnectionClosed:
            return Outcome(first, "close", extra)
        except socket.timeout:
            break
        if r.status == 200 and b"keepaliveMs" in r.body:
            return Outcome(first, "keep", extra)
        extra.append(r)
    return Outcome(first, "silent", extra)


def start_with_bystander(start_server, args=()):
    s = start_server(*args)
    return s, s.park(**BYSTANDER)


def check_server_intact(s, bystander):
    """/healthz answers, the bystander is still parked and gets its run, and
    the ledger balances before and after."""
    r = s.get("/healthz")
    assert r.status == 200, f"/healthz after the case: {r!r}"
    m = assert_ledger(s.port)
    assert m.parked_now == 1, f"bystander no longer parked:\n{m.text}"
    msg = make_message(deployment=BYSTANDER["deployment"], run_id="run_bystander")
    assert s.dispatch(msg) is True, "bystander was not matched after the case"
    assert read_payload(bystander) == msg
    m = assert_ledger(s.port)
    assert m.parked_now == 0, m.text


def check_outcome(out, data, status, end):
    sent = data if len(data) <= 300 else data[:300] + b"...(%d bytes)" % len(data)
    got = out.first.status if out.first else None
    assert (got, out.end) == (status, end), \
        f"sent {sent!r}\nexpected {status} + {end}, got {got} + {out.end}: {out!r}"
    assert out.extra == [], \
        f"sent {sent!r}\nextra answers before the probe's (smuggled request?): {out.extra!r}"
    r = out.first
    if end == "close":
        assert "close" in r.headers.get("connection", "").lower(), \
            f"closing answer without Connection: close: {r!r}"
    if status >= 400:
        assert r.headers.get("content-type", "").startswith("application/json"), r
        assert "error" in r.json(), r


# -- the table --------------------------------------------------------------------
# (id, bytes, status, end, server flags)

LIMITS = ("--max-url-bytes", "256", "--max-header-bytes", "2048")
BODY_MAX = len(DBODY) + 100
BODY_LIMIT = ("--max-body-bytes", str(BODY_MAX))
PADDED = DBODY + b" " * (BODY_MAX - len(DBODY))  # valid JSON, exactly the limit

CASES = [
    # Content-Length and Transfer-Encoding together: MAY reject, MUST close (6.1).
    ("cl_and_te", POST + b"Content-Length: " + DL + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
     + chunked(DBODY) + HEALTHZ, 400, "close", ()),
    ("te_and_cl", POST + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
     + chunked(DBODY), 400, "close", ()),
    # Duplicate Content-Length: same value MAY be rejected, different MUST (RFC 9110 8.6).
    ("cl_duplicate_same", POST + b"Content-Length: " + DL + b"\r\nContent-Length: " + DL
     + b"\r\n\r\n" + DBODY, 400, "close", ()),
    ("cl_duplicate_different", POST + b"Content-Length: " + DL + b"\r\nContent-Length: 5\r\n\r\n"
     + DBODY, 400, "close", ()),
    ("cl_list_same", POST + b"Content-Length: " + DL + b", " + DL + b"\r\n\r\n" + DBODY,
     400, "close", ()),
    # Invalid Content-Length: 400 and close (6.3 item 5).
    ("cl_negative", POST + b"Content-Length: -1\r\n\r\n", 400, "close", ()),
    ("cl_exponent", POST + b"Content-Length: 1e3\r\n\r\n" + b"x" * 1000, 400, "close", ()),
    ("cl_inner_space", POST + b"Content-Length: 12 34\r\n\r\n", 400, "close", ()),
    ("cl_huge", POST + b"Content-Length: 99999999999999999999\r\n\r\n", 400, "close", ()),
    ("cl_plus", POST + b"Content-Length: +2\r\n\r\n{}", 400, "close", ()),
    ("cl_hex", POST + b"Content-Length: 0x10\r\n\r\n", 400, "close", ()),
    ("cl_empty", POST + b"Content-Length: \r\n\r\n", 400, "close", ()),
    # Transfer-Encoding whose final coding is not chunked: MUST 400 + close (6.3 item 4).
    ("te_unknown", POST + b"Transfer-Encoding: foo\r\n\r\n" + DBODY, 400, "close", ()),
    ("te_gzip_only", POST + b"Transfer-Encoding: gzip\r\n\r\n" + DBODY, 400, "close", ()),
    ("te_identity", POST + b"Transfer-Encoding: identity\r\n\r\n" + DBODY, 400, "close", ()),
    ("te_chunked_not_last", POST + b"Transfer-Encoding: chunked, gzip\r\n\r\n" + chunked(DBODY),
     400, "close", ()),
    # chunked applied twice: MUST NOT be sent (7), framing unreliable: 400 + close.
    ("te_chunked_chunked", POST + b"Transfer-Encoding: chunked, chunked\r\n\r\n" + chunked(DBODY),
     400, "close", ()),
    ("te_chunked_two_lines", POST + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
     + chunked(DBODY), 400, "close", ()),
    # A coding the server does not implement before chunked: SHOULD 501 (6.1).
    ("te_unknown_then_chunked", POST + b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked(DBODY),
     501, "close", ()),
    ("te_unknown_line_then_chunked", POST + b"Transfer-Encoding: foo\r\nTransfer-Encoding: chunked\r\n\r\n"
     + chunked(DBODY), 501, "close", ()),
    # Bare CR: MUST be treated as invalid (or replaced by SP) (2.2).
    ("bare_cr_request_line", b"GET /healthz HTTP/1.1\rHost: x\r\n\r\n", 400, "close", ()),
    ("bare_cr_between_headers", GET + b"X-A: 1\rX-B: 2\r\n\r\n", 400, "close", ()),
    ("bare_cr_in_value", GET + b"X-A: a\rb\r\n\r\n", 400, "close", ()),
    ("bare_cr_empty_value", GET + b"X-A: \rZ\r\n\r\n", 400, "close", ()),
    ("bare_cr_ends_headers", GET + b"\rX", 400, "close", ()),
    ("bare_cr_after_chunk_size", POST + b"Transfer-Encoding: chunked\r\n\r\n"
     + b"%x\rX" % len(DBODY) + DBODY + b"\r\n0\r\n\r\n", 400, "close", ()),
    # Bare LF: a recipient MAY take it as a line end (2.2). The server does in
    # the request line and for the final empty line, not after a field line.
    ("bare_lf_request_line", b"GET /healthz HTTP/1.1\nHost: x\r\n\r\n", 200, "keep", ()),
    ("bare_lf_end_of_headers", GET + b"\n", 200, "keep", ()),
    ("bare_lf_header_line", GET + b"X-A: 1\nX-B: 2\r\n\r\n", 400, "close", ()),
    ("bare_lf_everywhere", b"GET /healthz HTTP/1.1\nHost: x\nX-A: 1\n\n", 400, "close", ()),
    # NUL and other controls: not allowed in field values nor in the target.
    ("nul_in_header_value", GET + b"X-A: a\x00b\r\n\r\n", 400, "close", ()),
    ("nul_in_url", b"GET /heal\x00thz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "close", ()),
    ("ctl_in_header_value", GET + b"X-A: a\x01b\r\n\r\n", 400, "close", ()),
    ("del_in_header_value", GET + b"X-A: a\x7fb\r\n\r\n", 400, "close", ()),
    ("tab_in_url", b"GET /heal\tthz HTTP/1.1\r\nHost: x\r\n\r\n", 400, "close", ()),
    # obs-fold: MUST reject with 400 or replace by SP (5.2). The server
    # replaces it (see test_obs_fold_is_unfolded_in_a_key_header).
    ("obs_fold", GET + b"X-A: a\r\n b\r\n\r\n", 200, "keep", ()),
    ("obs_fold_in_content_length", POST + b"Content-Length: 1\r\n " + DL[1:] + b"\r\n\r\n" + DBODY,
     400, "close", ()),
    # Whitespace before the first field line: MUST reject or ignore (2.2).
    ("space_before_first_header", b"GET /healthz HTTP/1.1\r\n Host: x\r\n\r\n", 400, "close", ()),
    # Whitespace between field name and colon: MUST 400 (5.1).
    ("space_before_colon", GET + b"X-Pad : y\r\n\r\n", 400, "close", ()),
    ("space_before_colon_host", b"GET /healthz HTTP/1.1\r\nHost : x\r\n\r\n", 400, "close", ()),
    ("space_before_colon_content_length", POST + b"Content-Length : " + DL + b"\r\n\r\n" + DBODY,
     400, "close", ()),
    ("space_before_colon_transfer_encoding", POST + b"Transfer-Encoding : chunked\r\n\r\n"
     + chunked(DBODY), 400, "close", ()),
    # Header names are tokens (RFC 9110 5.1): anything else is 400.
    ("header_name_paren", GET + b"X(y): z\r\n\r\n", 400, "close", ()),
    ("header_name_at", GET + b"X@y: z\r\n\r\n", 400, "close", ()),
    ("header_name_non_ascii", GET + b"X\xc3\xa9: z\r\n\r\n", 400, "close", ()),
    ("header_name_empty", GET + b": z\r\n\r\n", 400, "close", ()),
    # Bad chunk sizes and chunk framing (7.1).
    ("chunk_size_not_hex", POST + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + DBODY, 400, "close", ()),
    ("chunk_size_overflow", POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 17 + b"\r\n" + DBODY,
     400, "close", ()),
    ("chunk_size_negative", POST + b"Transfer-Encoding: chunked\r\n\r\n-2\r\n{}\r\n0\r\n\r\n",
     400, "close", ()),
    ("chunk_size_trailing_space", POST + b"Transfer-Encoding: chunked\r\n\r\n2 \r\n{}\r\n0\r\n\r\n",
     400, "close", ()),
    ("chunk_data_missing_crlf", POST + b"Transfer-Encoding: chunked\r\n\r\n"
     + b"%x\r\n" % len(DBODY) + DBODY + b"XX0\r\n\r\n" + HEALTHZ, 400, "close", ()),
    # Host (RFC 9112 3.2): HTTP/1.1 without it, more than one, or an invalid
    # value: MUST 400. HTTP/1.0 may omit it.
    ("host_missing_http11", b"GET /healthz HTTP/1.1\r\n\r\n", 400, "close", ()),
    ("host_missing_http10", b"GET /healthz HTTP/1.0\r\n\r\n", 200, "close", ()),
    ("host_duplicate", GET + b"Host: y\r\n\r\n", 400, "close", ()),
    ("host_duplicate_other_case", b"GET /healthz HTTP/1.1\r\nHOST: x\r\nhost: x\r\n\r\n",
     400, "close", ()),
    ("host_invalid_value", b"GET /healthz HTTP/1.1\r\nHost: a, b\r\n\r\n", 400, "close", ()),
    ("host_empty", b"GET /healthz HTTP/1.1\r\nHost:\r\n\r\n", 200, "keep", ()),
    # Limits: request target over --max-url-bytes 414, headers over
    # --max-header-bytes or more than 100 lines 431.
    ("target_at_limit", b"GET /" + b"a" * 255 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 404, "keep", LIMITS),
    ("target_over_limit", b"GET /" + b"a" * 256 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "close", LIMITS),
    ("target_far_over_limit", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     414, "close", LIMITS),
    ("headers_over_limit", GET + b"X-Big: " + b"b" * 3000 + b"\r\n\r\n", 431, "close", LIMITS),
    ("headers_many_small_over_limit", GET + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 30)
                                                     for i in range(80)) + b"\r\n",
     431, "close", LIMITS),
    ("header_name_very_long", GET + b"X" * 20000 + b": y\r\n\r\n", 431, "close", ()),
    ("header_name_long_under_limit", GET + b"X" * 5000 + b": y\r\n\r\n", 200, "keep", ()),
    ("headers_100", headers_n(100), 200, "keep", ()),
    ("headers_101", headers_n(101), 431, "close", ()),
    # Body over --max-body-bytes: 413, by Content-Length and by chunked total.
    ("body_at_limit_content_length", POST + b"Content-Length: %d\r\n\r\n" % len(PADDED) + PADDED,
     200, "keep", BODY_LIMIT),
    ("body_over_limit_content_length", POST + b"Content-Length: %d\r\n\r\n" % (len(PADDED) + 1)
     + PADDED + b" ", 413, "close", BODY_LIMIT),
    ("body_over_limit_content_length_no_body", POST + b"Content-Length: %d\r\n\r\n" % (len(PADDED) + 1),
     413, "close", BODY_LIMIT),
    ("body_at_limit_chunked", POST + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(PADDED),
     200, "keep", BODY_LIMIT),
    ("body_over_limit_chunked", POST + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(PADDED + b" "),
     413, "close", BODY_LIMIT),
    ("body_over_limit_one_big_chunk", POST + b"Transfer-Encoding: chunked\r\n\r\nfffff\r\n"
     + b" " * (BODY_MAX + 1), 413, "close", BODY_LIMIT),
    # Expect other than 100-continue: 417 (RFC 9110 10.1.1).
    ("expect_unknown", POST + b"Expect: foo\r\nContent-Length: " + DL + b"\r\n\r\n" + DBODY,
     417, "close", ()),
    ("expect_unknown_on_get", GET + b"Expect: 100-continuex\r\n\r\n", 417, "close", ()),
    # Methods: unknown SHOULD be 501 (RFC 9110 9.1); known but not allowed 405.
    ("method_unknown_brew", b"BREW /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 501, "close", ()),
    ("method_put_not_allowed", b"PUT /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
     405, "keep", ()),
    # The HTTP/2 prior-knowledge preface on an HTTP/1.1-only server: not a
    # valid HTTP/1.1 request; answered 400 and closed.
    ("h2_preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, "close", ()),
]


@pytest.mark.parametrize("data,status,end,args",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_case(start_server, data, status, end, args):
    s, bystander = start_with_bystander(start_server, args)
    c = s.conn()
    out = observe(c, data)
    c.close()
    check_outcome(out, data, status, end)
    if status == 405:
        allow = {t.strip() for t in out.first.headers.get("allow", "").split(",")}
        assert "GET" in allow and "PUT" not in allow, out
    check_server_intact(s, bystander)


# -- cases that need more than one exchange ------------------------------------------

def test_obs_fold_is_unfolded_in_a_key_header(start_server):
    """obs-fold accepted means replaced by SP (RFC 9112 5.2): a poll whose
    deployment id is folded parks under "deployment_a b"."""
    s, bystander = start_with_bystander(start_server)
    h = poll_headers(deployment="deployment_a", controller_id="controller_fold")
    raw = build_request("GET", "/warm-start", h)
    raw = raw.replace(b"x-trigger-deployment-id: deployment_a\r\n",
                      b"x-trigger-deployment-id: deployment_a\r\n b\r\n")
    c = s.conn()
    before = s.metrics().parked_total
    c.send(raw)
    s.wait_metrics(lambda m: m.parked_total >= before + 1, what="folded poll parked")
    assert s.dispatch(make_message(deployment="deployment_a")) is False
    assert s.dispatch(make_message(deployment="deployment_ab")) is False
    msg = make_message(deployment="deployment_a b", run_id="run_folded")
    assert s.dispatch(msg) is True
    assert read_payload(c) == msg
    check_server_intact(s, bystander)


def test_dispatch_in_one_byte_writes(start_server):
    """A whole dispatch sent one byte per write (TCP_NODELAY) is served."""
    s, bystander = start_with_bystander(start_server)
    w = s.park(controller_id="controller_bytes")
    msg = make_message(run_id="run_one_byte")
    data = build_request("POST", "/warm-start", {"Content-Type": "application/json"},
                         json.dumps({"dequeuedMessage": msg}))
    c = s.conn()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(len(data)):
        c.send(data[i:i + 1])
        if i % 4 == 0:
            time.sleep(0.0002)
    r = c.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    assert read_payload(w) == msg
    c.send(PROBE)  # still kept alive, parser in a clean state
    r = c.read_response()
    assert r.status == 200 and "keepaliveMs" in r.json(), r
    check_server_intact(s, bystander)


@pytest.mark.parametrize("after", [HEALTHZ, b"\x00\x01garbage\r\n\r\n",
                                   b"GET /warm-start HTTP/1.1\r\n"],
                         ids=["valid_request", "garbage", "partial_request"])
def test_bytes_after_connection_close_are_ignored(start_server, after):
    """Connection: close ends the connection after the first answer; what
    follows is neither answered nor able to reset the answer."""
    s, bystander = start_with_bystander(start_server)
    c = s.conn()
    c.send(GET + b"Connection: close\r\n\r\n" + after)
    r = c.read_response()
    assert r.status == 200 and r.json() == {"status": "ok"}, r
    assert "close" in r.headers.get("connection", "").lower(), r
    assert c.wait_closed(timeout=3) == b"", "bytes after the answer to Connection: close"
    check_server_intact(s, bystander)


def test_garbage_pipelined_behind_parked_poll(start_server):
    """Garbage behind a parked poll waits with it: the poll stays parked and
    is matched (true, payload delivered), then the garbage is answered 400
    and the connection closed. No waiter is left and the ledger balances."""
    s, bystander = start_with_bystander(start_server)
    c = s.conn()
    before = s.metrics().parked_total
    c.send(build_request("GET", "/warm-start", poll_headers(controller_id="controller_garbage"))
           + b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    m = s.wait_metrics(lambda m: m.parked_total >= before + 1, what="poll parked")
    assert m.parked_now == 2, m.text
    assert c.silent_for(0.2), "the garbage was answered while the poll was parked"
    msg = make_message(run_id="run_after_garbage")
    assert s.dispatch(msg) is True
    assert read_payload(c) == msg
    r = c.read_response()
    assert r.status == 400, r
    assert "close" in r.headers.get("connection", "").lower(), r
    assert c.wait_closed(timeout=3) == b""
    m = assert_ledger(s.port)
    assert (m.parked_now, m.settled("matched"), m.settled("disconnect")) == (1, 1, 0), m.text
    check_server_intact(s, bystander)


def test_oversized_garbage_behind_parked_poll_is_dropped(start_server):
    """More than a small request's worth pipelined behind a parked poll: it
    is dropped, not kept (a parked poll costs the same whatever its client
    sends behind it); the poll stays parked and gets its run, and the
    connection closes after that answer, the garbage never read as a
    request."""
    s, bystander = start_with_bystander(start_server, ("--max-header-bytes", "1024"))
    c = s.conn()
    before = s.metrics().parked_total
    c.send(build_request("GET", "/warm-start", poll_headers(controller_id="controller_flood")))
    s.wait_metrics(lambda m: m.parked_total >= before + 1, what="poll parked")
    c.send(b"x" * 4096)
    assert c.silent_for(0.2)
    m = s.metrics()
    assert m.parked_now == 2 and m.settled("disconnect") == 0, m.text
    assert s.dispatch(EXAMPLE) is True
    assert read_payload(c) == EXAMPLE
    assert c.wait_closed(timeout=3) == b""
    check_server_intact(s, bystander)
