"""SIGTERM: readyz turns 503 first, then parked polls are closed without a
response and the process exits 0."""

import socket
import time

import pytest

from conftest import EXAMPLE, HOST, Conn, get, make_message, poll_headers, read_payload


def test_sigterm_drains_parked_polls_without_response(start_server):
    s = start_server("--drain-delay-ms", "1000")
    polls = [s.park(deployment=f"deployment_d{i % 2}") for i in range(3)]
    s.wait_parked(3)
    assert s.get("/readyz").status == 200
    t0 = time.monotonic()
    s.sigterm()
    time.sleep(0.2)
    # During the drain delay: not ready, still healthy, still listening.
    r = get(s.port, "/readyz")
    assert r.status == 503, r
    assert get(s.port, "/healthz").status == 200
    assert time.monotonic() - t0 < 0.9, "too slow to check inside the drain delay"
    # Parked polls are not closed before the drain delay has passed.
    for p in polls:
        assert p.silent_for(0.01), "parked poll answered or closed during the drain delay"
    # Then every parked poll is closed with no response bytes at all.
    for p in polls:
        got = p.wait_closed(timeout=8)
        assert got == b"", f"parked poll got bytes at shutdown: {got[:200]!r}"
    assert time.monotonic() - t0 >= 0.9, "polls closed before drain_delay_ms"
    # The process exits 0 (checked again, with stderr, by the fixture).
    rc = s.wait_exit()
    assert rc == 0
    # The listener is closed.
    with pytest.raises(OSError):
        socket.create_connection((HOST, s.port), timeout=1).close()


def test_sigterm_without_drain_delay_exits_promptly_with_idle_connections(start_server):
    s = start_server("--shutdown-timeout-ms", "8000")
    parked = s.park()
    idle = s.conn()  # an idle keep-alive connection that has had one request
    idle.request("GET", "/healthz")
    assert idle.read_response().status == 200
    fresh = s.conn()  # a connection that never sent anything
    t0 = time.monotonic()
    s.sigterm()
    assert parked.wait_closed(timeout=5) == b""
    rc = s.wait_exit()
    elapsed = time.monotonic() - t0
    assert rc == 0
    assert elapsed < 3.0, f"exit took {elapsed:.2f}s: idle connections held shutdown"
    assert idle.wait_closed(timeout=1) == b""
    assert fresh.wait_closed(timeout=1) == b""


def test_drain_delay_answers_close_their_connections(start_server):
    """SIGTERM with a drain delay: every answer during the delay closes its
    connection, kept-alive ones included, so clients open new ones (which a
    load balancer sends elsewhere) and few are idle here, a request perhaps
    on its way, when the drain closes the rest. An idle connection is not
    closed before that (a request may be on its way on it); the parked
    polls stay until the delay is over."""
    s = start_server("--drain-delay-ms", "2000")
    idle = s.conn()
    idle.request("GET", "/healthz")
    assert idle.read_response().status == 200
    w = s.park()
    s.wait_parked(1)
    t0 = time.monotonic()
    s.sigterm()
    time.sleep(0.1)
    idle.request("GET", "/healthz")
    r = idle.read_response()
    assert r.status == 200 and r.headers.get("connection") == "close", r
    assert idle.wait_closed(timeout=1) == b""
    c = s.conn()
    c.request("GET", "/healthz")
    r = c.read_response()
    assert r.status == 200 and r.headers.get("connection") == "close", r
    assert c.wait_closed(timeout=1) == b""
    assert time.monotonic() - t0 < 1.5, "too slow to check inside the drain delay"
    assert w.silent_for(0.01), "parked poll answered or closed during the drain delay"
    assert w.wait_closed(timeout=8) == b""
    assert s.wait_exit() == 0


def test_sigint_also_drains(start_server):
    import signal
    s = start_server()
    p = s.park()
    s.proc.send_signal(signal.SIGINT)
    assert p.wait_closed(timeout=5) == b""
    assert s.wait_exit() == 0


def test_in_flight_request_finishes_during_drain(start_server):
    """A dispatch whose body is still arriving when SIGTERM comes is answered."""
    s = start_server("--drain-delay-ms", "300", "--shutdown-timeout-ms", "5000")
    c = s.conn()
    body = b'{"dequeuedMessage": {}}'
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body[:5])
    time.sleep(0.1)
    s.sigterm()
    time.sleep(0.5)  # past the drain delay: listener closed, request in flight
    with pytest.raises(OSError):
        socket.create_connection((HOST, s.port), timeout=1).close()
    c.send(body[5:])
    r = c.read_response()
    assert r.status == 400, r  # answered (the body is invalid), not dropped
    c.close()  # the server may linger for our EOF after its last response
    t0 = time.monotonic()
    assert s.wait_exit() == 0
    assert time.monotonic() - t0 < 1.5, "exit held up after the last connection closed"


def test_dispatch_during_drain_delay_still_matches(start_server):
    """Until the drain delay ends, parked polls are live and can be matched."""
    s = start_server("--drain-delay-ms", "1000")
    w = s.park()
    s.sigterm()
    time.sleep(0.2)
    assert s.dispatch() is True
    assert read_payload(w) == EXAMPLE
    assert s.wait_exit() == 0


def test_drain_finishes_an_answer_still_being_written(start_server):
    """delivery = written: a run larger than the kernel takes at once, to a
    controller that reads slowly, is answered true as soon as it is queued.
    A SIGTERM then must not cut it short: its run would be lost."""
    s = start_server("--delivery", "written", "--max-body-bytes", "8000000")
    ctl = Conn(s.port, rcvbuf=4096)
    ctl.request("GET", "/warm-start", poll_headers())
    s.wait_parked(1)
    msg = make_message(run_id="run_big")
    msg["run"]["padding"] = "x" * 6_000_000  # above the kernel's 4 MiB send buffer
    assert s.dispatch(msg) is True
    s.sigterm()
    time.sleep(0.3)  # drained: the listener is closed
    with pytest.raises(OSError):
        socket.create_connection((HOST, s.port), timeout=1).close()
    assert read_payload(ctl, timeout=20) == msg
    ctl.close()
    assert s.wait_exit() == 0
