"""delivery = confirm at the edges of a connection's life: a dispatcher that
half-closes while its answer waits for the controller's ACK, and a
controller that resets its connection before its ACK was seen.

Each controller's kernel is put in delayed-ACK mode (TCP_QUICKACK off), so
its ACK leaves some 40 ms after the payload arrives: the half-close or the
reset reliably comes first, as it would behind HAProxy whenever its ACK is
delayed."""
import json
import socket
import time

import pytest

from conftest import (Conn, EXAMPLE, build_request, make_message, poll_headers, read_payload,
                      reset_close)
from test_confirm_ride import delayed_acks
from test_faults import BIG_BODY_LIMIT, slow_reader


def method(m, name):
    return m.get("pilotlight_confirm_method_total", method=name)


def dispatch_request(msg):
    return build_request("POST", "/warm-start", {"Content-Type": "application/json"},
                         json.dumps({"dequeuedMessage": msg}))


def test_half_closed_dispatcher_gets_its_confirmed_answers(start_server):
    """Two pipelined dispatches, then a half-close, while both controllers
    delay their ACKs: the EOF is read before either run is confirmed, and
    both answers still come, true, before the connection ends. Each waits
    alone for its key, so its attempt is not cut short for another poll, and
    the deadline is above the longest delayed ACK (200 ms)."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "2000")
    ctls = []
    for i in range(2):
        c = srv.park(controller_id=f"ctl_half_{i}", deployment=f"deployment_half_{i}")
        delayed_acks(c)
        ctls.append(c)
    msgs = [make_message(deployment=f"deployment_half_{i}", run_id=f"run_half_{i}")
            for i in range(2)]
    d = Conn(srv.port)
    t0 = time.monotonic()
    d.send(dispatch_request(msgs[0]) + dispatch_request(msgs[1]))
    d.sock.shutdown(socket.SHUT_WR)
    answers = [d.read_response() for _ in msgs]
    took = time.monotonic() - t0
    assert [(r.status, r.json()) for r in answers] == [(200, {"didWarmStart": True})] * 2
    assert d.wait_closed(timeout=3) == b""
    # the answers waited for delayed ACKs, long after the EOF had arrived
    assert took >= 0.02, took
    got = [read_payload(c) for c in ctls]
    assert sorted(got, key=json.dumps) == sorted(msgs, key=json.dumps)
    m = srv.metrics()
    assert m.get("pilotlight_confirm_total", outcome="acked") == 2, m.text
    assert m.dispatched("hit") == 2 and m.settled("matched") == 2, m.text


def test_reset_after_the_payload_was_sent_counts_as_delivered(start_server):
    """A controller that reads its run and resets before its delayed ACK
    left: the broker saw the reset, not the ACK. The run is delivered, so
    the answer is true (offering it again could run it twice)."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "2000")
    runs = 5
    for i in range(runs):
        ctl = srv.park(controller_id=f"ctl_reset_{i}")
        delayed_acks(ctl)
        msg = make_message(run_id=f"run_reset_{i}")
        d = Conn(srv.port)
        d.send(dispatch_request(msg))
        assert read_payload(ctl) == msg
        ctl.close(rst=True)  # as HAProxy closes its server side
        r = d.read_response()
        assert r.status == 200 and r.json() == {"didWarmStart": True}, r
        d.close()
    m = srv.metrics()
    assert method(m, "reset_after_write") == runs, m.text
    assert method(m, "ack_event") == 0 and method(m, "poll_fallback") == 0, m.text
    assert m.get("pilotlight_confirm_total", outcome="reset") == 0, m.text
    assert m.dispatched("hit") == runs and m.settled("matched") == runs, m.text


@pytest.mark.parametrize("pad", [6_000, 900_000])
def test_reset_with_the_payload_partly_unsent_is_not_delivered(start_server, pad):
    """A run to a controller that never reads and whose window is small:
    part of it is never sent when the controller resets, so it cannot have
    been received. 6 KB fit the broker's socket buffer, so the unsent part
    waits in the kernel (what SIOCOUTQNSD tells); of ~900 KB most is still
    in the broker's own queue. No other poll waits: the answer is false."""
    srv = start_server("--delivery", "confirm", "--max-body-bytes", BIG_BODY_LIMIT)
    ctl = slow_reader(srv.port)
    ctl.sendall(build_request("GET", "/warm-start", poll_headers()))
    srv.wait_parked(1)
    msg = make_message(run_id="run_unsent")
    msg["run"]["padding"] = "x" * pad
    d = Conn(srv.port)
    d.send(dispatch_request(msg))
    ctl.settimeout(10)
    assert ctl.recv(1, socket.MSG_PEEK)  # the payload's first bytes arrived
    time.sleep(0.05)  # and the rest is written as far as the window allows
    reset_close(ctl)
    r = d.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": False}, r
    m = srv.metrics()
    assert method(m, "reset_after_write") == 0, m.text
    assert m.get("pilotlight_confirm_total", outcome="reset") == 1, m.text
    assert m.dispatched("miss") == 1 and m.settled("disconnect") == 1, m.text
    # the broker is unharmed: the next run is delivered
    w = srv.park()
    assert srv.dispatch(EXAMPLE) is True
    assert read_payload(w) == EXAMPLE
