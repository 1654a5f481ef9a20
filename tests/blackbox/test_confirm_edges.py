"""delivery = confirm at the edges of a connection's life: a dispatcher that
half-closes while its answer waits for the controller's ACK, one that is
gone before its run is handed over, and a controller that resets its
connection before its ACK was seen.

Each controller's kernel is put in delayed-ACK mode (TCP_QUICKACK off), so
its ACK leaves some 40 ms after the payload arrives: the half-close or the
reset reliably comes first, as it would behind HAProxy whenever its ACK is
delayed."""
import json
import signal
import socket
import struct
import time

import pytest

from conftest import (Conn, EXAMPLE, build_request, make_message, poll_headers, read_payload,
                      reset_close)
from test_confirm_ride import delayed_acks
from test_faults import BIG_BODY_LIMIT, slow_reader


def method(m, name):
    return m.get("pilotlight_confirm_method_total", method=name)


def wait_stopped(pid):
    """Until the process <pid> is stopped (a signal is delivered a moment
    after it is sent)."""
    for _ in range(500):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.002)
    raise AssertionError(f"process {pid} did not stop")


def dispatch_request(msg):
    return build_request("POST", "/warm-start", {"Content-Type": "application/json"},
                         json.dumps({"dequeuedMessage": msg}))


def test_half_closed_dispatcher_gets_its_confirmed_answer(start_server):
    """A dispatcher that half-closes once its run is on its way (the
    controller has the payload, its ACK delayed): the EOF is read before
    the run is confirmed, and the answer still comes, true, before the
    connection ends."""
    srv = start_server("--delivery", "confirm")
    ctl = srv.park(controller_id="ctl_half")
    delayed_acks(ctl)
    msg = make_message(run_id="run_half")
    d = Conn(srv.port)
    d.send(dispatch_request(msg))
    assert read_payload(ctl) == msg
    d.sock.shutdown(socket.SHUT_WR)
    r = d.read_response()
    assert (r.status, r.json()) == (200, {"didWarmStart": True})
    assert d.wait_closed(timeout=3) == b""
    m = srv.metrics()
    assert m.get("pilotlight_confirm_total", outcome="acked") == 1, m.text
    assert m.dispatched("hit") == 1 and m.settled("matched") == 1, m.text


@pytest.mark.parametrize("ending", ["fin", "rst"])
def test_a_dispatch_whose_sender_has_gone_is_not_delivered(start_server, ending):
    """A dispatch whose connection ended before its run was handed over
    (the request and the FIN, or a reset, arrive together): the supervisor
    gave up and cold-starts the run itself, so nobody gets it; the poll
    stays parked for the next run, and the dispatch is counted abandoned.
    A half-closed sender still hears false."""
    srv = start_server("--delivery", "confirm")
    ctl = srv.park(controller_id="ctl_stale")
    stale = make_message(run_id="run_stale")
    d = Conn(srv.port)
    # Both reach the socket before the broker reads either, as when its
    # loop was held up: stopped, the process cannot read in between.
    srv.proc.send_signal(signal.SIGSTOP)
    try:
        wait_stopped(srv.proc.pid)
        d.sock.sendall(dispatch_request(stale))
        time.sleep(0.05)
        if ending == "fin":
            d.sock.shutdown(socket.SHUT_WR)
        else:
            d.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            d.sock.close()
        time.sleep(0.05)
    finally:
        srv.proc.send_signal(signal.SIGCONT)
    if ending == "fin":
        r = d.read_response()
        assert (r.status, r.json()) == (200, {"didWarmStart": False})
    m = srv.wait_metrics(lambda m: m.dispatched("abandoned") == 1, what="the abandoned dispatch")
    assert m.dispatched("hit") == 0 and m.parked_now == 1, m.text
    assert ctl.silent_for(0.2)
    fresh = make_message(run_id="run_fresh")
    assert srv.dispatch(fresh) is True
    assert read_payload(ctl) == fresh


def test_reset_after_the_payload_was_sent_is_false_and_not_offered_again(start_server):
    """A controller that takes its run and resets before its delayed ACK
    left: the broker saw the reset, not the ACK. Whether the run was read is
    unknown: it is offered to no other poll (it may have been read) and the
    answer is false (a reader that took it would have closed with a FIN
    acknowledging it)."""
    srv = start_server("--delivery", "confirm")
    runs = 5
    for i in range(runs):
        ctl = srv.park(controller_id=f"ctl_reset_{i}")
        delayed_acks(ctl)
        spare = srv.park(controller_id=f"ctl_spare_{i}")  # next in line (fifo)
        msg = make_message(run_id=f"run_reset_{i}")
        d = Conn(srv.port)
        d.send(dispatch_request(msg))
        assert read_payload(ctl) == msg
        ctl.close(rst=True)  # as HAProxy closes its server side
        r = d.read_response()
        assert r.status == 200 and r.json() == {"didWarmStart": False}, r
        d.close()
        assert spare.silent_for(0.05)  # not offered again
        spare.close()
        srv.wait_parked(0)
    m = srv.metrics()
    assert m.get("pilotlight_confirm_total", outcome="reset_after_send") == runs, m.text
    assert m.get("pilotlight_confirm_total", outcome="redelivered") == 0, m.text
    assert m.dispatched("unconfirmed") == runs and m.dispatched("hit") == 0, m.text
    assert m.settled("disconnect") >= runs, m.text


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
    assert m.get("pilotlight_confirm_total", outcome="unsent") == 1, m.text
    # the poll ended once: by the reset, or by the broker giving up on a
    # socket that stopped taking bytes, whichever it saw first
    assert m.dispatched("miss") == 1, m.text
    assert m.settled("disconnect") + m.settled("aborted") == 1, m.text
    # the broker is unharmed: the next run is delivered
    w = srv.park()
    assert srv.dispatch(EXAMPLE) is True
    assert read_payload(w) == EXAMPLE
