"""impair.py -- the impaired-network harness: two network namespaces joined
by pl-wire (tests/impair/wire.c), pilotlight and a dispatcher on one side,
controllers on the other, and the bookkeeping that says, per run, which
controllers got it and what the dispatcher was told.

    S (server side): pilotlight on 0.0.0.0, SRV_IP on a TUN device; the
        dispatcher reaches it over S's own loopback, so only the controllers'
        path is impaired.
    C (controller side): CTL_IPS on the other TUN device, so controllers can
        come from distinct addresses (and one address can vanish alone).

Controllers run as processes inside C and print one JSON line per event;
{"ev": "run", "ctl": ID, "run": RUN_ID} is a receipt: that controller's
client parsed the whole payload and would start the run. Two kinds come from
here (`python3 impair.py controllers SPEC`): "keep" polls again on its
connection after a run, "close" closes it and polls on a new one. Trigger.dev's
own WarmStartClient runs from tests/compat/controllers.mjs.

Standard library only, plus conftest's helpers. Everything made here is
removed again: ImpairedNet is a context manager, and the wire exits with the
process that started it.
"""
import bisect
import ctypes
import fcntl
import json
import math
import os
import queue
import random
import re
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
COMPAT = REPO_ROOT / "tests" / "compat"
SRV_IP = "10.78.0.1"
CTL_IPS = [f"10.78.1.{i}" for i in range(1, 9)]
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def raise_fd_limit(want=8192):
    """Raises this process's soft limit on open files to <want> (or the
    hard limit, if lower): hundreds of connections in the tests' process,
    and in the servers it starts, which inherit the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        want = min(hard, want)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# --------------------------------------------------------------------------
# Namespaces
# --------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def log_file():
    """A temporary file for a child's stderr, which the test reads while the
    child writes: opened for appending, so the child's writes land at the
    end whatever offset the reader's seek(0) left in the file description
    they share (without it, a line written between that seek and the read
    overwrote the file's start)."""
    f = tempfile.TemporaryFile()
    fcntl.fcntl(f, fcntl.F_SETFL, fcntl.fcntl(f, fcntl.F_GETFL) | os.O_APPEND)
    return f


def child_in(ns, idle=False, hosts=None):
    """A preexec_fn: the child runs in <ns> and is killed if the thread that
    started it dies, so nothing outlives a test run that was killed.
    <idle>: it runs under SCHED_IDLE (see run_cells' <apart>); <hosts>: it
    sees that file as /etc/hosts (private_hosts)."""
    private = private_hosts(hosts) if hosts else None

    def setup():
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        enter(ns)
        if private:
            private()
        if idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    return setup


CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def private_hosts(path):
    """A preexec_fn: the child sees <path> as /etc/hosts, in a mount
    namespace of its own (root). The bind mount holds <path>'s inode:
    change the file in place, never by replacing it."""
    def setup():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNS) != 0 or \
                libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0 or \
                libc.mount(str(path).encode(), b"/etc/hosts", None, MS_BIND, None) != 0:
            raise OSError(ctypes.get_errno(), "private /etc/hosts")
    return setup


def enter(ns):
    """Moves the calling thread into network namespace <ns>; sockets it
    opens from then on belong there, whichever thread uses them later."""
    fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


def in_ns(ns, fn, *args, timeout=30):
    """fn(*args) on a fresh thread inside <ns>; its value or its exception."""
    out = {}

    def run():
        try:
            enter(ns)
            out["value"] = fn(*args)
        except BaseException as e:  # handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} in {ns} took over {timeout} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def why_unavailable():
    """Why this machine cannot run the harness, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces and /dev/net/tun need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError as e:
        return f"/dev/net/tun is not usable: {e}"
    return None


def fitted_rtt(want_ms, measured_ms):
    """The RTT to ask of the wire for a path of <want_ms>, when asking
    for <want_ms> measured <measured_ms>: the wire's own cost adds to any
    delay alike, so one step takes it off (never below no delay at all,
    and never adding delay the wire did not lose)."""
    return max(0.0, want_ms - max(0.0, measured_ms - want_ms))


def wire_binary(server_bin):
    """pl-wire from the build beside <server_bin> (or ./build); None if not built."""
    if os.environ.get("PL_WIRE_BIN"):
        return os.environ["PL_WIRE_BIN"]
    real = os.environ.get("PL_VALGRIND_BIN", server_bin)
    for d in (Path(real).resolve().parent, REPO_ROOT / "build"):
        p = d / "tests" / "pl-wire"
        if os.access(p, os.X_OK):
            return str(p)
    return None


def lateness_binary(wire_bin):
    """pl-lateness from the build of <wire_bin>; None if not built."""
    p = Path(wire_bin).parent / "pl-lateness"
    return str(p) if os.access(p, os.X_OK) else None


class Lateness:
    """How late the machine woke a SCHED_FIFO timer on each CPU while it ran
    (tests/impair/lateness.c): every wake-up a millisecond or more past due
    is a stretch in which the machine, not the program measured, held
    things up. stop() returns {"wakeups", "late", "worst_ms", "stalls":
    [(from, to)] in time.monotonic() seconds, any CPU}."""

    def __init__(self, binary, period_us=1000, threshold_us=1000):
        self.proc = subprocess.Popen([binary, str(period_us), str(threshold_us)],
                                     stdout=subprocess.PIPE, text=True)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        out, _ = self.proc.communicate(timeout=10)
        return read_lateness(out)


def read_lateness(text):
    """pl-lateness's output as Lateness.stop() returns it."""
    f = {"wakeups": 0, "late": 0, "worst_ms": 0.0, "stalls": []}
    for line in text.splitlines():
        w = line.split()
        if w[:1] == ["#"] and len(w) == 7:
            f["wakeups"], f["late"], f["worst_ms"] = int(w[2]), int(w[4]), int(w[6]) / 1e6
        elif len(w) == 3:
            due, late = int(w[1]) / 1e9, int(w[2]) / 1e9
            f["stalls"].append((due, due + late))
    return f


def met_stalls(windows, stalls):
    """How many of <windows> [(start, end)] overlap one of <stalls>
    [(from, to)], the same clock."""
    return sum(any(s < b and a < e for s, e in stalls) for a, b in windows)


def _ip(*args):
    p = subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


class Wire:
    """A running pl-wire: one command a line, one answer a line."""

    def __init__(self, binary, ns_a, dev_a, ns_b, dev_b, seed=1, max_runtime_s=900, mtu=1500):
        # The wire dies with the thread that starts it (PR_SET_PDEATHSIG
        # follows the thread): start it from one that lives as long, such
        # as the main thread.
        self.proc = subprocess.Popen(
            [binary, "--seed", str(seed), "--max-runtime-s", str(max_runtime_s),
             "--mtu", str(mtu), ns_a, dev_a, ns_b, dev_b],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1)
        line = self._line(10)
        if line != "ready":
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            self.close()
            raise RuntimeError(f"pl-wire did not start: {line!r} {err}")

    def _line(self, timeout):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError("pl-wire did not answer")
        return self.proc.stdout.readline().strip()

    def cmd(self, line):
        """Sends one command; returns the text after "ok"; raises on "error"."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self._line(5)
        if not reply.startswith("ok"):
            raise RuntimeError(f"pl-wire: {line!r} -> {reply!r}")
        return reply[2:].strip()

    def stats(self):
        return {k: int(v) for k, v in (f.split("=") for f in self.cmd("stats").split())}

    def realtime(self, on):
        """Runs the wire under SCHED_FIFO (<on>) or as an ordinary process.
        Returns whether the policy asked for holds (setting it needs root
        or CAP_SYS_NICE)."""
        policy, prio = (os.SCHED_FIFO, 1) if on else (os.SCHED_OTHER, 0)
        try:
            os.sched_setscheduler(self.proc.pid, policy, os.sched_param(prio))
        except OSError:
            return False
        return True

    def close(self):
        """Ends the wire; raises if it left a sanitizer report (an ASan
        build of the suite builds the wire with ASan too)."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # end of input: the wire exits
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        err = self.proc.stderr.read()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass
        if any(mark in err for mark in ("Sanitizer", "runtime error:")):
            raise AssertionError(f"pl-wire: sanitizer report:\n{err[-4000:]}")


def sweep_namespaces():
    """Deletes the namespaces a killed run of this harness left behind: ours
    are named after the pid that made them, and that process is gone."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    for line in out.stdout.splitlines():
        m = re.match(r"(pl-i[sc](\d+))\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            subprocess.run(["ip", "netns", "del", m.group(1)], capture_output=True, timeout=10)


class ImpairedNet:
    """Namespaces S and C joined by a pl-wire; direction "ab" is S -> C.
    <mtu>: the TUN devices' MTU (1500, as Ethernet; 9001, as an AWS VPC).
    Use as a context manager: namespaces and wire go away on exit, also
    after a failure."""

    def __init__(self, wire_bin, seed=1, mtu=1500):
        pid = os.getpid()
        self.srv, self.ctl = f"pl-is{pid}", f"pl-ic{pid}"
        self.srv_dev, self.ctl_dev = f"plis{pid}", f"plic{pid}"
        self.mtu, self.wire_bin = mtu, wire_bin
        self.wire = None
        sweep_namespaces()
        try:
            _ip("netns", "add", self.srv)
            _ip("netns", "add", self.ctl)
            self.wire = Wire(wire_bin, self.srv, self.srv_dev, self.ctl, self.ctl_dev, seed,
                             mtu=mtu)
            for ns in (self.srv, self.ctl):
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", self.srv, "link", "set", self.srv_dev, "mtu", str(mtu))
            _ip("-n", self.ctl, "link", "set", self.ctl_dev, "mtu", str(mtu))
            _ip("-n", self.srv, "addr", "add", f"{SRV_IP}/32", "dev", self.srv_dev)
            for a in CTL_IPS:
                _ip("-n", self.ctl, "addr", "add", f"{a}/32", "dev", self.ctl_dev)
            _ip("-n", self.srv, "link", "set", self.srv_dev, "up")
            _ip("-n", self.ctl, "link", "set", self.ctl_dev, "up")
            _ip("-n", self.srv, "route", "add", "10.78.1.0/24", "dev", self.srv_dev,
                "src", SRV_IP)
            _ip("-n", self.ctl, "route", "add", "10.78.0.0/24", "dev", self.ctl_dev,
                "src", CTL_IPS[0])
        except BaseException:
            self.remove()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def remove(self):
        wire, self.wire = self.wire, None
        try:
            if wire is not None:
                wire.close()
        finally:
            for ns in (self.srv, self.ctl):
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)

    def shape(self, rtt_ms=0.0, jitter_ms=0.0, loss=0.0, ackloss=0.0, seed=1):
        """Symmetric impairment: half the RTT each way, up to <jitter_ms>
        more per packet, <loss> of all packets and <ackloss> of pure ACKs
        lost in each direction; blackholes off, counters zeroed."""
        w = self.wire
        w.cmd(f"delay both {rtt_ms * 500:.0f}")
        w.cmd(f"jitter both {jitter_ms * 1000:.0f}")
        w.cmd(f"loss both {loss}")
        w.cmd(f"ackloss both {ackloss}")
        w.cmd("drop all off")
        for a in CTL_IPS:
            w.cmd(f"drop ip {a} off")
        w.cmd(f"seed {seed}")
        w.cmd("reset")

    def fit_rtt(self, rtt_ms, samples=15):
        """Takes off the wire's delay what the wire itself adds, so that
        the RTT the kernel measures over a handshake is <rtt_ms>: pl-wire
        wakes to read a packet and again when it is due, and on a virtual
        machine most of those wake-ups come 0.1 ms or more late (the
        median), 0.1-0.4 ms a round trip that a real path of that RTT does
        not have (docs/notes/2026-12-05-wire-rtt.md). Call after shape(); the
        jitter stays and counts in the RTT. Measures against a listener of
        S's own, sets the delay and returns (the RTT asked of the wire,
        the RTT then measured)."""
        ls = in_ns(self.srv, lambda: socket.create_server((SRV_IP, 0), backlog=2 * samples + 8))
        try:
            port = ls.getsockname()[1]
            asked = fitted_rtt(rtt_ms, self.connect_rtt_ms(port, samples))
            self.wire.cmd(f"delay both {asked * 500:.0f}")
            return asked, self.connect_rtt_ms(port, samples)
        finally:
            ls.close()

    def drop_all(self, on=True):
        self.wire.cmd(f"drop all {'on' if on else 'off'}")

    def drop_ip(self, addr, on=True):
        self.wire.cmd(f"drop ip {addr} {'on' if on else 'off'}")

    def connect_rtt_ms(self, port, samples=5, loopback=False):
        """The RTT the kernel measured over a handshake from C to the
        server (TCP_INFO), median of <samples>: what the wire's settings
        amount to, the wire's own wake-up latency included. <loopback>:
        from S to its own loopback instead."""
        def go():
            out = []
            for _ in range(samples):
                s = socket.create_connection(("127.0.0.1" if loopback else SRV_IP, port),
                                             timeout=10)
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
                out.append(struct.unpack_from("I", info, 68)[0] / 1000)  # tcpi_rtt, us
                s.close()
            return sorted(out)[len(out) // 2]
        return in_ns(self.srv if loopback else self.ctl, go)


def capture_files(path):
    """The files of a run_cells capture at <path> (the controllers' side):
    {"controllers", "server", "runs"}."""
    stem = path[:-4] if path.endswith(".txt") else path
    return {"controllers": path, "server": stem + ".server.txt", "runs": stem + ".runs.json"}


LEGS = ("to_wire", "out", "ack", "back", "answer")


def capture_segments(path):
    """A capture file's segments: (time, src, dst, flags, seq, ack, len)."""
    segs = []
    for ln in open(path):
        t, src, _, dst, flags, seq, ack, n = ln.split()
        segs.append((float(t), src, dst, flags, int(seq[4:]), int(ack[4:]), int(n[4:])))
    return segs


def run_legs(runs, ctl, srv, server):
    """Splits each answered run's time where it went, from the dispatches
    (<runs>, a capture's "runs" file) and the segments on both TUN devices
    (<ctl>, <srv>: capture_segments()). Per run, in ms: to_wire, from the
    dispatch to its answer's last segment entering the wire on the server's
    side (the dispatcher and the broker); out, that segment's crossing;
    ack, the controller's kernel, from its arrival to the ACK of its last
    byte; back, that ACK's crossing; answer, from the ACK's arrival to the
    dispatcher reading its answer (`confirm` only: `written` answers before
    the run crosses). Returns {mode: [{leg: ms, "latency": ms}]}."""
    from_srv, by_conn_ctl, by_conn_srv = {}, {}, {}
    for t, src, dst, _, seq, ack, n in srv:
        by_conn_srv.setdefault((src, dst), []).append((t, seq, ack, n))
        if n > 0 and src.startswith(server + ":"):
            from_srv.setdefault(int(src.rpartition(":")[2]), []).append((t, src, dst, seq, n))
    for t, src, dst, _, seq, ack, n in ctl:
        by_conn_ctl.setdefault((src, dst), []).append((t, seq, ack, n))
    out = {}
    for r in sorted(runs.values(), key=lambda r: r["sent"]):
        data = from_srv.get(r["port"], [])
        if r["answer"] is not True or not data:
            continue
        i = bisect.bisect_left(data, (r["sent"],))
        if i == len(data) or data[i][0] > r["sent"] + r["latency"] + 0.05:
            continue
        t0, src, dst = data[i][:3]
        # the answer: its segments on that connection within 2 ms (head, body)
        last = [d for d in data[i:i + 8] if (d[1], d[2]) == (src, dst) and d[0] - t0 < 0.002][-1]
        end = (last[3] + last[4]) % 2**32
        arrived = next((s[0] for s in by_conn_ctl.get((src, dst), ())
                        if s[1] == last[3] and s[3] > 0 and s[0] >= last[0]), None)
        ack = next((s for s in by_conn_ctl.get((dst, src), ())
                    if arrived is not None and s[0] >= arrived
                    and (s[2] - end) % 2**32 < 2**31), None)
        back = ack and next((s[0] for s in by_conn_srv.get((dst, src), ())
                             if s[1:] == ack[1:] and s[0] >= ack[0]), None)
        if back is None:
            continue
        answered = r["sent"] + r["latency"]
        legs = {"latency": r["latency"] * 1000, "to_wire": (last[0] - r["sent"]) * 1000,
                "out": (arrived - last[0]) * 1000, "ack": (ack[0] - arrived) * 1000,
                "back": (back - ack[0]) * 1000,
                "answer": (answered - back) * 1000 if r["mode"] == "confirm" else None}
        out.setdefault(r["mode"], []).append(legs)
    return out


def read_legs(path, server=SRV_IP):
    """run_legs() of the run_cells capture at <path> (capture_files()):
    (legs, the cell's RTT in ms)."""
    files = capture_files(path)
    with open(files["runs"]) as fh:
        cell = json.load(fh)
    return run_legs(cell["runs"], capture_segments(files["controllers"]),
                    capture_segments(files["server"]), server), cell["rtt_ms"]


def slow_bound_ms(rtt_ms, written_p90_ms):
    """When a `confirm` answer counts as slow, the bound it is held to: on a
    path of 1 ms or less, `written`'s p90 + 2 ms; farther, the RTT + 5 ms."""
    if rtt_ms > 1.0:
        return rtt_ms + 5.0
    return None if written_p90_ms is None else written_p90_ms + 2.0


def legs_figures(legs, rtt_ms):
    """A cell's run_legs() in figures. Per mode: "wire_rtt_ms", p50 / p90 /
    p99 of the wire's two crossings (out + back) per run, what the path's
    round trip was for the runs; "legs_p50_ms", each leg's median. For
    `confirm`, also "at_rtt_ms": p50 / p90 / p99 of its answer time with
    the two crossings taken as <rtt_ms>, the cell's RTT, instead of what
    the wire took (a lab wire's wake-ups have a tail a real path does not);
    "slow", its runs answered later than slow_bound_ms() (with `written`'s
    p90 where `written` ran), and "slow_beyond_ms", each leg's time beyond
    its median summed over them: where the slow runs' time went."""
    out = {}
    for mode, rows in legs.items():
        def q(values):
            v = sorted(values)
            return [percentile(v, p) for p in (50, 90, 99)]
        f = {"runs": len(rows), "wire_rtt_ms": q(r["out"] + r["back"] for r in rows),
             "legs_p50_ms": {k: percentile(sorted(r[k] for r in rows), 50) for k in LEGS
                             if rows[0][k] is not None}}
        if mode == "confirm":
            f["at_rtt_ms"] = q(r["latency"] - r["out"] - r["back"] + rtt_ms for r in rows)
            ref = q(r["latency"] for r in legs["written"])[1] if legs.get("written") else None
            bound = slow_bound_ms(rtt_ms, ref)
            if bound is not None:
                slow = [r for r in rows if r["latency"] > bound]
                f["slow"] = len(slow)
                f["slow_beyond_ms"] = {k: sum(max(0.0, r[k] - f["legs_p50_ms"][k]) for r in slow)
                                       for k in f["legs_p50_ms"]}
        out[mode] = f
    return out


class Capture:
    """The TCP segments crossing a TUN device, as a packet capture would list
    them: an AF_PACKET socket on <dev> inside <ns>, read by a thread until
    stop(), one line per segment written to <path>:

        TIME SRC:PORT > DST:PORT FLAGS seq=N ack=N len=N

    (TIME: seconds, CLOCK_REALTIME, as the kernel stamped the packet, not
    when this thread got to it; FLAGS from F S R P . as set)."""

    SO_TIMESTAMPNS = 35  # <asm-generic/socket.h>; not in the socket module

    def __init__(self, ns, dev, path):
        self.sock = in_ns(ns, lambda: socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM,
                                                    socket.htons(0x0003)))
        self.sock.bind((dev, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, self.SO_TIMESTAMPNS, 1)
        self.sock.settimeout(0.2)
        self.out = open(path, "w")
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            try:
                data, anc, _, _ = self.sock.recvmsg(65535, socket.CMSG_SPACE(16))
            except socket.timeout:
                continue
            except OSError:
                break
            t = time.time()
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == self.SO_TIMESTAMPNS and len(value) >= 16:
                    sec, nsec = struct.unpack("qq", value[:16])
                    t = sec + nsec / 1e9
            if len(data) < 40 or data[0] >> 4 != 4 or data[9] != socket.IPPROTO_TCP:
                continue
            ihl, total = (data[0] & 15) * 4, struct.unpack("!H", data[2:4])[0]
            sport, dport, seq, ack, off, fl = struct.unpack("!HHIIBB", data[ihl:ihl + 14])
            flags = "".join(c for b, c in ((1, "F"), (2, "S"), (4, "R"), (8, "P"), (16, "."))
                            if fl & b)
            self.out.write(f"{t:.6f} {socket.inet_ntoa(data[12:16])}:{sport} > "
                           f"{socket.inet_ntoa(data[16:20])}:{dport} {flags} seq={seq} "
                           f"ack={ack} len={total - ihl - (off >> 4) * 4}\n")

    def stop(self):
        self.running = False
        self.thread.join(2)
        self.sock.close()
        self.out.close()


# --------------------------------------------------------------------------
# HTTP on raw sockets
# --------------------------------------------------------------------------

class Closed(Exception):
    """The connection ended before a whole response; <partial> bytes came."""

    def __init__(self, partial):
        super().__init__(f"connection ended after {partial} bytes")
        self.partial = partial


def read_response(sock, buf=b""):
    """Reads one response with a Content-Length (or none) from <sock>;
    returns (status, body, rest of the buffer). Raises Closed."""
    while b"\r\n\r\n" not in buf:
        buf = _recv_more(sock, buf)
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    while len(buf) < length:
        buf = _recv_more(sock, buf, len(head) + 4)
    return status, buf[:length], buf[length:]


def _recv_more(sock, buf, before=0):
    try:
        data = sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError):
        data = b""
    if not data:
        raise Closed(before + len(buf))
    return buf + data


def poll_request(key, controller_id):
    """A controller's long poll, with the headers the real client sends."""
    dep, ver, cpu, mem = key
    js = lambda v: str(int(v)) if float(v).is_integer() else repr(float(v))  # noqa: E731
    return ("GET /warm-start HTTP/1.1\r\nHost: pilotlight\r\n"
            f"x-trigger-workload-controller-id: {controller_id}\r\n"
            f"x-trigger-deployment-id: {dep}\r\n"
            f"x-trigger-deployment-version: {ver}\r\n"
            f"x-trigger-machine-cpu: {js(cpu)}\r\n"
            f"x-trigger-machine-memory: {js(mem)}\r\n"
            "x-trigger-worker-instance-name: impaired-node\r\n\r\n").encode()


def dispatch_body(message):
    body = json.dumps({"dequeuedMessage": message}).encode()
    return (b"POST /warm-start HTTP/1.1\r\nHost: pilotlight\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def answer_of(status, body):
    """didWarmStart from a dispatch response; None for anything a
    supervisor would not read as an answer."""
    if status != 200:
        return None
    try:
        v = json.loads(body).get("didWarmStart")
    except ValueError:
        return None
    return v if isinstance(v, bool) else None


# --------------------------------------------------------------------------
# Server, dispatcher, controllers
# --------------------------------------------------------------------------

def ns_request(ns, port, raw, timeout=10):
    """One request from inside <ns> to its loopback; (status, body)."""
    def go():
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        try:
            s.sendall(raw)
            status, body, _ = read_response(s)
            return status, body
        finally:
            s.close()
    return in_ns(ns, go)


class Dispatcher:
    """Dispatches from inside the server namespace, open loop: run i leaves
    at start + i / rate whatever became of the earlier ones, as dequeued
    runs do. Each worker keeps its connection to each server (a
    supervisor's pool does); <port> is the server a job names none of."""

    def __init__(self, ns, port, workers=48, timeout=60):
        self.ns, self.port, self.timeout = ns, port, timeout
        self.jobs = queue.Queue()
        self.results = {}  # run id -> (answer or None, latency s, error or None)
        self.started = {}  # run id -> time.monotonic() when it was sent
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self):
        enter(self.ns)
        conns = {}  # port -> [socket, bytes read past the last answer]
        while True:
            job = self.jobs.get()
            if job is None:
                break
            run_id, raw, port = job
            t0 = time.monotonic()
            self.started[run_id] = t0
            answer, err = None, None
            try:
                if port not in conns:
                    conns[port] = [socket.create_connection(("127.0.0.1", port),
                                                            timeout=self.timeout), b""]
                conn = conns[port]
                conn[0].sendall(raw)
                status, body, conn[1] = read_response(conn[0], conn[1])
                answer = answer_of(status, body)
                if answer is None:
                    err = f"status {status} body {body[:200]!r}"
            except (OSError, Closed) as e:
                err = repr(e)
                if port in conns:
                    conns.pop(port)[0].close()
            with self.lock:
                self.results[run_id] = (answer, time.monotonic() - t0, err)
        for sock, _ in conns.values():
            sock.close()

    def run(self, jobs, rate):
        """Sends [(run_id, message)] or [(run_id, message, port)] at <rate>
        a second; returns once every one is answered (or failed), with
        self.results filled in."""
        start = time.monotonic()
        for i, (run_id, message, *port) in enumerate(jobs):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self.jobs.put((run_id, dispatch_body(message), port[0] if port else self.port))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.results) >= len(jobs):
                    break
            time.sleep(0.02)
        return self.results

    def close(self):
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join(5)


class NsServer:
    """pilotlight inside the server namespace (conftest's Server does the
    start, the log and the clean-exit checks)."""

    def __init__(self, server_cls, ns, *args, binary=None):
        self.ns = ns
        self.srv = server_cls(["--listen", "0.0.0.0:0"] + list(args), listen=False,
                              preexec_fn=child_in(ns), binary=binary)
        self.port = self.srv.port

    def get(self, path):
        return ns_request(self.ns, self.port,
                          f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

    def metrics(self, metrics_cls):
        status, body = self.get("/metrics")
        assert status == 200, (status, body[:300])
        return metrics_cls(body.decode())

    def stop(self):
        self.srv.stop()


class ControllerProcess:
    """A process of controllers inside C; collects the JSON lines it prints
    (receipts and other events) as they come."""

    def __init__(self, ns, argv, idle=False, hosts=None):
        self.events = []
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=child_in(ns, idle, hosts))
        self.stderr_tail = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.err_reader = threading.Thread(target=self._read_err, daemon=True)
        self.err_reader.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                self.events.append({"ev": "noise", "line": line.strip()})

    def _read_err(self):
        for line in self.proc.stderr:
            self.stderr_tail.append(line)
            del self.stderr_tail[:-40]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        self.err_reader.join(5)


def raw_controllers(ns, port, controllers, work_ms, seed, max_runtime_s=300, host=SRV_IP,
                    idle=False):
    """Our own controllers ("keep" and "close"), one thread each, in <ns>
    (C), talking to <host>; <idle>: under SCHED_IDLE."""
    spec = {"host": host, "port": port, "controllers": controllers,
            "work_ms": work_ms, "seed": seed, "max_runtime_s": max_runtime_s}
    return ControllerProcess(ns, [sys.executable, str(Path(__file__).resolve()),
                                  "controllers", json.dumps(spec)], idle=idle)


def node_controllers(ns, port, controllers, work_ms, max_runtime_s=300, host=SRV_IP,
                     connect_each_poll=False, idle=False, own_pools=False):
    """Trigger.dev's WarmStartClient, one per controller, in one node process
    in <ns> (C), talking to <host>; <connect_each_poll>: each calls /connect
    before every poll, as Trigger.dev's run controller does; <idle>: under
    SCHED_IDLE. node's fetch keeps one pool of connections per origin, so
    the clients share one, and a poll goes out on whichever kept connection
    is free. <own_pools>: each client names the server by a host name of its
    own (the process's private /etc/hosts maps them all to <host>), so each
    keeps its connections to itself, as a run controller in its own
    container does."""
    spec = {"url": f"http://{host}:{port}", "controllers": controllers,
            "work_ms": work_ms, "max_runtime_s": max_runtime_s,
            "connect_each_poll": connect_each_poll}
    argv = [shutil.which("node"), str(COMPAT / "controllers.mjs")]
    if not own_pools:
        return ControllerProcess(ns, argv + [json.dumps(spec)], idle=idle)
    names = [f"c{i}.pl-fleet" for i in range(len(controllers))]
    spec["controllers"] = [dict(c, url=f"http://{n}:{port}") for c, n in zip(controllers, names)]
    with tempfile.NamedTemporaryFile("w", prefix="pl-fleet-hosts.", delete=False) as f:
        f.write("127.0.0.1 localhost\n" + "".join(f"{host} {n}\n" for n in names))
    try:  # the child's bind mount holds the file once it runs
        return ControllerProcess(ns, argv + [json.dumps(spec)], idle=idle, hosts=f.name)
    finally:
        os.unlink(f.name)


def ensure_node_modules():
    """npm ci in tests/compat if @trigger.dev/core is missing; a reason
    string when node or npm is not there, else None."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "node/npm are not installed: the real WarmStartClient needs them"
    if (COMPAT / "node_modules" / "@trigger.dev" / "core" / "package.json").exists():
        return None
    proc = subprocess.run([shutil.which("npm"), "ci", "--no-audit", "--no-fund"], cwd=COMPAT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"npm ci failed:\n{proc.stdout}\n{proc.stderr}")
    return None


# --------------------------------------------------------------------------
# What a cell measured
# --------------------------------------------------------------------------

def percentile(sorted_values, p):
    """Nearest-rank percentile of an ascending list (None if empty)."""
    if not sorted_values:
        return None
    k = math.ceil(p / 100 * len(sorted_values)) - 1
    return sorted_values[max(0, min(len(sorted_values) - 1, k))]


def tally(run_ids, answers, receipts):
    """The figures of one cell. <answers>: run id -> (answer, latency s,
    error); <receipts>: [(controller id, run id)].

    duplicates: runs that reached two controllers or more (or one twice);
    excess: starts beyond what the answer allows, summed over the runs (a
    true run may start once, a false one is cold-started by the supervisor
    and may start no time warm);
    false_received: answered false, yet a controller got the run;
    true_unreceived: answered true, and no controller got it;
    lost: no controller got it and the dispatcher was not told false: a
    true, or no answer at all (a supervisor waits on a dispatch with no
    timeout of its own);
    errors: dispatches without a well-formed answer;
    stray: receipts for runs never dispatched (a harness fault)."""
    got = {}
    for ctl, run in receipts:
        got.setdefault(run, []).append(ctl)
    f = {"dispatches": len(run_ids), "true": 0, "false": 0, "errors": 0, "duplicates": 0,
         "excess": 0, "false_received": 0, "true_unreceived": 0, "lost": 0,
         "stray": sum(1 for r in got if r not in answers)}
    lat = []
    for run in run_ids:
        answer, latency, _ = answers.get(run, (None, None, "no result"))
        n = len(got.get(run, ()))
        f["true" if answer is True else "false" if answer is False else "errors"] += 1
        f["duplicates"] += n >= 2
        f["excess"] += max(0, n - (answer is True))
        f["false_received"] += answer is False and n >= 1
        f["true_unreceived"] += answer is True and n == 0
        f["lost"] += answer is not False and n == 0
        if answer is not None:
            lat.append(latency * 1000)
    lat.sort()
    for p in (50, 90, 99):
        f[f"p{p}_ms"] = percentile(lat, p)
    f["max_ms"] = lat[-1] if lat else None
    return f


# --------------------------------------------------------------------------
# One cell of the matrix
# --------------------------------------------------------------------------

def key_of(k):
    return (f"deployment_imp{k}", "20261130.1", 0.5, 1)


def fleet(keys, per_key, node_keys=()):
    """Controller specs: <per_key> controllers on each of <keys> keys; keys
    in <node_keys> get the real WarmStartClient, the others our raw ones,
    alternately "keep" and "close", spread over the controller addresses.
    Returns (raw specs, node specs)."""
    raw, node = [], []
    for k in range(keys):
        for j in range(per_key):
            if k in node_keys:
                node.append({"id": f"ctl_node_k{k}_{j}", "key": key_of(k)})
            else:
                kind = "keep" if j % 2 == 0 else "close"
                raw.append({"id": f"ctl_{kind}_k{k}_{j}", "key": key_of(k), "kind": kind,
                            "bind": CTL_IPS[(k * per_key + j) % len(CTL_IPS)]})
    return raw, node


def metric_family(m, name, label):
    """{label value: count} of one counter family (empty if absent)."""
    out = {}
    for (n, labels), v in m.samples.items():
        if n == name and v:
            out[dict(labels).get(label, "")] = int(v)
    return out


def run_cell(net, mode, server_args=(), **kw):
    """run_cells() for one mode: its figures."""
    return run_cells(net, [mode], server_args, **kw)[mode]


def run_cells(net, modes, server_args=(), *, rtt_ms=0.0, jitter_ms=0.0, loss=0.0, ackloss=0.0,
              keys=4, per_key=10, node_keys=(), dispatches=150, rate=25.0,
              work_ms=(500, 1500), seed=1, tag="cell", payload_bytes=0, loopback=False,
              binary=None, connect_each_poll=False, process_each=False, own_pools=False,
              capture=None, apart=False, exact_rtt=False, lateness=False):
    """Runs one cell per mode of <modes>, all at once: shapes the wire,
    starts a pilotlight per mode in S with --delivery <mode>, a fleet per
    pilotlight in C, and <dispatches> runs with unique ids for each at
    <rate> a second round-robin over the keys, the pilotlights taking turns
    run by run; waits for the receipts; stops everything. Returns {mode:
    figures}, the figures a dict: tally()'s for all runs, "by_group" (the
    same for runs of raw and of node keys), the measured connect RTT, the
    wire's counters ("wire": with several modes, the bytes, segments and
    ACKs to and from that pilotlight's port; "wire_all": the whole wire's),
    the broker's counters, and the wall time. Modes run
    together are compared in the same seconds of a machine whose speed
    comes and goes for seconds at a time, not in cells half a minute apart.

    <payload_bytes>: each run's DequeuedMessage is padded to about that
    many bytes (a W3C tracestate in its trace context, which real runs
    carry in varying sizes); 0 leaves the example as it is. <loopback>: the
    fleet runs in S and reaches pilotlight over S's loopback, not the wire
    (which then carries nothing). <binary>: the server to run (conftest's
    BIN when None). <connect_each_poll>: the real client's controllers call
    /connect before every poll (node_controllers). <process_each>: each of
    them runs in a node process of its own, with a connection pool of its
    own, as each run controller does in its container (else one process,
    and one pool, serves a pilotlight's fleet). <own_pools>: one process,
    but a pool per controller (node_controllers). <capture>: a file to list
    every TCP segment the controllers' TUN device carries in (Capture);
    beside it, capture_files()' "server" lists the server's TUN device's,
    and its "runs" the cell's RTT and its dispatches (JSON: {"rtt_ms",
    "runs": run id -> mode, the server's port, when sent in CLOCK_REALTIME
    seconds as the captures stamp, latency in seconds, answer}), so that a
    run's time can be split where it went (run_legs()).

    <apart>: the controllers' side as if on machines of its own, as in a
    cluster: the controllers run under SCHED_IDLE and the wire under
    SCHED_FIFO. Sharing this machine's CPUs as equals, a controller
    handling a run it has just received holds a CPU for a millisecond or
    two, the moment its ACK reaches the broker and the broker must wake to
    answer; the scheduler can queue the broker behind it (with the other
    CPU idle), a wait no real network has, which only `confirm` pays
    (`written` answers before the run arrives). SCHED_IDLE gives them only
    CPU time nobody else wants, and a waking broker, wire or dispatcher
    takes their CPU at once; the wire then delays packets by what it was
    asked, not by a wait for a CPU. Figures say which ("apart").

    <exact_rtt>: the path's RTT is <rtt_ms> as the kernel measures it over
    a handshake, not <rtt_ms> and what the wire's own wake-ups add to it
    (ImpairedNet.fit_rtt). Figures carry the RTT asked of the wire
    ("wire_rtt_ms"; <rtt_ms> without exact_rtt).

    <lateness>: pl-lateness runs while the runs are dispatched (Lateness),
    and each mode's figures say, under "machine", how many of its wake-ups
    were a millisecond or more late, and how many of the mode's runs, and
    of those answered later than slow_bound_ms(), were in flight during
    one ("runs_met_late", "slow", "slow_met_late")."""
    if str(REPO_ROOT / "tests") not in sys.path:  # run from loadtest/
        sys.path.insert(0, str(REPO_ROOT / "tests"))
    from conftest import EXAMPLE, Metrics, Server  # the suite's helpers

    wall = time.monotonic()
    net.shape(rtt_ms=rtt_ms, jitter_ms=jitter_ms, loss=loss, ackloss=ackloss, seed=seed)
    apart = apart and net.wire.realtime(True)  # else: shared, and said so
    if not apart:
        net.wire.realtime(False)
    wire_rtt = net.fit_rtt(rtt_ms)[0] if exact_rtt and rtt_ms > 0 and not loopback else rtt_ms
    together = len(modes) > 1
    servers, procs, disp, cap = {}, {m: [] for m in modes}, None, None
    ns, host = (net.srv, "127.0.0.1") if loopback else (net.ctl, SRV_IP)
    jobs, group, measured_rtt, m = {}, {}, {}, {}
    probe = machine = None
    try:
        net.wire.cmd("count port off")
        for mode in modes:
            servers[mode] = NsServer(Server, net.srv, "--delivery", mode, *server_args,
                                     binary=binary)
            if together:
                net.wire.cmd(f"count port {servers[mode].port}")
        cap = [Capture(net.ctl, net.ctl_dev, capture),
               Capture(net.srv, net.srv_dev, capture_files(capture)["server"])] \
            if capture and not loopback else None
        for mode, srv in servers.items():
            measured_rtt[mode] = net.connect_rtt_ms(srv.port, loopback=loopback)
        if together:
            net.wire.cmd("reset")  # the handshakes just measured are no cell's
        raw, node = fleet(keys, per_key, node_keys)
        if loopback:
            for c in raw:
                c["bind"] = "127.0.0.1"
        want = len(raw) + len(node)
        for mode, srv in servers.items():
            if raw:
                procs[mode].append(raw_controllers(ns, srv.port, raw, work_ms, seed, host=host,
                                                   idle=apart))
            for grp in ([[c] for c in node] if process_each else [node] if node else []):
                procs[mode].append(node_controllers(ns, srv.port, grp, work_ms, host=host,
                                                    connect_each_poll=connect_each_poll,
                                                    idle=apart, own_pools=own_pools))
        # node processes start slowly under SCHED_IDLE: with one per
        # controller (process_each), 40 of them took more than 30 s
        deadline = time.monotonic() + 30 + sum(len(p) for p in procs.values())
        for mode, srv in servers.items():
            while srv.metrics(Metrics).parked_now < want:
                if time.monotonic() > deadline or any(p.proc.poll() is not None
                                                      for p in procs[mode]):
                    tails = "".join("".join(p.stderr_tail) for p in procs[mode])
                    raise AssertionError(f"{want} controllers did not park; stderr:\n"
                                         f"{tails[-3000:]}")
                time.sleep(0.1)

        for mode, srv in servers.items():
            jobs[mode] = []
            for i in range(dispatches):
                k = i % keys
                dep, ver, cpu, mem = key_of(k)
                msg = json.loads(json.dumps(EXAMPLE))
                msg["deployment"]["friendlyId"] = dep
                msg["backgroundWorker"]["version"] = ver
                msg["run"]["machine"]["cpu"], msg["run"]["machine"]["memory"] = cpu, mem
                run_id = f"run_{tag}_{mode}_{i:04d}" if together else f"run_{tag}_{i:04d}"
                msg["run"]["id"], msg["run"]["friendlyId"] = run_id[4:], run_id
                short = payload_bytes - len(json.dumps(msg)) - len(', "tracestate": ""')
                if short > 0:
                    msg["run"]["traceContext"]["tracestate"] = "pl=" + "0" * (short - 3)
                jobs[mode].append((run_id, msg, srv.port))
                group[run_id] = "node" if k in node_keys else "raw"
        disp = Dispatcher(net.srv, servers[modes[0]].port)
        lb = lateness_binary(net.wire_bin) if lateness else None
        probe = Lateness(lb) if lb else None
        answers = disp.run([job for turn in zip(*jobs.values()) for job in turn],
                           rate * len(modes))
        machine = probe.stop() if probe is not None else None
        probe = None

        def receipts(mode):
            return [(e["ctl"], e["run"]) for p in procs[mode] for e in list(p.events)
                    if e.get("ev") == "run"]
        # A true run's payload may still be on its way: wait for it, then a
        # little more for a late second copy of anything.
        trues = {r for r, (a, _, _) in answers.items() if a is True}
        deadline = time.monotonic() + 5 + rtt_ms / 100
        while (trues - {r for mode in modes for _, r in receipts(mode)}
               and time.monotonic() < deadline):
            time.sleep(0.05)
        time.sleep(1 + 4 * rtt_ms / 1000)
        for mode, srv in servers.items():
            m[mode] = srv.metrics(Metrics)
    finally:
        if probe is not None:
            probe.stop()
        if disp is not None:
            disp.close()
        for p in (p for ps in procs.values() for p in ps):
            p.stop()
        for srv in servers.values():
            srv.stop()
        for c in cap or ():
            c.stop()
    if cap is not None:
        off = time.time() - time.monotonic()
        runs = {r: {"mode": mode, "port": port, "sent": disp.started[r] + off,
                    "latency": answers[r][1], "answer": answers[r][0]}
                for mode in modes for r, _, port in jobs[mode]
                if r in disp.started and r in answers}
        with open(capture_files(capture)["runs"], "w") as fh:
            json.dump({"rtt_ms": rtt_ms, "runs": runs}, fh)
    wire = net.wire.stats()
    out = {}
    for mode in modes:
        got = receipts(mode)
        run_ids = [r for r, _, _ in jobs[mode]]
        f = tally(run_ids, answers, got)
        f["by_group"] = {g: tally([r for r in run_ids if group[r] == g], answers,
                                  [(c, r) for c, r in got if group.get(r) == g])
                         for g in sorted({group[r] for r in run_ids})}
        f["rtt_ms"] = measured_rtt[mode]
        f["wire_rtt_ms"] = wire_rtt
        f["apart"] = apart
        f["together"] = list(modes) if together else None
        f["wire"], f["wire_all"] = dict(wire), wire
        if together:  # this pilotlight's share of the wire, by its port
            pre = f"port{servers[mode].port}_"
            for d in ("ab", "ba"):
                for k in ("bytes", "segs", "acks"):
                    f["wire"][f"{d}_{k}"] = wire.get(f"{pre}{d}_{k}", 0)
        mm = m[mode]
        f["broker"] = {"dispatch": metric_family(mm, "pilotlight_dispatch_total", "result"),
                       "confirm": metric_family(mm, "pilotlight_confirm_total", "outcome"),
                       "method": metric_family(mm, "pilotlight_confirm_method_total", "method"),
                       "settled": metric_family(mm, "pilotlight_settled_total", "outcome")}
        # Cumulative counts of ACK reports by time from write (s, as "le").
        f["ack_reports"] = {dict(labels)["le"]: int(v) for (n, labels), v in mm.samples.items()
                            if n == "pilotlight_confirm_ack_seconds_bucket"}
        f["payload_bytes"] = len(json.dumps(jobs[mode][0][1])) if jobs[mode] else 0
        f["events"] = {}
        for p in procs[mode]:
            for e in p.events:
                if e.get("ev") not in ("run", "polling"):
                    f["events"][e["ev"]] = f["events"].get(e["ev"], 0) + 1
        f["wall_s"] = time.monotonic() - wall
        out[mode] = f
    if machine is not None:
        # Which runs were answered slowly, and whether the machine was slow
        # meanwhile: "slow" is beyond the bound `confirm` is held to.
        bound = slow_bound_ms(rtt_ms, out["written"]["p90_ms"] if "written" in out else None)
        for mode in modes:
            spans = [(disp.started[r], disp.started[r] + a[1]) for r, _, _ in jobs[mode]
                     if (a := answers.get(r)) and a[0] is not None and r in disp.started]
            slow = [w for w in spans if bound is not None and (w[1] - w[0]) * 1000 > bound]
            out[mode]["machine"] = {
                "wakeups": machine["wakeups"], "late": machine["late"],
                "worst_ms": machine["worst_ms"], "slow_bound_ms": bound,
                "runs_met_late": met_stalls(spans, machine["stalls"]),
                "slow": len(slow), "slow_met_late": met_stalls(slow, machine["stalls"])}
    return out


def show(request, text):
    """Writes <text> to the terminal even while pytest captures output, so
    a plain run shows the figures, passing or not (<request>: the test's)."""
    tr = request.config.pluginmanager.getplugin("terminalreporter")
    cm = request.config.pluginmanager.getplugin("capturemanager")
    if tr is None or cm is None:
        print(text)
        return
    with cm.global_and_fixture_disabled():
        tr.write_line("")
        for line in text.splitlines():
            tr.write_line(line)


def describe(f):
    """One cell's figures in one paragraph."""
    def ms(v):
        return "-" if v is None else f"{v:.1f}"
    w = f["wire"]
    lines = [
        f"{f['dispatches']} dispatches: {f['true']} true, {f['false']} false, {f['errors']} errors;"
        f" duplicates {f['duplicates']}, false-received {f['false_received']},"
        f" true-unreceived {f['true_unreceived']}, lost {f['lost']};"
        f" starts beyond the answer {f['excess']}",
        f"  latency p50/p90/p99 {ms(f['p50_ms'])}/{ms(f['p90_ms'])}/{ms(f['p99_ms'])} ms;"
        f" connect RTT {f['rtt_ms']:.2f} ms; wall {f['wall_s']:.1f} s"
        + ("; controllers apart (SCHED_IDLE, wire SCHED_FIFO)" if f.get("apart") else "")]
    for g, gf in f.get("by_group", {}).items():
        lines.append(f"  {g} keys: {gf['dispatches']} dispatches, {gf['true']} true;"
                     f" duplicates {gf['duplicates']}, false-received {gf['false_received']},"
                     f" true-unreceived {gf['true_unreceived']}, lost {gf['lost']}")
    lines.append(f"  wire: {w['ab_in'] + w['ba_in']} packets, lost {w['ab_lost'] + w['ba_lost']},"
                 f" pure ACKs lost {w['ab_acklost'] + w['ba_acklost']} of"
                 f" {w['ab_acks'] + w['ba_acks']}, overflow {w['ab_full'] + w['ba_full']};"
                 f" broker: {f['broker']}; controller events: {f['events']}")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Raw controllers, as a program (runs inside C)
# --------------------------------------------------------------------------

_out_lock = threading.Lock()


def _emit(**event):
    line = json.dumps(event)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _raw_controller(spec, c):
    """One controller: poll, take a run, work, poll again. "keep" polls
    again on its connection; "close" closes it after each run."""
    rng = random.Random(f"{spec['seed']}/{c['id']}")
    lo, hi = spec["work_ms"]
    key, sock, buf, first = tuple(c["key"]), None, b"", True
    while True:
        try:
            if sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind((c["bind"], 0))
                sock.connect((spec["host"], spec["port"]))
                buf = b""
            sock.sendall(poll_request(key, c["id"]))
            if first:
                _emit(ev="polling", ctl=c["id"])
                first = False
            status, body, buf = read_response(sock, buf)
        except (OSError, Closed) as e:
            # The broker reset or closed the connection before a whole
            # response: the client has nothing to act on; poll again.
            _emit(ev="ended", ctl=c["id"], why=repr(e))
            if sock is not None:
                sock.close()
            sock = None
            time.sleep(0.05)
            continue
        if status == 204:
            continue
        if status != 200:
            _emit(ev="status", ctl=c["id"], status=status)
            time.sleep(0.2)
            continue
        try:
            run = json.loads(body)["run"]["friendlyId"]
        except (ValueError, KeyError, TypeError):
            _emit(ev="bad_payload", ctl=c["id"], body=body[:200].decode("latin-1"))
            continue
        _emit(ev="run", ctl=c["id"], run=run, t=time.time())
        if c["kind"] == "close":
            sock.close()
            sock = None
        time.sleep(rng.uniform(lo, hi) / 1000)


def _controllers_main(spec):
    # SIGTERM ends us where we stand: every receipt is already printed.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    for c in spec["controllers"]:
        threading.Thread(target=_raw_controller, args=(spec, c), daemon=True).start()
    time.sleep(spec["max_runtime_s"])
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "controllers":
        _controllers_main(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: impair.py controllers SPEC_JSON")
