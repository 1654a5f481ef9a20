"""delivery = confirm while the operator stops or upgrades the server: a
run written to a controller whose ACK has not come yet is still answered
truthfully to its dispatcher, by the process that wrote it."""
import signal
import socket
import time

from conftest import BIN, Conn, ConnectionClosed, make_message, poll_headers, read_payload
from test_confirm_ack import methods, runs_on_one_connection
from test_confirm_edges import dispatch_request
from test_faults import BIG_BODY_LIMIT, cpu_seconds
from test_upgrade import ledger_adds_up, logged, stop_adopted, wait_logged

PAD = 900_000  # far more than a 4 KiB window takes: the ACK waits for reads


def pending_delivery(srv, run_id):
    """A controller that does not read, a run dispatched to it; returns
    (controller Conn, dispatcher Conn, message) once the run's first bytes
    reached the controller."""
    ctl = Conn(srv.port, rcvbuf=4096)
    ctl.request("GET", "/warm-start", poll_headers())
    srv.wait_parked(1)
    msg = make_message(run_id=run_id)
    msg["run"]["padding"] = "x" * PAD
    d = Conn(srv.port)
    d.send(dispatch_request(msg))
    assert ctl.sock.recv(1, socket.MSG_PEEK)
    return ctl, d, msg


def true_once_read(ctl, d, msg, quiet):
    """The dispatcher hears nothing for <quiet> seconds; once the controller
    reads its whole run, true. Closes both."""
    assert d.silent_for(quiet)
    assert read_payload(ctl) == msg
    r = d.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    ctl.close()
    d.close()


def test_sigterm_waits_for_a_pending_delivery(start_server):
    """SIGTERM while the run waits for its ACK: the drain leaves that
    controller's connection open until the ACK comes (it reads late), and
    the dispatcher hears true then, before the process exits."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "5000",
                       "--shutdown-timeout-ms", "8000", "--max-body-bytes", BIG_BODY_LIMIT)
    ctl, d, msg = pending_delivery(srv, "run_term")
    srv.sigterm()
    time.sleep(0.3)
    true_once_read(ctl, d, msg, quiet=0.1)
    assert srv.wait_exit() == 0


def test_upgrade_leaves_a_pending_delivery_with_the_old_process(start_server, subreaper):
    """SIGUSR2 while the run waits for its ACK: the connection is not
    handed over, the old process answers true once the controller reads,
    and only then exits."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "5000",
                       "--max-body-bytes", BIG_BODY_LIMIT, "--upgrade-binary", BIN)
    ctl, d, msg = pending_delivery(srv, "run_up")
    srv.proc.send_signal(signal.SIGUSR2)
    new = wait_logged(srv, "upgrade: adopted")[-1]["pid"]
    true_once_read(ctl, d, msg, quiet=0.2)
    assert srv.wait_exit(timeout=30) == 0
    old = logged(srv, "ledger")[0]  # the old process's: it exited first
    assert ledger_adds_up(old) and old["settled"]["matched"] == 1, old
    assert old["settled"]["handed_over"] == 0, old
    stop_adopted(srv, new)


def test_a_controller_that_half_closes_before_its_ack_gets_no_run(start_server):
    """The controller sends its EOF while the run is still in flight to it:
    the broker answers false, so the run must not reach it. Its connection
    is reset, not closed: a plain close would let the kernel send the rest
    of the payload after the dispatcher heard false."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "5000",
                       "--max-body-bytes", BIG_BODY_LIMIT)
    ctl, d, msg = pending_delivery(srv, "run_half")
    ctl.sock.shutdown(socket.SHUT_WR)
    r = d.read_response()
    assert r.status == 200 and r.json() == {"didWarmStart": False}, r
    got = ctl.wait_closed()
    assert 0 < len(got) < PAD, len(got)
    m = srv.metrics()
    assert m.get("pilotlight_confirm_total", outcome="unsent") == 1, m.text
    assert m.settled("disconnect") == 1 and m.settled("matched") == 0, m.text


def test_the_shutdown_deadline_resets_an_unconfirmed_delivery(start_server):
    """SIGTERM with a run awaiting an ACK that never comes: at the shutdown
    deadline the controller's connection is reset and the dispatcher hears
    false or nothing, never true, and the run does not arrive whole."""
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "30000",
                       "--shutdown-timeout-ms", "500", "--max-body-bytes", BIG_BODY_LIMIT)
    ctl, d, msg = pending_delivery(srv, "run_deadline")
    srv.sigterm()
    try:
        r = d.read_response(timeout=10)
        assert r.status == 200 and r.json() == {"didWarmStart": False}, r
    except ConnectionClosed:
        pass
    assert srv.wait_exit() == 0
    got = ctl.wait_closed()
    assert len(got) < PAD, len(got)


def test_confirm_across_an_upgrade(start_server, subreaper):
    """A controller whose socket already asks for ACK reports (three runs on
    it, then parked again) is handed to the new process, which confirms its
    next runs by reports of its own: true, each payload arrives, and the
    new process does not spin on the socket's error queue."""
    srv = start_server("--delivery", "confirm", "--upgrade-binary", BIN)
    ctl = runs_on_one_connection(srv, 3, "up")
    ctl.request("GET", "/warm-start", poll_headers(controller_id="ctl_up"))
    srv.wait_parked(1)
    srv.proc.send_signal(signal.SIGUSR2)
    new = wait_logged(srv, "upgrade: adopted")[-1]["pid"]
    assert srv.wait_exit(timeout=30) == 0
    try:
        for i in range(2):
            if i:
                ctl.request("GET", "/warm-start", poll_headers(controller_id="ctl_up"))
            srv.wait_parked(1)
            msg = make_message(run_id=f"run_after_upgrade_{i}")
            assert srv.dispatch(msg) is True
            assert read_payload(ctl) == msg
        m = srv.metrics()
        got = methods(m)
        assert got["ack_event"] >= 1 and got["poll_fallback"] == 0, m.text
        assert got["ack_event"] + got["next_request"] == 2, m.text
        assert m.get("pilotlight_confirm_total", outcome="acked") == 2, m.text
        before = cpu_seconds(new)
        time.sleep(0.5)
        assert cpu_seconds(new) - before <= 0.1, "the new process spins while idle"
    finally:
        ctl.close()
        stop_adopted(srv, new)
