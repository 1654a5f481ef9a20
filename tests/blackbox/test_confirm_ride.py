"""delivery = confirm with a controller whose ACK comes with its next poll:
once one ACK report has arrived together with a request, the connection's
writes ask for no more reports (no recvmsg, no extra wake-up per delivery)
and each run is confirmed by the next poll; a controller that then stops
re-polling is confirmed by polling, and asked for reports again.

The controller's kernel is put in delayed-ACK mode (TCP_QUICKACK off), so
its ACK waits for its next request instead of leaving at once."""
import json
import socket
import time

from conftest import Conn, make_message, poll_headers, read_payload


def methods(m):
    return {k: m.get("pilotlight_confirm_method_total", method=k)
            for k in ("ack_event", "poll_fallback", "next_request")}


def delayed_acks(conn):
    # Cleared again by the kernel after a while; set before each read.
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)


def deliver(srv, ctl, disp, run_id, repoll=True):
    """One run to the parked <ctl>; with <repoll> the controller parks again
    the moment it has the payload. Returns didWarmStart."""
    msg = make_message(run_id=run_id)
    disp.request("POST", "/warm-start", {"Content-Type": "application/json"},
                 json.dumps({"dequeuedMessage": msg}))
    delayed_acks(ctl)
    assert read_payload(ctl) == msg
    if repoll:
        delayed_acks(ctl)
        ctl.request("GET", "/warm-start", poll_headers(controller_id="ctl_ride"))
    r = disp.read_response()
    assert r.status == 200, r
    return r.json()["didWarmStart"]


def park(srv, ctl):
    delayed_acks(ctl)
    ctl.request("GET", "/warm-start", poll_headers(controller_id="ctl_ride"))
    srv.wait_parked(1)


def test_ack_with_the_next_poll_needs_no_more_reports(start_server):
    srv = start_server("--delivery", "confirm")
    ctl, disp = Conn(srv.port), Conn(srv.port)
    park(srv, ctl)
    runs = 10
    for i in range(runs):
        assert deliver(srv, ctl, disp, f"run_ride_{i}") is True
        srv.wait_parked(1)
    m = srv.metrics()
    # the first run's report came with the next poll; every later run was
    # confirmed by its next poll, none by asking the kernel
    assert methods(m) == {"ack_event": 1, "poll_fallback": 0, "next_request": runs - 1}, m.text
    assert m.get("pilotlight_confirm_total", outcome="acked") == runs, m.text
    assert m.dispatched("hit") == runs and m.settled("matched") == runs, m.text
    ctl.close()
    disp.close()


def test_a_controller_that_stops_repolling_is_polled_then_reported(start_server):
    srv = start_server("--delivery", "confirm")
    ctl, disp = Conn(srv.port), Conn(srv.port)
    park(srv, ctl)
    for i in range(3):
        assert deliver(srv, ctl, disp, f"run_riding_{i}") is True
        srv.wait_parked(1)
    assert methods(srv.metrics())["next_request"] == 2
    # It reads this run and says nothing: no report was asked for, so only
    # asking the kernel (once its delayed ACK has left) can confirm it.
    t0 = time.monotonic()
    assert deliver(srv, ctl, disp, "run_silent", repoll=False) is True
    assert time.monotonic() - t0 < 2.0
    got = methods(srv.metrics())
    assert got == {"ack_event": 1, "poll_fallback": 1, "next_request": 2}, got
    # Its writes ask for reports again: the next run is confirmed by one.
    park(srv, ctl)
    msg = make_message(run_id="run_reported")
    assert srv.dispatch(msg) is True
    assert read_payload(ctl) == msg
    m = srv.metrics()
    assert methods(m) == {"ack_event": 2, "poll_fallback": 1, "next_request": 2}, m.text
    assert m.dispatched("hit") == 5 and m.settled("matched") == 5, m.text
    ctl.close()
    disp.close()
