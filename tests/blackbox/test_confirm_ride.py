"""delivery = confirm with a controller whose ACK comes with its next poll:
once one ACK report has arrived together with a request, the connection's
writes ask for no more reports (no recvmsg, no extra wake-up per delivery)
and each run is confirmed by the next poll; a controller that then stops
re-polling is confirmed by looking, and asked for reports again.

The controller's kernel is put in delayed-ACK mode (TCP_QUICKACK off), so
its ACK waits for its next request instead of leaving at once. Which path
confirms a given run is a race the machine's speed decides (a server slow
enough runs its late check before it reads the request that carries the
ACK), so these tests check that every run is confirmed, and count the
writes that asked the kernel for a report (the LD_PRELOAD shim's log);
how exactly each ACK is learnt is the record machine's unit test
(tests/unit/test_confirm.c)."""
import json
import socket

from conftest import Conn, make_message, poll_headers, read_payload
from test_confirm_ack import shim_env


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


def confirmed(m, runs):
    """Every run confirmed true, each by one path."""
    got = methods(m)
    learnt = sum(got.values()) + m.get("pilotlight_confirm_method_total", method="late_check") + \
        m.get("pilotlight_confirm_method_total", method="next_turn")
    assert learnt == runs, m.text
    assert m.get("pilotlight_confirm_total", outcome="acked") == runs, m.text
    assert m.dispatched("hit") == runs and m.settled("matched") == runs, m.text
    return got


def test_ack_with_the_next_poll_needs_no_more_reports(start_server, tmp_path):
    """Ten runs to a controller that polls again at once: every one true;
    once a report came with its next request, no write asks for another, so
    the kernel is asked for fewer reports than there were runs (unless the
    server was too slow to ever see a report come with a request, which its
    late checks then show)."""
    log = tmp_path / "requests"
    srv = start_server("--delivery", "confirm", env=shim_env(PL_ACK_REQUEST_LOG=str(log)))
    ctl, disp = Conn(srv.port), Conn(srv.port)
    park(srv, ctl)
    runs = 10
    for i in range(runs):
        assert deliver(srv, ctl, disp, f"run_ride_{i}") is True
        srv.wait_parked(1)
    m = srv.metrics()
    got = confirmed(m, runs)
    asked = log.stat().st_size if log.exists() else 0
    late = m.get("pilotlight_confirm_method_total", method="late_check")
    assert 1 <= asked <= runs, asked
    assert asked < runs or late > 0, (asked, got, m.text)
    if asked < runs:
        assert got["next_request"] >= 1, got
    ctl.close()
    disp.close()


def test_a_controller_that_stops_repolling_is_looked_for_then_reported(start_server,
                                                                       tmp_path):
    """It rides, then reads a run and says nothing: that run is still true
    (looked for once its delayed ACK has left), and the connection's next
    write asks for a report again."""
    log = tmp_path / "requests"
    srv = start_server("--delivery", "confirm", env=shim_env(PL_ACK_REQUEST_LOG=str(log)))
    ctl, disp = Conn(srv.port), Conn(srv.port)
    park(srv, ctl)
    for i in range(3):
        assert deliver(srv, ctl, disp, f"run_riding_{i}") is True
        srv.wait_parked(1)
    assert deliver(srv, ctl, disp, "run_silent", repoll=False) is True
    before = log.stat().st_size if log.exists() else 0
    park(srv, ctl)
    msg = make_message(run_id="run_reported")
    assert srv.dispatch(msg) is True
    assert read_payload(ctl) == msg
    after = log.stat().st_size if log.exists() else 0
    # the write after a silent run asks for a report (riding is over)
    assert after == before + 1, (before, after)
    confirmed(srv.metrics(), 5)
    ctl.close()
    disp.close()
