"""Faults: resets, half-closes, readers that never read, the file-descriptor
limit, and a connection storm. Each test checks the server keeps serving,
leaks no waiter or connection, and keeps the ledger balanced. Figures (RSS,
CPU time, rates) are printed: run with -s to see them."""

import json
import os
import resource
import socket
import subprocess
import threading
import time

import pytest

import impair
from conftest import (BIN, EXAMPLE, HOST, Conn, ConnectionClosed, Server,
                      assert_ledger, build_request, clean_env, make_message,
                      poll_headers, read_payload, request, reset_close)

BIG_BODY_LIMIT = "2000000"
PAYLOAD_PAD = 900_000   # ~900 KB dequeuedMessage


# -- helpers ----------------------------------------------------------------------------

def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    raise AssertionError("no VmRSS")


def cpu_seconds(pid):
    """utime + stime of <pid>, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sanitized(pid):
    """True when the server runs under AddressSanitizer or valgrind: shadow
    memory and quarantine make RSS figures meaningless, so RSS bounds are not
    checked there (the figures are still printed)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return "libasan" in maps or "vgpreload" in maps


def report(what, **figures):
    print(f"\n[faults] {what}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


def slow_reader(port, rcvbuf=4096):
    """A connected socket with a tiny receive buffer that the test never
    reads from."""
    return Conn(port, timeout=5, rcvbuf=rcvbuf).sock


def big_message(run_id):
    m = make_message(run_id=run_id)
    m["run"]["padding"] = "x" * PAYLOAD_PAD
    return m


def big_dispatch_body(run_id):
    return json.dumps({"dequeuedMessage": big_message(run_id)}).encode()


def timed_dispatch(conn, body):
    """POSTs <body> on <conn>; returns (didWarmStart, seconds)."""
    t0 = time.monotonic()
    conn.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
    r = conn.read_response()
    took = time.monotonic() - t0
    assert r.status == 200, r
    return r.json()["didWarmStart"], took


def timed_healthz(port):
    t0 = time.monotonic()
    r = request(port, "GET", "/healthz", timeout=2.0)
    took = time.monotonic() - t0
    assert r.status == 200, r
    return took


def wait_connections(s, n, timeout=5.0):
    return s.wait_metrics(lambda m: m.get("pilotlight_connections_open") <= n, timeout,
                          f"connections_open <= {n}")


# -- resets -------------------------------------------------------------------------------

def test_rst_on_parked_poll_settles_as_disconnect(server):
    w = server.park()
    reset_close(w.sock)
    m = server.wait_metrics(lambda m: m.settled("disconnect") == 1, what="disconnect")
    assert m.parked_now == 0 and m.keys_now == 0, m.text
    assert server.dispatch() is False
    wait_connections(server, 1)
    assert_ledger(server.port)


def test_rst_while_large_payloads_are_queued(start_server):
    """A controller polls again after each run and never reads; 4 ~900 KB
    payloads are dispatched to it (queued in the kernel and in the server),
    then it resets. Every dispatch answers at once, the 5th poll settles as
    a disconnect, the queued bytes are freed, nothing else is disturbed.
    Under delivery = written, where a socket taking the bytes is true:
    under confirm a controller that reads nothing is not, and its next
    poll is not read while its run waits (test_confirm_edges). (Each poll
    is sent on its own: more than one small request pipelined behind a
    parked poll is dropped, test_hardening.)"""
    s = start_server("--max-body-bytes", BIG_BODY_LIMIT, "--delivery", "written")
    pid = s.proc.pid
    rss0 = rss_kb(pid)
    reader = slow_reader(s.port)
    d = s.conn()
    times = []
    for i in range(4):
        reader.sendall(build_request("GET", "/warm-start",
                                     poll_headers(controller_id=f"controller_q{i}")))
        s.wait_parked(1)
        hit, took = timed_dispatch(d, big_dispatch_body(f"run_q{i}"))
        assert hit is True
        times.append(took)
    reader.sendall(build_request("GET", "/warm-start", poll_headers(controller_id="controller_q4")))
    s.wait_parked(1)
    rss_queued = rss_kb(pid)
    reset_close(reader)
    m = s.wait_metrics(lambda m: m.settled("disconnect") == 1, what="disconnect")
    assert (m.parked_now, m.settled("matched")) == (0, 4), m.text
    d.close()
    wait_connections(s, 1)
    time.sleep(0.1)
    rss_after = rss_kb(pid)
    report("RST with 4 x 900 KB queued", rss_before_kb=rss0, rss_queued_kb=rss_queued,
           rss_after_rst_kb=rss_after, slowest_dispatch_s=round(max(times), 4))
    assert max(times) < 1.0, times
    assert timed_healthz(s.port) < 0.5
    assert s.dispatch() is False


def test_dispatcher_rst_mid_body_dispatches_nothing(server):
    w = server.park()
    body = json.dumps({"dequeuedMessage": EXAMPLE}).encode()
    c = Conn(server.port)
    c.send(b"POST /warm-start HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
    time.sleep(0.1)
    reset_close(c.sock)
    wait_connections(server, 2)  # the parked poll and the scrape
    m = assert_ledger(server.port)
    assert (m.parked_now, m.settled("matched")) == (1, 0), m.text
    assert m.sum("pilotlight_dispatch_total") == 0, m.text
    assert w.silent_for(0.1), "the parked poll got something from a half-sent dispatch"
    msg = make_message(run_id="run_after_rst")
    assert server.dispatch(msg) is True
    assert read_payload(w) == msg


def test_dispatcher_rst_right_after_request(server):
    """The dispatcher resets before reading its answer. The run is either
    delivered (matched) or not taken at all (still parked); both are
    consistent, and the server carries on."""
    w = server.park()
    c = Conn(server.port)
    c.request("POST", "/warm-start", {"Content-Type": "application/json"},
              json.dumps({"dequeuedMessage": EXAMPLE}))
    reset_close(c.sock)
    wait_connections(server, 2)  # the poll's connection and the scrape
    m = assert_ledger(server.port)
    assert (m.parked_now, m.settled("matched")) in ((0, 1), (1, 0)), m.text
    if m.parked_now == 0:
        assert read_payload(w) == EXAMPLE
        report("dispatcher RST after request", outcome="delivered")
    else:
        assert server.dispatch() is True
        assert read_payload(w) == EXAMPLE
        report("dispatcher RST after request", outcome="not taken")


# -- half-close ------------------------------------------------------------------------------

def test_half_close_while_parked_is_a_disconnect(server):
    """shutdown(SHUT_WR) on a parked poll: the server takes the EOF as the
    controller leaving: closes without an answer, records a disconnect,
    and a dispatch for the key misses."""
    w = server.park()
    w.sock.shutdown(socket.SHUT_WR)
    assert w.wait_closed(timeout=3) == b""
    m = server.wait_metrics(lambda m: m.settled("disconnect") == 1, what="disconnect")
    assert (m.parked_now, m.keys_now, m.parked_total) == (0, 0, 1), m.text
    assert server.dispatch() is False
    wait_connections(server, 1)
    assert_ledger(server.port)


def test_half_close_after_requests_still_gets_the_answers(server):
    """A client that half-closes right after its (pipelined) requests still
    gets every answer, then the connection ends. (A dispatch among them
    would be answered false: its sender's FIN is there before its run is
    handed over, test_confirm_edges.)"""
    c = Conn(server.port)
    c.send(build_request("GET", "/healthz") * 2 + build_request("GET", "/connect"))
    c.sock.shutdown(socket.SHUT_WR)
    assert c.read_response().status == 200
    assert c.read_response().status == 200
    r = c.read_response()
    assert r.status == 200 and r.json()["connectionTimeoutMs"] == 30000, r
    assert c.wait_closed(timeout=3) == b""
    wait_connections(server, 1)  # the scrape


# -- readers that never read --------------------------------------------------------------------

def test_controller_that_never_reads_a_large_payload(start_server):
    """A ~900 KB payload to a controller that never reads: the dispatch is
    answered at once (delivery = written: a live socket took the bytes) and
    the server keeps serving while the bytes wait."""
    s = start_server("--max-body-bytes", BIG_BODY_LIMIT, "--delivery", "written")
    pid = s.proc.pid
    reader = slow_reader(s.port)
    try:
        reader.sendall(build_request("GET", "/warm-start", poll_headers()))
        s.wait_parked(1)
        rss0 = rss_kb(pid)
        d = s.conn()
        hit, took = timed_dispatch(d, big_dispatch_body("run_never_read"))
        assert hit is True
        rss_stuck = rss_kb(pid)
        health = max(timed_healthz(s.port) for _ in range(5))
        m = assert_ledger(s.port)
        assert m.settled("matched") == 1, m.text
        d.close()
        time.sleep(0.1)
        rss_dispatcher_gone = rss_kb(pid)
    finally:
        reset_close(reader)
    wait_connections(s, 1)
    time.sleep(0.1)
    rss_end = rss_kb(pid)
    report("controller never reads 900 KB", dispatch_s=round(took, 4),
           healthz_max_s=round(health, 4), rss_before_kb=rss0, rss_stuck_kb=rss_stuck,
           rss_dispatcher_closed_kb=rss_dispatcher_gone, rss_after_reader_rst_kb=rss_end)
    assert took < 1.0, f"dispatch took {took:.3f}s"
    assert health < 0.5, f"/healthz took {health:.3f}s while a write was stuck"
    if not sanitized(pid):
        assert rss_stuck - rss0 < 8 * 1024, "RSS grew by more than 8 MB for one 900 KB payload"


@pytest.mark.parametrize("mode", [["--delivery", "written"],
                                  ["--delivery", "confirm", "--confirm-timeout-ms", "500"]],
                         ids=["written", "confirm"])
def test_never_reading_controller_cannot_queue_unbounded_memory(start_server, mode):
    """Memory stays bounded under a reader that never
    reads. One controller pipelines 24 polls and reads nothing; a ~900 KB
    payload is dispatched each time one of its polls parks (the kernel
    takes ~3-4 MB; the rest would sit in the server). The server must stop
    that before ~8 MB (9 payloads) are queued for it: by dropping the
    connection at a queued-bytes limit, or by not taking its next poll
    while an answer is still unsent. Its RSS must not grow by more than
    8 MB. Under confirm the first run is never acknowledged: after
    confirm_timeout_ms it is taken back with a reset, which drops the
    connection."""
    s = start_server("--max-body-bytes", BIG_BODY_LIMIT, *mode)
    pid = s.proc.pid
    n, bound = 24, 9
    reader = slow_reader(s.port)
    try:
        reader.sendall(b"".join(build_request("GET", "/warm-start",
                                              poll_headers(controller_id=f"controller_u{i}"))
                                for i in range(n)))
        s.wait_parked(1)
        rss0 = rss_kb(pid)
        d = s.conn()
        body = big_dispatch_body("run_unbounded")
        hits, slowest, stopped = 0, 0.0, None
        for i in range(n):
            # Wait (1 s) for its next pipelined poll to park.
            deadline = time.monotonic() + 1.0
            while True:
                m = s.metrics()
                if m.parked_now == 1:
                    break
                if m.get("pilotlight_connections_open") <= 2:  # dispatcher + scrape
                    stopped = "connection dropped"
                    break
                if time.monotonic() > deadline:
                    stopped = "next poll not taken"
                    break
                time.sleep(0.02)
            if stopped:
                break
            hit, took = timed_dispatch(d, body)
            hits += hit
            slowest = max(slowest, took)
        rss_peak = rss_kb(pid)
        health = timed_healthz(s.port)
        m = assert_ledger(s.port)
        report("24 x 900 KB to one never-reading controller", payloads_taken=hits,
               stopped_by=stopped, rss_before_kb=rss0, rss_after_kb=rss_peak,
               growth_kb=rss_peak - rss0, slowest_dispatch_s=round(slowest, 4),
               healthz_s=round(health, 4), disconnects=m.settled("disconnect"))
        assert slowest < 1.0
        assert health < 0.5
        assert hits <= bound, \
            (f"{hits} payloads (~{hits * PAYLOAD_PAD // 1000} kB) queued for a controller "
             f"that never reads, and it is still connected and polling: no queued-bytes "
             f"limit (server RSS grew {rss_peak - rss0} kB)")
        if not sanitized(pid):
            assert rss_peak - rss0 < 8 * 1024, f"server RSS grew {rss_peak - rss0} kB"
    finally:
        reset_close(reader)
    wait_connections(s, 2)  # the dispatcher's connection and the scrape


# -- the file-descriptor limit ------------------------------------------------------------------------

class FdLimitedServer(Server):
    """A server started with RLIMIT_NOFILE soft = hard = <nofile>."""

    def __init__(self, nofile, args=()):
        self.args = [BIN, "--listen", f"{HOST}:0"] + list(args)
        self.errf = impair.log_file()
        self.outf = impair.log_file()

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=self.outf, stderr=self.errf,
                                     env=clean_env(), preexec_fn=limit)
        self.port = None
        self.address = None
        self.conns = []
        self.stopped = False
        self._wait_listening()


def classify(sock):
    """What a client got: 'silent' (still open, nothing), a status code,
    or 'closed' (EOF or RST without an answer)."""
    sock.setblocking(False)
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return "silent"
    except (ConnectionResetError, BrokenPipeError):
        return "closed"
    if not data:
        return "closed"
    assert data.startswith(b"HTTP/1.1 "), data[:100]
    return int(data[9:12])


def test_fd_limit_no_busy_loop_and_recovery():
    nofile, nclients = 128, 300
    s = FdLimitedServer(nofile)
    clients, churn = [], []
    try:
        pid = s.proc.pid
        shared = [r for r in s.log_lines() if r.get("msg") == "file descriptors shared out"]
        assert shared, "no log line about the descriptors shared out"
        max_conns = shared[0]["controllers"]
        assert max_conns < nofile
        for i in range(nclients):
            c = socket.create_connection((HOST, s.port), timeout=5)
            clients.append(c)
            try:
                c.sendall(build_request("GET", "/warm-start",
                                        poll_headers(controller_id=f"controller_fd{i}")))
            except (ConnectionResetError, BrokenPipeError):
                pass
        time.sleep(0.3)

        # Keep knocking while saturated, so accept keeps failing during the
        # measurement; the server must not spin on it.
        stop = time.monotonic() + 1.2

        def knock():
            while time.monotonic() < stop and len(churn) < 150:
                try:
                    k = socket.create_connection((HOST, s.port), timeout=1)
                    churn.append(k)
                    k.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                except OSError:
                    pass
                time.sleep(0.01)

        t = threading.Thread(target=knock)
        t.start()
        cpu0 = cpu_seconds(pid)
        time.sleep(1.0)
        cpu = cpu_seconds(pid) - cpu0
        t.join()
        assert s.proc.poll() is None, "server died at the fd limit"

        seen = {}
        for c in clients:
            k = classify(c)
            seen[k] = seen.get(k, 0) + 1
        knocked = {}
        for c in churn:
            k = classify(c)
            knocked[k] = knocked.get(k, 0) + 1
        report("fd limit", nofile=nofile, max_connections=max_conns, clients=nclients,
               outcomes=seen, knocks_while_saturated=knocked, cpu_s_over_1s=cpu)
        assert cpu < 0.5, f"server used {cpu:.2f}s CPU in 1s while saturated (busy loop?)"
        assert set(seen) <= {"silent", 503, "closed"}, seen
        assert set(knocked) <= {"silent", 503, "closed", 200}, knocked
        assert 0 < seen.get("silent", 0) <= max_conns, seen

        for c in clients + churn:
            c.close()
        clients, churn = [], []
        deadline = time.monotonic() + 5
        while True:
            try:
                if request(s.port, "GET", "/healthz", timeout=0.5).status == 200:
                    break
            except (OSError, ConnectionClosed):
                pass
            assert time.monotonic() < deadline, "server does not serve after the clients left"
            time.sleep(0.05)
        m = wait_connections(s, 1)
        assert m.parked_now == 0 and m.settled("disconnect") == m.parked_total, m.text
        assert_ledger(m)
        w = s.park(controller_id="controller_after_fd")
        assert s.dispatch() is True
        assert read_payload(w) == EXAMPLE
        w.close()
        wait_connections(s, 1)
    finally:
        for c in clients + churn:
            c.close()
        s.stop()


# -- connection storm -------------------------------------------------------------------------------

def test_connection_storm(server):
    """10,000 open/close cycles from 4 threads: plain close, reset, and now
    and then a request. The server keeps answering, a bystander poll is
    still matched afterwards, and connections_open comes back to 2 (the
    bystander and the scrape itself)."""
    cycles, threads = 10_000, 4
    pid = server.proc.pid
    w = server.park(controller_id="controller_storm_bystander")
    rss0 = rss_kb(pid)
    errors, answered = [], [0]
    lock = threading.Lock()

    def storm(tid):
        for i in range(cycles // threads):
            try:
                c = socket.create_connection((HOST, server.port), timeout=5)
                if i % 25 == 0:
                    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = c.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    assert data.startswith(b"HTTP/1.1 200 "), data[:100]
                    with lock:
                        answered[0] += 1
                if i % 2:
                    reset_close(c)
                else:
                    c.close()
            except Exception as e:  # collected, reported below
                with lock:
                    errors.append(f"thread {tid} cycle {i}: {e!r}")
                    if len(errors) > 20:
                        return

    t0 = time.monotonic()
    ts = [threading.Thread(target=storm, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    took = time.monotonic() - t0
    assert not errors, errors[:5]
    assert timed_healthz(server.port) < 0.5
    m = wait_connections(server, 2)  # the bystander and the scrape
    rss1 = rss_kb(pid)
    report("connection storm", cycles=cycles, seconds=round(took, 2),
           cycles_per_s=int(cycles / took), answered=answered[0],
           rss_before_kb=rss0, rss_after_kb=rss1,
           connections_open=m.get("pilotlight_connections_open"))
    assert took < 20, f"10k cycles took {took:.1f}s"
    assert m.parked_now == 1, m.text
    if not sanitized(pid):
        assert rss1 - rss0 < 4096, f"RSS grew {rss1 - rss0} kB over the storm"
    assert server.dispatch() is True
    assert read_payload(w) == EXAMPLE
    assert_ledger(server.port)
