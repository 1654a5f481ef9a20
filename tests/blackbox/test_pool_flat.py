"""Flat memory: after warm-up, 100,000 mixed operations take no chunk from the
system (pilotlight_pool_chunks_allocated_total, read from /metrics).

The mix: match cycles and churn with FIN and with RST (pl-loadgen), and from
here 204 timeouts, 409 replacements, pipelined 400s and 413s. The warm-up is
the same mix once more, after 3,000 polls parked and closed together, so the
pools have met the connection peaks the mix can reach (aborted connections
back up in the accept queue while the server is off its CPU). Trims between
the phases give pages back but keep the chunks' address ranges, so they do
not count as chunk allocations when reused. Skipped under
valgrind, which runs it a hundred times slower.

PL_POOL_OPS=1000000 scales every part of the mix tenfold (a
"1 M mixed operations"); the test prints RSS warmed and at the end, both
read a second after the last connection closed."""

import os
import socket
import threading
import time

import pytest

from conftest import (HOST, Conn, assert_ledger, build_request, loadgen, no_errors,
                      poll_headers)

OPS = int(os.environ.get("PL_POOL_OPS", "100000"))
SCALE = max(1, OPS // 100_000)
PARK_TIMEOUT_MS = 100
MAX_BODY = 4096

# The keys whose bytes the status page keeps (docs/architecture.md, Memory):
# 64 dispatched to lately, 16 nearest keys, 16 refusals explaining misses,
# 16 refusals.
DIAG_KEYS_MAX = 112

def under_valgrind(pid):
    with open(f"/proc/{pid}/maps") as f:
        return "vgpreload" in f.read()


def chunks_allocated(m):
    return m.sum("pilotlight_pool_chunks_allocated_total")


def replace_and_time_out(port, n, tag):
    """<n> controllers poll twice: the first poll is answered 409, the
    second 204 at the park timeout. Returns 2n (operations)."""
    firsts, seconds = [], []
    for i in range(n):
        h = poll_headers(controller_id=f"controller_{tag}_{i}")
        for group in (firsts, seconds):
            c = Conn(port)
            c.request("GET", "/warm-start", h)
            group.append(c)
    for c in firsts:
        assert c.read_response().status == 409
    for c in seconds:
        assert c.read_response().status == 204
    for c in firsts + seconds:
        c.close()
    return 2 * n


def bad_requests(port, n):
    """<n> polls missing their headers (400 each), pipelined 50 at a time on
    one connection, so they wait in its carry-over buffer; and n / 10
    bodies over the limit (413, one connection each). Returns the count."""
    c = Conn(port)
    one = build_request("GET", "/warm-start", {"x-trigger-deployment-id": "d"})
    for _ in range(n // 50):
        c.send(one * 50)
        for _ in range(50):
            assert c.read_response().status == 400
    c.close()
    big = build_request("POST", "/warm-start", {"Content-Length": str(MAX_BODY + 1)})
    for _ in range(n // 10):
        with socket.create_connection((HOST, port), timeout=5) as s:
            s.sendall(big)
            assert s.recv(64).startswith(b"HTTP/1.1 413")
    return n // 50 * 50 + n // 10


def churn(server, cycles):
    """Connect-park-abort cycles, half closed with FIN, half with RST.
    They go at a fixed rate well below what the server can take, so the
    accept queue stays short and the connection peak is the mix's, not how
    far a server sharing its CPU fell behind."""
    for abort in ("fin", "rst"):
        (r,), _ = loadgen(server, "--cycles", str(cycles // 2), "--churn-warmup", "0",
                          "--concurrency", "16", "--rate", "4000", "--abort", abort,
                          "churn", timeout=120)
        assert r["connection_errors"] == 0 and r["ledger_ok"] == 1, r
        assert r["disconnects"] == cycles // 2, r
    return cycles // 2 * 2


def match_cycles(server, seconds):
    """Closed-loop match cycles for <seconds>; returns the hits."""
    (r,), _ = loadgen(server, "--controllers", "40", "--dispatchers", "4", "--keys", "8",
                      "--duration", str(seconds), "--warmup", "0", "cycle", timeout=60)
    no_errors(r)
    assert r["lost"] == 0
    return r["hits"]


def mix(server, tag, cycles, seconds, scale=1):
    """One round of every kind of operation; returns how many."""
    return (churn(server, cycles) + replace_and_time_out(server.port, 200 * scale, tag) +
            bad_requests(server.port, 1000 * scale) + match_cycles(server, seconds))


def rss_kb(pid, settle=1):
    time.sleep(settle)
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


class PeakRss(threading.Thread):
    """The highest RSS seen, read every 20 ms while the operations run."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, 0, threading.Event()

    def run(self):
        while not self.done.wait(0.02):
            self.peak = max(self.peak, rss_kb(self.pid, 0))


def test_mixed_operations_allocate_no_chunk(start_server):
    s = start_server("--park-timeout-ms", str(PARK_TIMEOUT_MS),
                     "--connection-timeout-ms", str(PARK_TIMEOUT_MS // 2),
                     "--max-body-bytes", str(MAX_BODY))
    if under_valgrind(s.proc.pid):
        pytest.skip("100,000 operations are too slow under valgrind")
    loadgen(s, "--parked", "3000", "--idle-warmup", "0", "idle", timeout=120)
    mix(s, "warm", 4000, 0.5, SCALE)
    before = assert_ledger(s.metrics())
    rss_before = rss_kb(s.proc.pid)
    peak = PeakRss(s.proc.pid)
    peak.start()
    ops = mix(s, "measured", 16000 * SCALE, 2 * SCALE, SCALE)
    while ops < OPS:  # match cycles are slower on a sanitizer build
        ops += match_cycles(s, 2)
    peak.done.set()
    peak.join()
    after = assert_ledger(s.metrics())
    rss_after = rss_kb(s.proc.pid)
    print(f"\n[pool] {ops} operations; chunks allocated "
          f"{chunks_allocated(before):.0f} -> {chunks_allocated(after):.0f}, "
          f"returned {after.sum('pilotlight_pool_chunks_returned_total'):.0f}; "
          f"RSS KiB warmed {rss_before}, peak {peak.peak}, end {rss_after} "
          f"({rss_after - rss_before:+d})")
    assert after.parked_now == 0
    assert after.parked_total - before.parked_total >= 16000 + 400
    grew = {k[1]: (before.samples.get(k, 0), v) for k, v in after.samples.items()
            if k[0] == "pilotlight_pool_chunks_allocated_total"
            and v != before.samples.get(k, 0)}
    assert chunks_allocated(after) == chunks_allocated(before), f"chunks allocated: {grew}"
    # Every pooled object of those operations went back, but for the bytes
    # of the keys the status page remembers: at most DIAG_KEYS_MAX, whatever
    # the keys dispatched to (the measured round's are new ones).
    assert after.sum("pilotlight_pool_objects_in_use") <= \
        before.sum("pilotlight_pool_objects_in_use") + DIAG_KEYS_MAX


def test_request_state_does_not_outlive_its_request(server):
    """The parser goes back to its pool after each request: a HEAD's
    no-body rule must not leak into the error answer of the next request on
    the connection, and a 1000-request pipeline still answers in order."""
    c = server.conn()
    c.request("HEAD", "/healthz")
    r = c.read_response(head_request=True)
    assert r.status == 200 and r.body == b""
    c.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n")
    r = c.read_response()
    assert r.status == 400 and b"error" in r.body
    c2 = server.conn()
    c2.send(b"".join(build_request("GET", "/healthz" if i % 2 else "/readyz")
                     for i in range(1000)))
    for i in range(1000):
        r = c2.read_response()
        assert r.status == 200 and r.json()["status"] == ("ok" if i % 2 else "ready")
