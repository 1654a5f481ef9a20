"""Many waiters at once, and abrupt disconnects that must leave nothing behind."""

import json
import selectors
import socket
import threading
import time

from conftest import (HOST, Conn, assert_ledger, build_request, dispatch, key_of,
                      make_message, poll_headers)

N_KEYS = 100
PER_KEY = 10


def open_polls(port, headers_list, batch=100):
    """Opens one non-blocking socket per poll (in batches, so the accept
    queue never overflows) and sends each poll on it."""
    socks = []
    for i in range(0, len(headers_list), batch):
        for h in headers_list[i:i + batch]:
            s = socket.create_connection((HOST, port), timeout=5)
            s.sendall(build_request("GET", "/warm-start", h))
            s.setblocking(False)
            socks.append(s)
    return socks


def parse_one(buf):
    """(status, headers, body, rest) for one complete response in <buf>,
    or None if incomplete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end].decode("latin-1").split("\r\n")
    status = int(head[0].split(" ")[1])
    headers = {}
    for ln in head[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    if len(buf) < end + 4 + n:
        return None
    return status, headers, buf[end + 4:end + 4 + n], buf[end + 4 + n:]


def collect(socks, timeout=20.0):
    """Reads until every socket holds one complete response; returns the
    raw buffers (a socket closed early keeps what it had)."""
    sel = selectors.DefaultSelector()
    bufs = {s: b"" for s in socks}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    pending = set(socks)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            except ConnectionResetError:
                data = b""
            if not data:
                sel.unregister(s)
                pending.discard(s)
                continue
            bufs[s] += data
            if parse_one(bufs[s]) is not None:
                pending.discard(s)
    sel.close()
    return bufs


def test_thousand_waiters_hundred_keys(server):
    headers = []
    for k in range(N_KEYS):
        d, v, cpu, mem = key_of(k)
        for j in range(PER_KEY):
            headers.append(poll_headers(deployment=d, version=v, cpu=cpu, memory=mem,
                                        controller_id=f"controller_{k}_{j}"))
    socks = open_polls(server.port, headers)
    try:
        m = server.wait_parked(N_KEYS * PER_KEY, timeout=20)
        assert m.keys_now == N_KEYS
        assert_ledger(m)

        # 1,000 dispatches on one keep-alive connection, each with its own run id.
        dc = Conn(server.port, timeout=10)
        server.conns.append(dc)
        expected = set()
        for i in range(N_KEYS * PER_KEY):
            d, v, cpu, mem = key_of(i % N_KEYS)
            run_id = f"run_scale_{i}"
            expected.add(run_id)
            body = json.dumps({"dequeuedMessage": make_message(d, v, cpu, mem, run_id)})
            dc.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
            r = dc.read_response()
            assert r.status == 200 and r.json() == {"didWarmStart": True}, (i, r)

        bufs = collect(socks)
        got = []
        for s, buf in bufs.items():
            one = parse_one(buf)
            assert one is not None, f"a waiter got no complete response: {buf[:200]!r}"
            status, hdrs, body, rest = one
            assert status == 200, buf[:300]
            assert rest == b"", f"a waiter got more than one response: {rest[:200]!r}"
            got.append(json.loads(body)["run"]["friendlyId"])
        assert len(got) == len(set(got)), "a payload was delivered twice"
        assert set(got) == expected

        # Nobody left: one more dispatch per key misses.
        for k in range(N_KEYS):
            d, v, cpu, mem = key_of(k)
            body = json.dumps({"dequeuedMessage": make_message(d, v, cpu, mem, "run_extra")})
            dc.request("POST", "/warm-start", {"Content-Type": "application/json"}, body)
            r = dc.read_response()
            assert r.status == 200 and r.json() == {"didWarmStart": False}, (k, r)

        m = assert_ledger(server.metrics())
        assert m.parked_now == 0 and m.keys_now == 0
        assert m.settled("matched") == N_KEYS * PER_KEY
        assert m.dispatched("hit") == N_KEYS * PER_KEY
        assert m.dispatched("miss") == N_KEYS
    finally:
        for s in socks:
            s.close()


def test_abrupt_disconnects_leave_nothing_behind(server):
    polls = [server.park(wait=False, deployment=f"deployment_dc{i % 5}")
             for i in range(50)]
    m = server.wait_parked(50)
    assert m.keys_now == 5
    for i, p in enumerate(polls):
        p.close(rst=(i % 2 == 0))
    m = server.wait_metrics(lambda m: m.parked_now == 0, timeout=5,
                            what="every disconnect to be noticed")
    assert m.settled("disconnect") == 50
    assert m.keys_now == 0
    assert_ledger(m)
    # Only the scrape's own connection remains open.
    server.wait_metrics(lambda m: m.get("pilotlight_connections_open") <= 1, timeout=5,
                        what="connections_open back to 1")
    for k in range(5):
        assert server.dispatch(make_message(deployment=f"deployment_dc{k}")) is False
    assert server.metrics().settled("matched") == 0


def test_disconnects_interleaved_with_dispatch(server):
    """Waiters of one key, half of them gone: every true reaches a live one."""
    polls = [server.park(wait=False, controller_id=f"controller_i{i}") for i in range(20)]
    server.wait_parked(20)
    live = []
    for i, p in enumerate(polls):
        if i % 2:
            live.append(p)
        else:
            p.close(rst=(i % 4 == 0))
    server.wait_metrics(lambda m: m.parked_now == 10, what="10 disconnects noticed")
    hits = sum(server.dispatch(make_message(run_id=f"run_i{i}")) for i in range(12))
    assert hits == 10
    bufs = collect([p.sock for p in live], timeout=5)
    got = []
    for b in bufs.values():
        one = parse_one(b)
        assert one is not None and one[0] == 200, b[:300]
        got.append(json.loads(one[2])["run"]["friendlyId"])
    got.sort()
    assert got == sorted(f"run_i{i}" for i in range(10))


def test_concurrent_dispatches_deliver_each_waiter_once(server):
    polls = [server.park(wait=False, controller_id=f"controller_cc{i}") for i in range(20)]
    server.wait_parked(20)
    results = []
    lock = threading.Lock()

    def worker(t):
        for j in range(4):
            r = dispatch(server.port, make_message(run_id=f"run_cc{t}_{j}"))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 40
    assert sum(results) == 20
    bufs = collect([p.sock for p in polls], timeout=5)
    ids = []
    for b in bufs.values():
        one = parse_one(b)
        assert one is not None and one[0] == 200 and one[3] == b"", b[:300]
        ids.append(json.loads(one[2])["run"]["friendlyId"])
    assert len(set(ids)) == 20
    m = assert_ledger(server.metrics())
    assert m.dispatched("hit") == 20 and m.dispatched("miss") == 20
