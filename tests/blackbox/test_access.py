"""Who may dispatch, and the switch that turns warm starts off.

dispatch_allow: a dispatch, /metrics or /debug/waiters from an address it
does not name gets 403, counted, and changes nothing (the parked poll stays
parked, no run goes anywhere); from an address it names, everything works;
a reload changes the list. warm_starts = off by SIGHUP: /connect answers
0 and 0, parked polls are answered 503 at once, new polls 503, dispatches
false at once; on again: warm starts as before, no restart, the ledger
whole."""
import json
import socket

from conftest import (HOST, Conn, build_request, make_message, poll_headers, read_payload,
                      run_binary, scrape)
from test_reload import hup, write_conf


def from_address(port, source, raw, timeout=5.0):
    """Sends <raw> to 127.0.0.1:<port> from the loopback address <source>;
    returns the Conn to read the answer from."""
    c = Conn.__new__(Conn)
    c.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.sock.bind((source, 0))
    c.sock.settimeout(timeout)
    c.sock.connect((HOST, port))
    c.buf, c.eof, c.timeout = b"", False, timeout
    c.send(raw)
    return c


def dispatch_raw_from(port, source, msg):
    body = json.dumps({"dequeuedMessage": msg}).encode()
    return from_address(port, source, build_request(
        "POST", "/warm-start", {"Content-Type": "application/json"}, body)).read_response()


def test_dispatch_allow_refuses_other_addresses_and_changes_nothing(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, dispatch_allow="127.0.0.1/32, ::1")
    s = start_server("--config", str(conf), "--listen", "0.0.0.0:0")
    poll = s.park()
    msg = make_message(run_id="run_allow_1")
    # From 127.0.0.2: refused, nothing delivered, nothing counted but the 403.
    for path in ("/metrics", "/debug/waiters"):
        r = from_address(s.port, "127.0.0.2", build_request("GET", path)).read_response()
        assert r.status == 403 and "dispatch_allow" in r.json()["error"], (path, r)
    r = dispatch_raw_from(s.port, "127.0.0.2", msg)
    assert r.status == 403 and "dispatch_allow" in r.json()["error"], r
    assert poll.silent_for(0.2)
    m = s.metrics()  # from 127.0.0.1: allowed
    assert m.get("pilotlight_forbidden_total") == 3, m.text
    assert m.parked_now == 1 and sum(m.dispatched(k) for k in ("hit", "miss")) == 0, m.text
    # Polls and the probes are anyone's.
    r = from_address(s.port, "127.0.0.2", build_request("GET", "/connect")).read_response()
    assert r.status == 200
    # From an allowed address the run goes through.
    r = dispatch_raw_from(s.port, "127.0.0.1", msg)
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    assert read_payload(poll) == msg
    # A reload that names 127.0.0.2 lets it in; one that drops 127.0.0.1 keeps it out.
    write_conf(conf, dispatch_allow="127.0.0.2")
    hup(s)
    r = from_address(s.port, "127.0.0.2", build_request("GET", "/metrics")).read_response()
    assert r.status == 200
    r = from_address(s.port, "127.0.0.1", build_request("GET", "/metrics")).read_response()
    assert r.status == 403
    write_conf(conf)
    hup(s)


def test_dispatch_allow_refuses_a_malformed_list():
    for bad in ("10.0.0.1/8", "10.0.0.0/33", "not-an-address", "10.0.0.0/8,", "::1/129",
                "10.0.0.0/08"):
        rc, out, err = run_binary("--dispatch-allow", bad, "--check-config")
        assert rc == 2 and "dispatch_allow" in err, (bad, rc, err)
    rc, out, err = run_binary("--dispatch-allow", "10.0.0.0/8, fd00::/8 ,192.168.1.7",
                                  "--check-config")
    assert rc == 0 and "dispatch_allow = 10.0.0.0/8, fd00::/8 ,192.168.1.7" in out, err


def connect_body(s):
    r = s.get("/connect")
    assert r.status == 200
    return r.json()


def test_warm_starts_off_and_on_again_by_reload(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, warm_starts="on")
    s = start_server("--config", str(conf))
    on = connect_body(s)
    assert on["connectionTimeoutMs"] > 0 and on["keepaliveMs"] > 0
    polls = [s.park(controller_id=f"ctl_off_{i}") for i in range(3)]
    s.wait_parked(3)
    write_conf(conf, warm_starts="off")
    hup(s)
    # Every parked poll is answered 503 at once: its client gets no run and
    # stops waiting for one.
    for p in polls:
        r = p.read_response(timeout=5)
        assert r.status == 503 and "warm_starts" in r.json()["error"], r
    assert connect_body(s) == {"connectionTimeoutMs": 0, "keepaliveMs": 0}
    c = s.conn()
    c.request("GET", "/warm-start", poll_headers(controller_id="ctl_late"))
    r = c.read_response(timeout=5)
    assert r.status == 503
    assert s.dispatch(make_message(run_id="run_off")) is False
    m = s.metrics()
    assert m.parked_now == 0 and m.settled("rejected") == 3, m.text
    assert m.dispatched("off") == 1 and m.dispatched("miss") == 0, m.text
    # On again: the same as before, no restart.
    write_conf(conf, warm_starts="on")
    hup(s)
    assert connect_body(s) == on
    p = s.park(controller_id="ctl_back")
    msg = make_message(run_id="run_back")
    assert s.dispatch(msg) is True
    assert read_payload(p) == msg
    m = s.metrics()
    assert m.dispatched("hit") == 1 and m.settled("matched") == 1, m.text


def test_warm_starts_off_from_the_start(start_server):
    s = start_server("--warm-starts", "off")
    assert connect_body(s) == {"connectionTimeoutMs": 0, "keepaliveMs": 0}
    assert s.dispatch(make_message(run_id="run_never")) is False
    assert scrape(s.port).dispatched("off") == 1
