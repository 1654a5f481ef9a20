"""Binary upgrade on SIGUSR2: the old process hands its listeners, parked
polls and idle keep-alive connections to a new one, which serves them; the
controllers see nothing. A new binary that fails leaves the old one serving.

The new process is the old one's child; once the old exits it is re-parented
to this test process (made a child subreaper), so its exit status is read
here. The program started is always given as --upgrade-binary PILOTLIGHT_BIN,
so under tests/harness/valgrind-wrap.sh the new process runs under valgrind too."""

import json
import os
import select
import signal
import socket
import subprocess
import time

import pytest

import impair
from conftest import (BIN, HOST, UNDER_VALGRIND, Conn, assert_ledger, check_sanitizers,
                      clean_env, key_of, make_message, poll_headers, request, scrape,
                      wait_metrics)
from test_scale import open_polls

# valgrind runs the server some 20-50 times slower: fewer polls, same keys.
N_KEYS, PER_KEY = (100, 5) if UNDER_VALGRIND else (100, 50)


def fds(pid):
    """Descriptors of <pid>, but valgrind's own: a new process started under
    valgrind holds one more on its log than the one that started it."""
    logs = os.environ.get("PL_VALGRIND_LOGS", "/tmp").rstrip("/") + "/vg."
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        if UNDER_VALGRIND and (target.startswith(logs) or "/valgrind_proc_" in target or
                               "/vgdb-pipe-" in target):
            continue
        n += 1
    return n


def fds_settle(pid, want, timeout=10):
    """The descriptor count of <pid> once it reaches <want>, or what it is
    at <timeout>: the new process may still be closing its end of the
    handover when it logs the adoption (seen under valgrind)."""
    deadline = time.monotonic() + timeout
    while fds(pid) != want and time.monotonic() < deadline:
        time.sleep(0.05)
    return fds(pid)


def logged(s, msg):
    return [r for r in s.log_lines() if r.get("msg") == msg]


def wait_logged(s, msg, timeout=30.0, count=1):
    deadline = time.monotonic() + timeout
    while len(logged(s, msg)) < count:
        assert time.monotonic() < deadline, f"no {msg!r} log line:\n{s.stderr()[-4000:]}"
        time.sleep(0.02)
    return logged(s, msg)


def wait_ignored(s, sig, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not [r for r in logged(s, "signal ignored")
               if r["signal"] == sig and r["why"] == "an upgrade is in progress"]:
        assert time.monotonic() < deadline, f"{sig} not ignored:\n{s.stderr()[-4000:]}"
        time.sleep(0.02)


def ledger_adds_up(rec):
    return rec["parked_now"] + sum(rec["settled"].values()) == \
        rec["parked_total"] + rec["adopted"]


def readable(socks):
    """The sockets with bytes or an end of file to read."""
    p = select.poll()
    by_fd = {sk.fileno(): sk for sk in socks}
    for fd in by_fd:
        p.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in p.poll(0)]


def stop_adopted(s, pid, timeout=30.0):
    """SIGTERM to the adopted process; asserts it exits 0 with a balanced
    ledger and no sanitizer report."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the adopted process did not exit"
        time.sleep(0.02)
    check_sanitizers(s.stderr(), "the adopted process")
    assert os.waitstatus_to_exitcode(status) == 0, s.stderr()[-4000:]
    last = logged(s, "ledger")[-1]
    assert ledger_adds_up(last), last


def test_upgrade_hands_parked_polls_to_the_new_process(start_server, subreaper):
    s = start_server("--upgrade-binary", BIN)
    old = s.proc.pid
    headers = [poll_headers(key_of(k)[0], key_of(k)[1], key_of(k)[2], key_of(k)[3])
               for k in range(N_KEYS) for _ in range(PER_KEY)]
    socks = open_polls(s.port, headers)
    idle = Conn(s.port)
    total = N_KEYS * PER_KEY
    # Scraped over the idle keep-alive connection: a scrape on a connection
    # of its own may still be open in the server when its descriptors are
    # counted (CI once counted one more than the new process ever had).
    wait_metrics(s.port, lambda m: m.parked_now == total, 60, "every poll parked", conn=idle)
    fds_old = fds(old)

    s.proc.send_signal(signal.SIGUSR2)
    assert s.wait_exit(timeout=60) == 0
    handed = wait_logged(s, "upgrade: handed over")[-1]
    new = handed["pid"]
    assert new != old and os.path.exists(f"/proc/{new}")
    adopted = wait_logged(s, "upgrade: adopted")[-1]
    assert adopted == {**adopted, "pid": new, "listeners": 1, "parked": total, "idle": 1}
    assert handed["parked"] == total and handed["idle"] == 1
    old_ledger = [r for r in logged(s, "ledger")][-1]
    assert ledger_adds_up(old_ledger), old_ledger
    assert old_ledger["settled"]["handed_over"] == total
    assert old_ledger["parked_now"] == 0
    assert sum(old_ledger["settled"].values()) == total

    try:
        # The same sockets, nothing more: no descriptor was leaked or lost.
        assert fds_settle(new, fds_old) == fds_old, (fds(new), fds_old)
        # Every controller's connection is open and unanswered.
        assert readable(socks) == []
        m = scrape(s.port)
        assert m.parked_now == total and m.get("pilotlight_adopted_total") == total
        assert m.parked_total == 0
        assert_ledger(m)
        # The idle keep-alive connection is served by the new process.
        idle.request("GET", "/healthz")
        assert idle.read_response().status == 200
        # One dispatch per key reaches one of that key's polls.
        for k in range(N_KEYS):
            d, v, cpu, mem = key_of(k)
            body = json.dumps({"dequeuedMessage": make_message(d, v, cpu, mem, f"run_up_{k}")})
            r = request(s.port, "POST", "/warm-start", {"Content-Type": "application/json"},
                        body)
            assert r.status == 200 and r.json() == {"didWarmStart": True}, (k, r)
        deadline = time.monotonic() + 30
        got = []
        while len(got) < N_KEYS and time.monotonic() < deadline:
            got = readable(socks)
            time.sleep(0.05)
        assert len(got) == N_KEYS
        runs = set()
        for sk in got:
            sk.setblocking(True)
            sk.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += sk.recv(65536)
            assert data.startswith(b"HTTP/1.1 200 "), data[:200]
            head, _, body = data.partition(b"\r\n\r\n")
            n = int([ln.split(b":")[1] for ln in head.split(b"\r\n")
                     if ln.lower().startswith(b"content-length")][0])
            while len(body) < n:
                body += sk.recv(65536)
            runs.add(json.loads(body)["run"]["friendlyId"])
        assert runs == {f"run_up_{k}" for k in range(N_KEYS)}
        m = scrape(s.port)
        assert m.settled("matched") == N_KEYS and m.parked_now == total - N_KEYS
        assert_ledger(m)
        # Clients leave: the new process is back to its own few descriptors.
        for sk in socks:
            sk.close()
        idle.close()
        deadline = time.monotonic() + 30
        while scrape(s.port).parked_now > 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)
        assert fds_settle(new, fds_old - total - 1) == fds_old - total - 1, (fds(new), fds_old)
    finally:
        for sk in socks:
            sk.close()
        stop_adopted(s, new)


def failing_program(tmp_path):
    p = tmp_path / "broken-pilotlight"
    p.write_text("#!/bin/sh\necho 'broken build' >&2\nexit 3\n")
    p.chmod(0o755)
    return str(p)


def test_a_new_binary_that_fails_leaves_the_old_one_serving(start_server, tmp_path):
    s = start_server("--upgrade-binary", failing_program(tmp_path))
    polls = [s.park(deployment=f"deployment_f{i % 3}") for i in range(6)]
    idle = s.conn()
    idle.request("GET", "/healthz")
    assert idle.read_response().status == 200
    before = fds(s.proc.pid)
    s.proc.send_signal(signal.SIGUSR2)
    rec = wait_logged(s, "upgrade failed: still serving")[-1]
    assert "exited (status 3" in rec["error"], rec
    assert s.proc.poll() is None
    assert fds(s.proc.pid) == before
    assert all(p.silent_for(0.05) for p in polls)
    idle.request("GET", "/healthz")
    assert idle.read_response().status == 200
    assert s.dispatch(make_message(deployment="deployment_f0")) is True
    assert sum(1 for p in polls if not p.silent_for(0.2)) == 1
    m = s.metrics()
    assert m.parked_now == 5 and m.settled("handed_over") == 0
    # and a second try is allowed, and fails the same way
    s.proc.send_signal(signal.SIGUSR2)
    wait_logged(s, "upgrade failed: still serving", count=2)
    assert fds(s.proc.pid) == before


def test_a_binary_replaced_on_disk_is_the_one_started(tmp_path):
    """Without --upgrade-binary, the path this process was started from (as
    resolved at start) is run: whatever is there now."""
    if UNDER_VALGRIND:
        pytest.skip("under valgrind /proc/self/exe names the real binary, not the "
                    "copy this test replaces")
    copy = tmp_path / "pilotlight"
    copy.write_bytes(open(BIN, "rb").read())
    copy.chmod(0o755)
    errf = impair.log_file()
    proc = subprocess.Popen([str(copy), "--listen", f"{HOST}:0"], stdin=subprocess.DEVNULL,
                            stderr=errf, stdout=subprocess.DEVNULL, env=clean_env())
    try:
        time.sleep(0.5)
        # replaced as a package manager does: a new file renamed over the path
        new = tmp_path / "pilotlight.new"
        new.write_text("#!/bin/sh\nexit 7\n")
        new.chmod(0o755)
        os.rename(new, copy)
        proc.send_signal(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while b"upgrade failed" not in (errf.seek(0) or errf.read()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        errf.seek(0)
        err = errf.read()
        assert b"exited (status 7" in err, err
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_sigterm_during_an_upgrade_aborts_it_and_drains(start_server, tmp_path):
    slow = tmp_path / "slow-pilotlight"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    s = start_server("--upgrade-binary", str(slow))
    p = s.park()
    s.proc.send_signal(signal.SIGUSR2)
    started = wait_logged(s, "upgrade: started")[-1]
    s.proc.send_signal(signal.SIGUSR2)
    s.proc.send_signal(signal.SIGHUP)
    wait_ignored(s, "SIGUSR2")
    wait_ignored(s, "SIGHUP")
    s.sigterm()
    assert p.wait_closed(timeout=10) == b""
    assert s.wait_exit() == 0
    rec = wait_logged(s, "upgrade failed: still serving")[-1]
    assert rec["error"] == "SIGTERM came first"
    assert not os.path.exists(f"/proc/{started['pid']}") or \
        open(f"/proc/{started['pid']}/stat").read().split()[2] == "Z"


def test_service_manager_hears_ready_and_the_new_main_pid(start_server, subreaper, tmp_path):
    """NOTIFY_SOCKET (systemd's Type=notify): READY=1 once listening; after an
    upgrade the new process names itself MAINPID, then READY=1."""
    path = str(tmp_path / "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(path)
    ns.settimeout(60)
    try:
        s = start_server("--upgrade-binary", BIN, env={"NOTIFY_SOCKET": path})
        assert ns.recv(4096) == b"READY=1"
        p = s.park()
        s.proc.send_signal(signal.SIGUSR2)
        msg = ns.recv(4096).decode()
        assert s.wait_exit(timeout=60) == 0
        new = wait_logged(s, "upgrade: handed over")[-1]["pid"]
        assert msg == f"MAINPID={new}\nREADY=1"
        assert p.silent_for(0.1)
        assert scrape(s.port).get("pilotlight_adopted_total") == 1
        stop_adopted(s, new)
        assert p.wait_closed(timeout=10) == b""  # the new process drains it
    finally:
        ns.close()


def test_upgrade_with_a_separate_dispatch_listener(start_server, subreaper):
    from test_identity import dispatch_port_of
    s = start_server("--upgrade-binary", BIN, "--dispatch-listen", f"{HOST}:0")
    dport = dispatch_port_of(s)
    before = scrape(dport).parked_total
    c = Conn(s.port)
    s.conns.append(c)
    c.request("GET", "/warm-start", poll_headers(deployment="deployment_split"))
    deadline = time.monotonic() + 20
    while scrape(dport).parked_total < before + 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGUSR2)
    assert s.wait_exit(timeout=60) == 0
    new = wait_logged(s, "upgrade: handed over")[-1]["pid"]
    adopted = wait_logged(s, "upgrade: adopted")[-1]
    assert adopted["listeners"] == 2 and adopted["parked"] == 1
    served = {r["serves"] for r in logged(s, "listening") if r.get("adopted")}
    assert served == {"controllers", "dispatch"}
    # each listener kept its role: dispatch only on the dispatch port
    body = json.dumps({"dequeuedMessage": make_message(deployment="deployment_split")})
    r = request(s.port, "POST", "/warm-start", {"Content-Type": "application/json"}, body)
    assert r.status == 403
    r = request(dport, "POST", "/warm-start", {"Content-Type": "application/json"}, body)
    assert r.status == 200 and r.json() == {"didWarmStart": True}
    assert c.read_response().status == 200
    stop_adopted(s, new)


# -- a new process that misses a step ------------------------------------------

STEP_MS = 1500
# A frozen loop holds an answer for the whole step (1.5 s): a third of it
# tells the two apart on a machine whose other work holds the server off
# its CPU now and then (an answer took 135 ms so, with AddressSanitizer);
# under valgrind, which runs the server 20-50 times slower, two thirds.
PROMPT = 1.0 if UNDER_VALGRIND else 0.5


def running(pid):
    """Whether <pid> exists and is not a zombie. It may be reaped between
    any two looks at /proc: a vanished process is not running."""
    try:
        with open(f"/proc/{pid}/stat") as f:  # state: after the name's ")"
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


# HELLO as handover.h encodes it: header (magic "PLHO", version 1, one
# record, body length), then the record (length, type 1, serves 0, pid).
STALLING = r'''#!/usr/bin/env python3
import os, struct, time
# it gets the old process's arguments and environment, and says what it does
mode, marker = os.environ["STALL_MODE"], os.environ["STALL_MARKER"]
if mode != "silent":
    rec = struct.pack("<HBBQ", 10, 1, 0, os.getpid())
    os.write(3, struct.pack("<IHHI", 0x4F484C50, 1, 1, len(rec)) + rec)
if mode == "reads":  # every message, up to the one that ends with END (type 5)
    while True:
        msg = os.read(3, 65536)
        off, types = 12, []
        for _ in range(struct.unpack_from("<H", msg, 6)[0]):
            n, t = struct.unpack_from("<HB", msg, off)
            types.append(t)
            off += 2 + n
        if not msg or 5 in types:
            break
open(marker, "w").close()
time.sleep(30)  # far past the bound; an old process killed by a test leaves it no longer
'''


def stalling_program(tmp_path):
    p = tmp_path / "stalling-pilotlight"
    p.write_text(STALLING)
    p.chmod(0o755)
    return str(p)


def timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


@pytest.mark.parametrize("mode,parked", [("silent", 24), ("hello", 24), ("reads", 24),
                                         ("hello", 2000)],
                         ids=["no-hello", "stalls-after-hello", "no-ready",
                              "stalls-with-a-full-socket"])
def test_a_new_process_that_misses_a_step_never_stops_the_old_one(start_server, tmp_path,
                                                                   mode, parked):
    """The old process serves throughout (each request answered within
    PROMPT, well inside the step it waits for), abandons the upgrade within
    the bound, kills the new process, and still serves every poll parked
    before. The socket the new process
    does not read fills with 2,000 polls' records (net.unix.max_dgram_qlen
    messages): then the bound is on taking in the state."""
    marker = tmp_path / "marker"
    s = start_server("--upgrade-binary", stalling_program(tmp_path),
                     env={"PILOTLIGHT_UPGRADE_STEP_TIMEOUT_MS": str(STEP_MS),
                          "STALL_MODE": mode, "STALL_MARKER": str(marker)})
    keys = [key_of(k, "deployment_stall") for k in range(4)]
    if parked > 100:
        socks = open_polls(s.port, [poll_headers(*keys[i % 4]) for i in range(parked)])
        polls = []
    else:
        socks = []
        polls = [s.park(wait=False, deployment=keys[i % 4][0], version=keys[i % 4][1],
                        cpu=keys[i % 4][2], memory=keys[i % 4][3]) for i in range(parked)]
    s.wait_parked(parked, timeout=60)
    s.proc.send_signal(signal.SIGUSR2)
    child = wait_logged(s, "upgrade: started")[-1]["pid"]
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the stalling program did not start"
        time.sleep(0.005)
    t_stall = time.monotonic()
    slow, rounds, k = [], 0, 0
    try:
        while not logged(s, "upgrade failed: still serving"):
            r, took = timed(lambda: request(s.port, "GET", "/healthz", timeout=2))
            assert r.status == 200
            slow += [("healthz", took)] if took >= PROMPT else []
            dep = f"deployment_during_{k}"
            k += 1
            c = s.park(deployment=dep)
            body = json.dumps({"dequeuedMessage": make_message(dep, run_id=f"run_{dep}")})
            r, took = timed(lambda: request(s.port, "POST", "/warm-start",
                                            {"Content-Type": "application/json"}, body,
                                            timeout=2))
            assert r.status == 200 and r.json() == {"didWarmStart": True}, r
            slow += [("dispatch", took)] if took >= PROMPT else []
            got, took2 = timed(lambda: c.read_response(timeout=2))
            assert got.status == 200 and got.json()["run"]["friendlyId"] == f"run_{dep}"
            slow += [("payload", took + took2)] if took + took2 >= PROMPT else []
            rounds += 1
            assert time.monotonic() - t_stall < STEP_MS / 1000 + 10, "never abandoned"
        t_fail = time.monotonic()
        assert slow == [], f"answers of {PROMPT} s or more: {slow} ({rounds} rounds)"
        assert rounds >= 3
        err = logged(s, "upgrade failed: still serving")[-1]["error"]
        step = {"silent": "did not say HELLO", "hello": "took in no part of the state"
                if parked > 100 else "did not answer READY",
                "reads": "did not answer READY"}[mode]
        assert err == f"the new process {step} within {STEP_MS} ms", err
        # abandoned within the bound (from spawn, or from the last message)
        assert t_fail - t_stall < STEP_MS / 1000 + 1.5, t_fail - t_stall
        m = s.metrics()
        assert m.get("pilotlight_upgrades_total", result="timeout") == 1
        assert m.get("pilotlight_upgrades_total", result="handed_over") == 0
        deadline = time.monotonic() + 10
        while running(child):
            assert time.monotonic() < deadline, "the new process was not killed"
            time.sleep(0.02)
        # every poll parked before is served here, each once
        assert m.parked_now == parked and m.settled("handed_over") == 0
        assert all(p.silent_for(0) for p in polls) and readable(socks) == []
        for i in range(parked):
            d, v, cpu, mem = keys[i % 4]
            assert s.dispatch(make_message(d, v, cpu, mem, f"run_before_{i}")) is True
        runs = set()
        for p in polls:
            runs.add(p.read_response(timeout=5).json()["run"]["friendlyId"])
        for sk in socks:
            sk.settimeout(5)
            data = b""
            while b"run_before_" not in data or not data.rstrip().endswith(b"}"):
                data += sk.recv(65536)
            runs.add(json.loads(data.partition(b"\r\n\r\n")[2])["run"]["friendlyId"])
        assert runs == {f"run_before_{i}" for i in range(parked)}
        m = assert_ledger(s.metrics())
        assert m.parked_now == 0
    finally:
        for sk in socks:
            sk.close()


def test_a_dispatch_never_reaches_a_poll_being_handed_over(start_server, tmp_path):
    """While the new process may hold a poll's socket too, this one does not
    answer it: a dispatch for its key finds no poll here (false) until the
    upgrade is abandoned, then finds it."""
    marker = tmp_path / "marker"
    s = start_server("--upgrade-binary", stalling_program(tmp_path),
                     env={"PILOTLIGHT_UPGRADE_STEP_TIMEOUT_MS": str(STEP_MS),
                          "STALL_MODE": "reads", "STALL_MARKER": str(marker)})
    p = s.park(deployment="deployment_held")
    s.proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert s.dispatch(make_message(deployment="deployment_held")) is False
    assert p.silent_for(0.05)
    wait_logged(s, "upgrade failed: still serving")
    assert s.dispatch(make_message(deployment="deployment_held")) is True
    assert p.read_response().status == 200
