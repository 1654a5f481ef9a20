"""delivery = confirm learns, from the ACKs it sees, when a delivery is late
(the moment it asks the kernel how the run is doing). What slow readers
teach it must not hurt anyone else: after a train of controllers that read
slowly but finish, on other keys, a run stuck behind a controller that
cannot take it still moves to the live poll behind it, as on a fresh
server, and a controller that never reads is still answered false within
confirm_timeout_ms + confirm_wait_max_ms."""
import threading
import time

from conftest import Conn, build_request, make_message, poll_headers, read_payload, reset_close
from test_confirm_edges import dispatch_request
from test_faults import BIG_BODY_LIMIT

TIMEOUT_MS = 1000
WAIT_MAX_MS = 1000
# The documented bound, and room for a sanitized build on a busy machine.
BOUND_S = (TIMEOUT_MS + WAIT_MAX_MS) / 1000
SLACK_S = 1.5


def start(start_server):
    return start_server("--delivery", "confirm", "--max-body-bytes", BIG_BODY_LIMIT,
                        "--confirm-timeout-ms", str(TIMEOUT_MS),
                        "--confirm-wait-max-ms", str(WAIT_MAX_MS))


def padded(run_id, deployment, pad):
    m = make_message(deployment=deployment, run_id=run_id)
    m["run"]["padding"] = "x" * pad
    return m


def read_slowly(sock, chunk, pause, done):
    """Reads <sock> <chunk> bytes at a time, <pause> s apart, until the
    response's body is whole or the peer ends; sets <done>."""
    got = b""
    sock.settimeout(10)
    try:
        while True:
            part = sock.recv(chunk)
            if not part:
                break
            got += part
            head, sep, body = got.partition(b"\r\n\r\n")
            if sep:
                length = [int(v) for k, v in (ln.split(b":", 1) for ln in head.split(b"\r\n")[1:])
                          if k.strip().lower() == b"content-length"]
                if length and len(body) >= length[0]:
                    break
            time.sleep(pause)
    except OSError:
        pass
    done.set()


def train(srv, rounds):
    """Delivers runs to controllers whose receive buffer is small and who
    read slowly but finish: the ACKs of the small runs (what confirm learns
    from) come some 100 ms to a second late, the large runs take seconds.
    Each on a key of its own."""
    for i in range(rounds):
        small = i % 2 == 0
        pad, chunk, pause = (7_000, 256, 0.03) if small else (256_000, 16_384, 0.04)
        ctl = Conn(srv.port, rcvbuf=2048).sock
        ctl.sendall(build_request("GET", "/warm-start", poll_headers(deployment=f"dep_train_{i}")))
        srv.wait_parked(1)
        done = threading.Event()
        d = Conn(srv.port, timeout=BOUND_S + 10)
        d.send(dispatch_request(padded(f"run_train_{i}", f"dep_train_{i}", pad)))
        t = threading.Thread(target=read_slowly, args=(ctl, chunk, pause, done), daemon=True)
        t.start()
        r = d.read_response()
        assert r.status == 200, r
        done.wait(30)
        t.join(5)
        ctl.close()
        d.close()
    srv.wait_parked(0)


def stuck_then_live(srv, tag):
    """A controller that cannot take a 256 KB run (a small window, never
    read) parked first, a live one behind it on the same key, reading as
    the run comes: the run must reach the live one and the answer be true."""
    dep = f"dep_stuck_{tag}"
    stuck = Conn(srv.port, rcvbuf=2048).sock
    stuck.sendall(build_request("GET", "/warm-start", poll_headers(deployment=dep)))
    srv.wait_parked(1)
    live = srv.park(deployment=dep)
    got = {}
    reader = threading.Thread(target=lambda: got.update(read_payload(live, timeout=BOUND_S + 10)),
                              daemon=True)
    reader.start()
    d = Conn(srv.port, timeout=BOUND_S + 10)
    t0 = time.monotonic()
    d.send(dispatch_request(padded(f"run_stuck_{tag}", dep, 256_000)))
    r = d.read_response()
    took = time.monotonic() - t0
    reader.join(BOUND_S + 10)
    assert r.status == 200 and r.json() == {"didWarmStart": True}, (tag, r)
    assert got.get("run", {}).get("friendlyId") == f"run_stuck_{tag}", tag
    reset_close(stuck)
    d.close()
    srv.wait_parked(0)
    return took


def never_reads(srv, tag):
    """A controller that never reads a 256 KB run, alone on its key: false,
    within the documented bound."""
    dep = f"dep_never_{tag}"
    ctl = Conn(srv.port, rcvbuf=2048).sock
    ctl.sendall(build_request("GET", "/warm-start", poll_headers(deployment=dep)))
    srv.wait_parked(1)
    d = Conn(srv.port, timeout=BOUND_S + 30)
    t0 = time.monotonic()
    d.send(dispatch_request(padded(f"run_never_{tag}", dep, 256_000)))
    r = d.read_response()
    took = time.monotonic() - t0
    assert r.status == 200 and r.json() == {"didWarmStart": False}, (tag, r)
    reset_close(ctl)
    d.close()
    srv.wait_parked(0)
    return took


def test_slow_readers_teach_nothing_that_hurts_others(start_server):
    srv = start(start_server)
    fresh_move = stuck_then_live(srv, "fresh")
    fresh_never = never_reads(srv, "fresh")
    train(srv, 6)
    trained_move = stuck_then_live(srv, "trained")
    trained_never = never_reads(srv, "trained")
    print(f"\nstuck run moved: {fresh_move:.2f} s fresh, {trained_move:.2f} s trained; "
          f"never-reader answered: {fresh_never:.2f} s fresh, {trained_never:.2f} s trained")
    assert trained_never <= BOUND_S + SLACK_S, trained_never
    m = srv.metrics()
    assert m.dispatched("hit") >= 2 and m.settled("matched") >= 2, m.text
    # the stuck runs were taken back, never delivered twice
    assert m.get("pilotlight_confirm_total", outcome="redelivered") == 2, m.text
