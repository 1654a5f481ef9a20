"""What a hostile or careless neighbour cannot do.

- Fill the descriptor limit through the controllers' port: the dispatch
  listener keeps a share of its own, so dispatches, /metrics and /readyz
  there are answered as usual, and the controllers' port answers its
  excess 503 (not a silent close); --check-config shows the split.
- Pipeline bytes behind a parked poll: a parked poll keeps no more than
  one small request's worth, so 15 kB behind each of thousands of polls
  costs what a parked poll costs.
- Signal a process as it starts: SIGHUP is held until the handlers exist,
  so every start reaches "listening" and the reload is still done.
- Hand it a configuration an operator cannot read: a byte-order mark is
  skipped, control bytes in a value are shown escaped, a misspelt
  environment variable is refused naming the setting it misses, and a
  header-bound setting refuses control characters.
"""
import os
import resource
import signal
import socket
import subprocess
import time

import pytest

from conftest import (BIN, HOST, UNDER_VALGRIND, Conn, build_request, built_shim, clean_env,
                      get, make_message, poll_headers, read_payload, run_binary)
from test_identity import dispatch_port_of


def limit_fds(n):
    def fn():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    return fn


def test_check_config_shows_how_descriptors_are_shared_out():
    rc, out, err = run_binary("--dispatch-listen", "127.0.0.1:8081", "--ring-peers",
                              "127.0.0.1:8080,127.0.0.2:8080", "--ring-self", "127.0.0.1:8080",
                              "--listen", "127.0.0.1:8080", "--check-config")
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.startswith("# file descriptors:"))
    nums = [int(w.strip(",;")) for w in line.replace(":", " ").split() if w.strip(",;").isdigit()]
    nofile, controllers, dispatch, ring, own = nums
    assert dispatch == 1024 and ring == 64 and own >= 64, line
    assert controllers + dispatch + ring + own == nofile, line


def test_the_dispatch_port_keeps_its_descriptors(start_server):
    """A limit of 400 descriptors and 420 connections to the controllers'
    port: the dispatch port still answers everything, and the controllers'
    port answers what is over its share 503."""
    from conftest import Server
    s = Server(["--dispatch-listen", "127.0.0.1:0", "--idle-timeout-ms", "60000",
                "--header-timeout-ms", "60000"], preexec_fn=limit_fds(400))
    try:
        dport = dispatch_port_of(s)
        share = [r for r in s.log_lines() if r.get("msg") == "file descriptors shared out"]
        assert share and share[0]["dispatch"] > 0, s.stderr()[-2000:]
        controllers = share[0]["controllers"]
        poll = Conn(s.port)
        poll.request("GET", "/warm-start", poll_headers(controller_id="ctl_flooded"))
        __import__("conftest").wait_parked(dport, 1)
        flood, refused = [], 0
        for i in range(controllers + 20):
            c = socket.create_connection((HOST, s.port), timeout=5)
            flood.append(c)
        time.sleep(0.5)
        # The excess was answered 503, each on its own connection.
        for c in flood:
            c.setblocking(False)
            try:
                data = c.recv(4096)
            except BlockingIOError:
                continue
            if data.startswith(b"HTTP/1.1 503"):
                refused += 1
        assert refused >= 20, (refused, controllers)
        for path in ("/healthz", "/readyz", "/metrics"):
            assert get(dport, path).status == 200, path
        msg = make_message(run_id="run_flooded")
        r = Conn(dport)
        r.request("POST", "/warm-start", {"Content-Type": "application/json"},
                  ('{"dequeuedMessage":' + __import__("json").dumps(msg) + "}").encode())
        assert r.read_response().json() == {"didWarmStart": True}
        assert read_payload(poll) == msg
        m = __import__("conftest").scrape(dport)
        assert m.get("pilotlight_connections_refused_total", reason="max_connections") >= 20
        assert m.get("pilotlight_connections_refused_total", reason="fd_limit") == 0, m.text
        for c in flood:
            c.close()
        r.sock.close()
        poll.close()
    finally:
        s.stop()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))


def park_many(port, n, tail=b""):
    socks = []
    for i in range(n):
        c = socket.create_connection((HOST, port), timeout=5)
        c.sendall(build_request("GET", "/warm-start",
                                poll_headers(controller_id=f"ctl_tail_{len(tail)}_{i}")) + tail)
        socks.append(c)
    return socks


def test_bytes_behind_a_parked_poll_cost_nothing(start_server):
    """5,000 polls with 15 kB each pipelined behind them cost a parked poll
    what 5,000 plain ones do, within 10 %; each is still answered, then
    closed (what came behind it was dropped, not read as requests)."""
    from impair import raise_fd_limit
    raise_fd_limit(20000)
    s = start_server("--max-waiters-per-key", "100000")
    n = 5000
    base = rss_kib(s.proc.pid)
    plain = park_many(s.port, n)
    s.wait_parked(n, timeout=30)
    time.sleep(0.3)
    per_plain = (rss_kib(s.proc.pid) - base) * 1024 / n
    for c in plain:
        c.close()
    s.wait_parked(0, timeout=30)
    time.sleep(0.3)
    base = rss_kib(s.proc.pid)
    tailed = park_many(s.port, n, tail=b"X" * 15000)
    s.wait_parked(n, timeout=30)
    time.sleep(0.3)
    per_tailed = (rss_kib(s.proc.pid) - base) * 1024 / n
    print(f"RSS per parked poll: {per_plain:.0f} B plain, {per_tailed:.0f} B with 15 kB behind")
    assert per_tailed <= per_plain * 1.10 + 16, (per_plain, per_tailed)
    # Still parked, still served: a run reaches one, which is then closed.
    msg = make_message(run_id="run_tailed")
    assert s.dispatch(msg) is True
    c = Conn.__new__(Conn)
    for sock in tailed:
        sock.setblocking(False)
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            continue
        if data:
            sock.setblocking(True)
            sock.settimeout(5)
            while b'"run_tailed"' not in data or not data.endswith(b"}"):
                more = sock.recv(65536)
                if not more:
                    break
                data += more
            assert b"Connection: close" in data and b"run_tailed" in data, data[:300]
            break
    else:
        raise AssertionError("no parked poll got the run")
    for sock in tailed:
        sock.close()


HELD = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


def slow_start_shim():
    """The LD_PRELOAD shim that makes the start wait 300 ms at a point
    after pilotlight's first instruction, before its signal handlers exist
    (tests/fault/slow_start.c), built beside the binary under test."""
    return built_shim("pl-slow-start.so")


def signals_blocked(pid, timeout=5.0):
    """Waits until <pid> blocks the signals pilotlight holds (SigBlk in
    /proc): its code is running, in the slow start."""
    want = sum(1 << (s - 1) for s in HELD)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(ln.split(":", 1) for ln in f if ":" in ln)
            if int(fields["SigBlk"], 16) & want == want:
                return True
        except (FileNotFoundError, KeyError, ProcessLookupError):
            pass
        time.sleep(0.001)
    return False


def test_a_sighup_storm_at_start_kills_no_start(tmp_path):
    """SIGHUP every millisecond while the process starts (made slow, so
    the signals land before its handlers exist): each of six starts reaches
    "listening", and the reload is done after."""
    if UNDER_VALGRIND:
        pytest.skip("under valgrind the signals land while valgrind starts, before the "
                    "program's first instruction, where no program can hold them")
    conf = tmp_path / "p.conf"
    conf.write_text("log_level = info\n")
    env = clean_env({"LD_PRELOAD": slow_start_shim(), "PL_SLOW_START_MS": "300",
                     "ASAN_OPTIONS": os.environ.get("ASAN_OPTIONS", "")
                     + ":verify_asan_link_order=0"})
    for attempt in range(6):
        p = subprocess.Popen([BIN, "--listen", f"{HOST}:0", "--config", str(conf)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env=env)
        try:
            assert signals_blocked(p.pid), "the signals are not held at start"
            deadline = time.monotonic() + 0.1
            while time.monotonic() < deadline and p.poll() is None:
                p.send_signal(signal.SIGHUP)
                time.sleep(0.001)
            listening = False
            lines = []
            end = time.monotonic() + 20
            while not listening and time.monotonic() < end and p.poll() is None:
                line = p.stderr.readline()
                lines.append(line)
                listening = b'"msg":"listening"' in line
            while b'"reloaded"' not in b"".join(lines) and time.monotonic() < end and \
                    p.poll() is None:
                lines.append(p.stderr.readline())
            alive = p.poll() is None
            p.send_signal(signal.SIGTERM)
            try:
                rest, _ = p.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                rest, _ = p.communicate()
            text = b"".join(lines) + (rest or b"")
            assert alive and listening, (attempt, p.returncode, text[-2000:])
            assert b'"reloaded"' in text, (attempt, text[-2000:])
            assert p.returncode == 0, (attempt, p.returncode, text[-2000:])
        finally:
            if p.poll() is None:  # a failed check leaves no process behind
                p.kill()
                p.wait()


def test_messages_an_operator_can_read(tmp_path):
    bom = tmp_path / "bom.conf"
    bom.write_bytes(b"\xef\xbb\xbfmax_waiters = 77\n")
    rc, out, err = run_binary("--config", str(bom), "--check-config")
    assert rc == 0 and "max_waiters = 77" in out, err
    crlf = tmp_path / "crlf.conf"
    crlf.write_bytes(b"max_waiters = 7\rx\n")
    rc, out, err = run_binary("--config", str(crlf), "--check-config")
    assert rc == 2 and "\\x0d" in err and "\r" not in err.rstrip("\n"), repr(err)
    rc, out, err = run_binary("--check-config", env={"PILOTLIGHT_MAX_WAITER": "5"})
    assert rc == 2 and "PILOTLIGHT_MAX_WAITER" in err and "PILOTLIGHT_MAX_WAITERS" in err, err
    rc, out, err = run_binary("--check-config", env={"PILOTLIGHT_SOMETHING_ELSE": "5",
                                                     "PILOTLIGHT_DISPATCH_SERVICE_HOST": "10.0.0.1",
                                                     "PILOTLIGHT_RING_PORT_8080_TCP": "tcp://x"})
    assert rc == 0 and "PILOTLIGHT_SOMETHING_ELSE names no setting" in err, err
    assert "SERVICE_HOST" not in err and "PORT_8080" not in err, err
    rc, out, err = run_binary("--check-config", env={"PILOTLIGHT_DISPATCH_TOKEN": "abc\r\nX: y"})
    assert rc == 2 and "dispatch_token" in err and "control character" in err, err
    assert "abc" not in err, err  # a secret is not echoed
    rc, out, err = run_binary("--max-waitrs", "5")
    assert rc == 2 and "unknown option" in err, err
    conf = tmp_path / "typo.conf"
    conf.write_text("max_waiter = 5\n")
    rc, out, err = run_binary("--config", str(conf), "--check-config")
    assert rc == 2 and "did you mean max_waiters" in err, err
