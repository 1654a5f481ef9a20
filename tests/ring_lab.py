"""ring_lab.py -- the key ring at work behind a Kubernetes-style L4 Service:
up to four pilotlight instances in a network namespace, a virtual IP in
front of them, controllers and a dispatcher that reach them only through it,
and the bookkeeping that says, per run, who received it and what the
dispatcher was told.

    The namespace (pl-ring<pid>): instance i listens on ADDRS[i]:PORT (loopback
        aliases), started with --ring-peers naming all four and --ring-self
        its own, and the drain delay a deployment would use.
    The Service: VIP:PORT, an nftables nat chain on the output hook that
        DNATs each new connection at random (numgen random mod N) to one of
        the instances in a map, as kube-proxy's nftables mode does; the
        established connections keep their instance (conntrack).
    The endpoints controller: a thread asking each instance's /readyz on a
        new connection every PROBE_MS (a readiness probe: one failure takes
        it out of the map, one success puts it in) and rewriting the map in
        one nft transaction when the ready set changes.
    Controllers: Trigger.dev's own WarmStartClient (tests/compat/
        controllers.mjs) and light ones from here (`python3 ring_lab.py
        controllers SPEC`) that behave as that client does (below). Each
        prints a receipt per run it gets.
    The dispatcher: open loop at a fixed rate, unique run ids, each POST
        through the VIP and, on a 307, the same body to the Location, as the
        supervisor's fetch does; each answer recorded with the instance that
        gave it (the VIP's choice is read back from conntrack).

What the light controllers model of WarmStartClient.warmStart() (4.8.3):
each poll is a GET of VIP/warm-start; a 307 is followed at once with every
header kept; a 2xx with a run is a receipt, and the controller polls again
at once (its "work" takes no time, so the fleet stays parked); a non-2xx
answer ends the poll (warmStart returns null) and it polls again at once;
its own timeout (connectionTimeoutMs from /connect) aborts the request and
polls again at once; a network error (refused, reset, closed) and a 2xx
without a JSON body (a 204) wait round(random() * 2^n) seconds, n counting
the errors of this poll from 0 (the client's FullJitter back-off). One kept
connection per origin, reused while it has not been closed by the other end.

Standard library only (importable by a test and by loadtest/ring-scale).
Everything made here is removed again: Lab is a context manager, and every
process it starts dies with the thread that started it.
"""
import asyncio
import calendar
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import impair  # noqa: E402  (namespaces, processes in them, node_modules)

REPO_ROOT = HERE.parent
COMPAT = REPO_ROOT / "tests" / "compat"
EXAMPLE_PATH = HERE / "blackbox" / "data" / "dequeued-message.json"
ADDRS = [f"10.77.0.{i}" for i in range(1, 5)]
VIP = "10.77.0.100"
PORT = 8080
PROBE_MS = 200
DRAIN_DELAY_MS = 2000  # as deploy/kubernetes/configmap.yaml and the Compose file set it
SANITIZER_MARKS = ("AddressSanitizer", "runtime error:", "LeakSanitizer")

impair.raise_fd_limit()


def why_unavailable():
    """Why this machine cannot run the lab, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces and nftables need root"
    for tool, pkg in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed ({pkg}; deploy/install-deps.sh --test installs it)"
    # The kernel may lack nf_tables or its NAT (a container, a trimmed kernel).
    ns = f"pl-ringchk{os.getpid()}"
    try:
        _run("ip", "netns", "add", ns)
        _run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=(
            "table ip chk {\n  chain out {\n    type nat hook output priority -100;\n"
            "    ip daddr 10.0.0.1 tcp dport 1 dnat to numgen random mod 1 map "
            "{ 0 : 10.0.0.2 }\n  }\n}\n"))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        return f"nftables NAT is not usable here: {e}"
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    return None


def _run(*argv, stdin=None):
    p = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=10)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p.stdout


def sweep_namespaces():
    """Deletes the namespaces a killed lab left behind: named after the pid
    that made them, and that process is gone."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    for line in out.stdout.splitlines():
        m = re.match(r"(pl-ring(\d+))\b", line)
        if m and not os.path.exists(f"/proc/{m.group(2)}"):
            subprocess.run(["ip", "netns", "del", m.group(1)], capture_output=True, timeout=10)


def key_of(k):
    return (f"deployment_ring{k}", "20261204.1", 0.5, 1)


def js_number(v):
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def log_time(ts):
    """Epoch seconds of a pilotlight log line's "ts" (UTC, ms)."""
    base, _, frac = ts.rstrip("Z").partition(".")
    return calendar.timegm(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) + int(frac or 0) / 1000


# --------------------------------------------------------------------------
# HTTP on blocking sockets (the lab's own requests and the dispatcher)
# --------------------------------------------------------------------------

class Closed(Exception):
    """The connection ended before a whole response."""


def read_response(sock, buf=b""):
    """One response from <sock>: (status, {header: value}, body, rest)."""
    while b"\r\n\r\n" not in buf:
        data = _recv(sock)
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    while len(buf) < length:
        buf += _recv(sock)
    return status, headers, buf[:length], buf[length:]


def _recv(sock):
    try:
        data = sock.recv(65536)
    except (ConnectionResetError, BrokenPipeError) as e:
        raise Closed(repr(e)) from None
    if not data:
        raise Closed("closed")
    return data


def http_get(addr, path, timeout=2.0):
    """GET <path> from <addr> ("host", port) on a new connection; (status, body)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: lab\r\nConnection: close\r\n\r\n".encode())
        status, _, body, _ = read_response(s)
        return status, body


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')


def parse_metrics(text):
    """{(name, "label=value,..."): value} of a /metrics page."""
    out = {}
    for ln in text.splitlines():
        m = _SAMPLE.match(ln)
        if m and not ln.startswith("#"):
            labels = ",".join(sorted(re.findall(r'(\w+="[^"]*")', m.group(2) or "")))
            out[(m.group(1), labels.replace('"', ""))] = float(m.group(3))
    return out


RING_FIGURES = {
    "members": ("pilotlight_ring_members", ""),
    "redirects_poll": ("pilotlight_ring_redirects_total", "route=poll"),
    "redirects_dispatch": ("pilotlight_ring_redirects_total", "route=dispatch"),
    "hop_served_poll": ("pilotlight_ring_hop_served_total", "route=poll"),
    "hop_served_dispatch": ("pilotlight_ring_hop_served_total", "route=dispatch"),
    "moved": ("pilotlight_settled_total", "outcome=moved"),
    "parked": ("pilotlight_parked_now", ""),
    "hit": ("pilotlight_dispatch_total", "result=hit"),
    "miss": ("pilotlight_dispatch_total", "result=miss"),
}


def ring_figures(samples):
    return {k: int(samples.get(v, 0)) for k, v in RING_FIGURES.items()}


# --------------------------------------------------------------------------
# The lab: namespace, instances, Service
# --------------------------------------------------------------------------

class Instance:
    """One pilotlight in the lab's namespace, on ADDRS[slot]:PORT."""

    def __init__(self, lab, slot, binary, extra_args, generation=1):
        self.slot, self.addr = slot, ADDRS[slot]
        # its name in the figures: the address, and which start there
        self.name = self.addr if generation == 1 else f"{self.addr}#{generation}"
        self.errf = tempfile.TemporaryFile()
        peers = ",".join(f"{a}:{PORT}" for a in ADDRS)
        self.args = [binary, "--listen", f"{self.addr}:{PORT}", "--ring-peers", peers,
                     "--ring-self", f"{self.addr}:{PORT}",
                     "--drain-delay-ms", str(lab.drain_delay_ms), *extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PILOTLIGHT_")}
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.errf, env=env,
                                     preexec_fn=impair.child_in(lab.ns))
        self.started = time.time()
        deadline = time.monotonic() + 10
        while not any(r.get("msg") == "listening" for r in self.log()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"instance {self.addr} did not start: {self.stderr()[-3000:]}")
            time.sleep(0.01)

    def stderr(self):
        self.errf.seek(0)
        return self.errf.read().decode("utf-8", "replace")

    def log(self):
        out = []
        for ln in self.stderr().splitlines():
            try:
                out.append(json.loads(ln))
            except ValueError:
                pass
        return out

    def ring_changes(self):
        """[(epoch s, members, self index)] from its "ring changed" lines."""
        return [(log_time(r["ts"]), r.get("members"), r.get("self")) for r in self.log()
                if r.get("msg") == "ring changed"]

    def alive(self):
        return self.proc.poll() is None


class Lab:
    """The namespace with its Service; instances started by slot. Use as a
    context manager: processes, threads and the namespace go on exit."""

    def __init__(self, binary, drain_delay_ms=DRAIN_DELAY_MS, probe_ms=PROBE_MS,
                 extra_args=()):
        self.binary, self.drain_delay_ms, self.probe_ms = binary, drain_delay_ms, probe_ms
        self.extra_args = list(extra_args)
        self.ns = f"pl-ring{os.getpid()}"
        self.instances = {}      # slot -> Instance (the latest one started there)
        self.retired = []        # instances stopped or killed, for their logs
        self.endpoints = []      # [(epoch s, ready slots)] each time the map changed
        self.last = {}           # instance name -> its latest ring_figures
        self.procs = []
        self._stop = threading.Event()
        self._probe = self._sampler = None
        self._ns_made = False
        sweep_namespaces()
        try:
            _run("ip", "netns", "add", self.ns)
            self._ns_made = True
            _run("ip", "-n", self.ns, "link", "set", "lo", "up")
            for a in ADDRS:
                _run("ip", "-n", self.ns, "addr", "add", f"{a}/32", "dev", "lo")
            # A route to the VIP (nothing listens there): the DNAT on the
            # output hook sends each connection on to an instance.
            _run("ip", "-n", self.ns, "route", "add", f"{VIP}/32", "dev", "lo")
            self._set_map(())
            self._probe = threading.Thread(target=self._endpoints_controller, daemon=True)
            self._probe.start()
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the Service

    def _set_map(self, slots):
        """One nft transaction: the VIP's nat rule over <slots>, or a reset
        for every new connection when none is ready (kube-proxy rejects)."""
        rule = (f"ip daddr {VIP} tcp dport {PORT} dnat to numgen random mod {len(slots)} map "
                "{ " + ", ".join(f"{i} : {ADDRS[s]}" for i, s in enumerate(slots)) + " }"
                if slots else "")
        reject = "" if slots else f"ip daddr {VIP} tcp dport {PORT} reject with tcp reset"
        script = ("table ip plring {}\ndelete table ip plring\n"
                  "table ip plring {\n"
                  "  chain svc {\n    type nat hook output priority -100; policy accept;\n"
                  f"    {rule}\n  }}\n"
                  "  chain noep {\n    type filter hook output priority 0; policy accept;\n"
                  f"    {reject}\n  }}\n"
                  "}\n")
        _run("ip", "netns", "exec", self.ns, "nft", "-f", "-", stdin=script)

    def _endpoints_controller(self):
        impair.enter(self.ns)
        ready = ()
        while not self._stop.wait(self.probe_ms / 1000):
            now_ready = []
            for slot in sorted(self.instances):
                try:
                    status, _ = http_get((ADDRS[slot], PORT), "/readyz", timeout=0.5)
                except (OSError, Closed, ValueError, IndexError):
                    status = 0
                if status == 200:
                    now_ready.append(slot)
            now_ready = tuple(now_ready)
            if now_ready != ready:
                try:
                    self._set_map(now_ready)
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    sys.stderr.write(f"ring_lab: endpoints not updated: {e}\n")
                    continue
                ready = now_ready
                self.endpoints.append((time.time(), ready))

    def _sample(self):
        """Keeps each instance's latest ring figures, so that one that exits
        or dies still counts what it did up to then."""
        impair.enter(self.ns)
        while not self._stop.wait(0.25):
            self.snapshot()

    def snapshot(self):
        """{instance name: ring_figures}: fresh for the live instances, the
        last reading for those gone (from this thread's namespace, or the
        sampler's)."""
        for inst in list(self.instances.values()):
            if inst.alive():
                try:
                    with socket.create_connection((inst.addr, PORT), timeout=2) as c:
                        c.sendall(b"GET /metrics HTTP/1.1\r\nHost: lab\r\n"
                                  b"Connection: close\r\n\r\n")
                        status, _, body, _ = read_response(c)
                    if status == 200:
                        self.last[inst.name] = ring_figures(parse_metrics(body.decode()))
                except (OSError, Closed, ValueError, IndexError):
                    pass
        return dict(self.last)

    def ready_slots(self):
        return self.endpoints[-1][1] if self.endpoints else ()

    def wait_endpoints(self, slots, timeout=10):
        deadline = time.monotonic() + timeout
        while tuple(sorted(slots)) != self.ready_slots():
            if time.monotonic() > deadline:
                raise AssertionError(f"endpoints {self.ready_slots()}, wanted {sorted(slots)}")
            time.sleep(0.02)

    # -- instances

    def start(self, slot):
        """Starts an instance on ADDRS[slot] (must be free). Returns it."""
        old = self.instances.get(slot)
        if old is not None:
            if old.alive():
                raise RuntimeError(f"slot {slot} is running")
            self.retired.append(old)
        gen = 1 + sum(1 for i in self.retired if i.slot == slot)
        inst = Instance(self, slot, self.binary, self.extra_args, gen)
        self.instances[slot] = inst
        return inst

    def sigterm(self, slot):
        self.instances[slot].proc.send_signal(signal.SIGTERM)
        return time.time()

    def sigkill(self, slot):
        inst = self.instances[slot]
        inst.proc.kill()
        t = time.time()
        inst.proc.wait()
        return t

    def wait_exit(self, slot, timeout=20):
        inst = self.instances[slot]
        try:
            rc = inst.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            inst.proc.kill()
            inst.proc.wait()
            raise AssertionError(f"{inst.addr} did not exit within {timeout} s of SIGTERM")
        if rc != 0:
            raise AssertionError(f"{inst.addr} exited {rc}: {inst.stderr()[-3000:]}")
        return rc

    def live(self):
        return [s for s, i in sorted(self.instances.items()) if i.alive()]

    def in_ns(self, fn, *args, timeout=30):
        return impair.in_ns(self.ns, fn, *args, timeout=timeout)

    def metrics(self, slot):
        def go():
            status, body = http_get((ADDRS[slot], PORT), "/metrics", timeout=5)
            if status != 200:
                raise RuntimeError(f"/metrics of {ADDRS[slot]}: {status}")
            return parse_metrics(body.decode())
        return self.in_ns(go)

    def ring(self, slots=None):
        """{slot: ring_figures} of the live instances (or <slots>)."""
        out = {}
        for s in (self.live() if slots is None else slots):
            try:
                out[s] = ring_figures(self.metrics(s))
            except (OSError, Closed, RuntimeError):
                pass
        return out

    def wait_ring(self, n, timeout=10):
        """Until every live instance sees <n> members."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.ring()
            if len(r) == len(self.live()) and all(v["members"] == n for v in r.values()):
                return r
            if time.monotonic() > deadline:
                raise AssertionError(f"ring not at {n} members: {r}")
            time.sleep(0.05)

    def parked(self):
        return sum(v["parked"] for v in self.ring().values())

    def wait_parked(self, n, procs=(), timeout=30):
        deadline = time.monotonic() + timeout
        while (got := self.parked()) < n:
            dead = [p for p in procs if p.proc.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = "".join("".join(p.stderr_tail) for p in procs)
                raise AssertionError(f"{got} of {n} controllers parked; {len(dead)} controller "
                                     f"processes ended; stderr:\n{tails[-3000:]}")
            time.sleep(0.1)

    # -- controllers

    def node_controllers(self, specs, max_runtime_s=600):
        spec = {"url": f"http://{VIP}:{PORT}", "controllers": specs, "work_ms": [0, 0],
                "max_runtime_s": max_runtime_s}
        p = impair.ControllerProcess(self.ns, [shutil.which("node"),
                                               str(COMPAT / "controllers.mjs"),
                                               json.dumps(spec)])
        self.procs.append(p)
        return p

    def light_controllers(self, specs, seed=1, max_runtime_s=600, backoff=True):
        """<backoff> False: they poll again at once after an error too (as
        the raw controllers of tests/interop/test_haproxy.py do)."""
        spec = {"host": VIP, "port": PORT, "controllers": specs, "seed": seed,
                "max_runtime_s": max_runtime_s, "backoff": backoff}
        p = impair.ControllerProcess(self.ns, [sys.executable, str(Path(__file__).resolve()),
                                               "controllers", json.dumps(spec)])
        self.procs.append(p)
        return p

    def close(self):
        """Stops everything started here, then deletes the namespace.
        Returns the sanitizer reports found in instances' stderr."""
        self._stop.set()
        for p in self.procs:
            p.stop()
        reports = []
        for inst in list(self.instances.values()) + self.retired:
            if inst.alive():
                inst.proc.send_signal(signal.SIGTERM)
                try:
                    inst.proc.wait(self.drain_delay_ms / 1000 + 15)
                except subprocess.TimeoutExpired:
                    inst.proc.kill()
                    inst.proc.wait()
            err = inst.stderr()
            if any(m in err for m in SANITIZER_MARKS):
                reports.append(f"{inst.addr}:\n{err[-6000:]}")
        for t in (self._probe, self._sampler):
            if t is not None:
                t.join(5)
        if self._ns_made:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)
            self._ns_made = False
        return reports


# --------------------------------------------------------------------------
# The dispatcher
# --------------------------------------------------------------------------

def message_for(k, run_id, example=None):
    if example is None:
        example = json.loads(EXAMPLE_PATH.read_bytes())
    dep, ver, cpu, mem = key_of(k)
    m = json.loads(json.dumps(example))
    m["deployment"]["friendlyId"] = dep
    m["backgroundWorker"]["version"] = ver
    m["run"]["machine"]["cpu"], m["run"]["machine"]["memory"] = cpu, mem
    m["run"]["id"], m["run"]["friendlyId"] = run_id[4:], run_id
    return json.dumps({"dequeuedMessage": m}).encode()


def _conntrack_peer(sock):
    """The instance a connection to the VIP was DNATed to (conntrack's
    reply source), or None."""
    lip, lport = sock.getsockname()[:2]
    pat = f"src={lip} dst={VIP} sport={lport} dport={PORT} src="
    try:
        with open("/proc/thread-self/net/nf_conntrack") as f:
            for ln in f:
                i = ln.find(pat)
                if i >= 0:
                    return ln[i + len(pat):].split()[0]
    except OSError:
        pass
    return None


class Dispatcher:
    """Open loop at <rate>/s from inside the namespace: run i is due at
    start + i / rate whatever became of the earlier ones. Workers keep one
    connection per origin (a supervisor's pool does), dropping one the
    other end has closed before reusing it. Each record: run, key, due,
    done (epoch s), answer (True, False or None), error, via (the instances
    that answered, in order: a 307's target follows its sender)."""

    def __init__(self, ns, rate, keys, seed=1, workers=24):
        self.ns, self.rate, self.keys = ns, rate, keys
        self.rng = random.Random(seed)
        self.example = json.loads(EXAMPLE_PATH.read_bytes())
        self.jobs = queue.Queue()
        self.records = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.workers = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self.workers:
            t.start()
        self.pacer = threading.Thread(target=self._pace, daemon=True)
        self.pacer.start()

    def _pace(self):
        start, i, order = time.time() + 0.05, 0, []
        while not self._stop.is_set():
            due = start + i / self.rate
            d = due - time.time()
            if d > 0:
                time.sleep(min(d, 0.05))
                continue
            if not order:
                order = list(range(self.keys))
                self.rng.shuffle(order)
            k = order.pop()
            run = f"run_ring{i:06d}"
            self.jobs.put((run, k, due, message_for(k, run, self.example)))
            i += 1

    def _work(self):
        impair.enter(self.ns)
        conns = {}
        while True:
            job = self.jobs.get()
            if job is None:
                break
            run, k, due, body = job
            rec = {"run": run, "key": k, "due": due, "answer": None, "error": None, "via": []}
            origin, path = (VIP, PORT), "/warm-start"
            try:
                for _ in range(4):
                    sock, buf, peer = self._conn(conns, origin)
                    rec["via"].append(peer)
                    head = (f"POST {path} HTTP/1.1\r\nHost: {origin[0]}:{origin[1]}\r\n"
                            "Content-Type: application/json\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n").encode()
                    try:
                        sock.sendall(head + body)
                        status, headers, rbody, buf = read_response(sock, buf)
                    except (OSError, Closed):
                        conns.pop(origin, None)
                        sock.close()
                        raise
                    conns[origin] = (sock, buf, peer)
                    if headers.get("connection", "").lower() == "close":
                        conns.pop(origin, None)
                        sock.close()
                    if status == 307:
                        m = re.match(r"http://([^:/]+):(\d+)(/\S*)", headers.get("location", ""))
                        if not m:
                            raise RuntimeError(f"307 without a usable Location: {headers}")
                        origin, path = (m.group(1), int(m.group(2))), m.group(3)
                        continue
                    if status == 200:
                        v = json.loads(rbody).get("didWarmStart")
                        rec["answer"] = v if isinstance(v, bool) else None
                    if rec["answer"] is None:
                        rec["error"] = f"status {status} {rbody[:120]!r}"
                    break
                else:
                    rec["error"] = "too many redirects"
            except (OSError, Closed, RuntimeError, ValueError) as e:
                rec["error"] = f"{e!r} at {origin[0]}"
            rec["done"] = time.time()
            with self.lock:
                self.records.append(rec)

    @staticmethod
    def _conn(conns, origin):
        got = conns.get(origin)
        if got is not None:
            sock = got[0]
            sock.setblocking(False)
            try:
                sock.recv(1, socket.MSG_PEEK)  # end of stream, or bytes nobody asked for
                alive = False
            except BlockingIOError:
                alive = True
            except OSError:
                alive = False
            sock.setblocking(True)
            if alive:
                return got
            conns.pop(origin, None)
            sock.close()
        sock = socket.create_connection(origin, timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = _conntrack_peer(sock) if origin[0] == VIP else origin[0]
        conns[origin] = (sock, b"", peer)
        return conns[origin]

    def stop(self):
        self._stop.set()
        self.pacer.join(5)
        for _ in self.workers:
            self.jobs.put(None)
        for t in self.workers:
            t.join(30)
        with self.lock:
            return list(self.records)


# --------------------------------------------------------------------------
# Which instance owns a key (src/ring.c's rendezvous hashing, for telling
# why a dispatch missed; owner_model_check() holds it to what the
# instances' redirects say)
# --------------------------------------------------------------------------

_M64 = 2 ** 64 - 1


def _hash64(data, h):
    k = 0x9E3779B97F4A7C15
    h = ((h ^ len(data)) * k) & _M64
    i = 0
    while len(data) - i >= 8:
        h = ((h ^ int.from_bytes(data[i:i + 8], "little")) * k) & _M64
        h ^= h >> 29
        i += 8
    w = 0
    for b in data[i:]:
        w = ((w << 8) | b) & _M64
    h = ((h ^ w) * k) & _M64
    return h ^ (h >> 32)


def _rank(seed, kh):
    z = seed ^ kh
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def owner(k, members):
    """The address (of ADDRS) that owns key <k> among <members> (addresses)."""
    import struct
    dep, ver, cpu, mem = key_of(k)
    enc = (struct.pack("<ddH", float(cpu) + 0.0, float(mem) + 0.0, len(dep)) + dep.encode()
           + ver.encode())
    kh = _hash64(enc, 0)
    names = sorted(f"{a}:{PORT}".encode() for a in members)
    best = max(range(len(names)), key=lambda i: (_rank(_hash64(names[i], 0x5EED), kh), -i))
    return names[best].decode().rsplit(":", 1)[0]


def owner_model_check(records, members, t0, t1):
    """(agree, disagree): dispatches due in [t0, t1), when every instance
    saw <members>, redirected to the owner owner() names."""
    agree = disagree = 0
    for r in records:
        if t0 <= r["due"] < t1 and len(r["via"]) >= 2 and r["via"][0] is not None:
            if r["via"][1] == owner(r["key"], members):
                agree += 1
            else:
                disagree += 1
    return agree, disagree


# --------------------------------------------------------------------------
# What a window measured
# --------------------------------------------------------------------------

def receipts_of(procs):
    """[(controller id, run id, epoch s)] from every controller process."""
    return [(e["ctl"], e["run"], e.get("t", 0.0)) for p in procs for e in list(p.events)
            if e.get("ev") == "run"]


def pauses_of(procs):
    """{key: [(start, end, why)]}: the controllers' back-offs, by key."""
    out = {}
    for p in procs:
        for e in list(p.events):
            m = re.match(r"ctl_k(\d+)_", e.get("ctl", ""))
            if e.get("ev") == "backoff" and m:
                out.setdefault(int(m.group(1)), []).append(
                    (e["t"], e["t"] + e.get("s", 0), e.get("why", "")))
    return out


def place(records, events):
    """Sets each record's "t": when it was due, or the first of <events>
    (epoch s) it was in flight at, so that what an event cut short counts
    as its own."""
    for r in records:
        r["t"] = r["due"]
        for te in sorted(events):
            if r["due"] < te <= r.get("done", r["due"]):
                r["t"] = te
                break


def figures(records, receipts, t0, t1, pauses=None):
    """The dispatches placed in [t0, t1) (place(), or when they were due):
    answers, misses (false or no answer:
    either way the supervisor starts the run cold), recovery (the last miss,
    seconds after t0), and the promise: duplicates (a run received twice or
    more), true_unreceived, false_received, error_received (no answer, yet a
    controller got it). Each miss is listed with the instances that
    answered it and, from <pauses> (pauses_of), how many of its key's
    controllers were in a back-off then."""
    got = {}
    for ctl, run, _ in receipts:
        got.setdefault(run, []).append(ctl)
    f = {"dispatches": 0, "true": 0, "false": 0, "errors": 0, "misses": 0, "recovery_s": 0.0,
         "duplicates": 0, "true_unreceived": 0, "false_received": 0, "error_received": 0,
         "missed": []}
    for r in records:
        t = r.get("t", r["due"])
        if not t0 <= t < t1:
            continue
        n = len(got.get(r["run"], ()))
        f["dispatches"] += 1
        a = r["answer"]
        f["true" if a is True else "false" if a is False else "errors"] += 1
        f["duplicates"] += n >= 2
        f["true_unreceived"] += a is True and n == 0
        f["false_received"] += a is False and n >= 1
        f["error_received"] += a is None and n >= 1
        if a is not True:
            f["misses"] += 1
            f["recovery_s"] = max(f["recovery_s"], t - t0)
            paused = [w for b, e, w in (pauses or {}).get(r["key"], ()) if b <= t < e]
            refused = [w for w in paused if "refused" in w.lower()]
            f["missed"].append({"at_s": round(t - t0, 3), "key": r["key"], "answer": a,
                                "via": r["via"], "error": r["error"],
                                "backing_off": len(paused),
                                "after_refused": len(refused),
                                "after_refused_307": sum(1 for w in refused if VIP not in w)})
    return f


def ring_delta(before, after):
    """Per instance, the growth of the ring counters between two snapshots
    (one started since counts from zero), and its members and parked polls
    at the second."""
    out = {}
    for name in sorted(after):
        b, a = before.get(name, {}), after[name]
        out[name] = {k: a[k] - (0 if k in ("members", "parked") else b.get(k, 0))
                     for k in RING_FIGURES if k not in ("hit", "miss")}
    return out


def ring_totals(delta):
    keys = ("redirects_poll", "redirects_dispatch", "hop_served_poll", "hop_served_dispatch",
            "moved")
    return {k: sum(v.get(k, 0) for v in delta.values()) for k in keys}


CAUSES = {
    "early": "answered by the key's new owner before its old owner saw the change "
             "(the polls still parked at the old owner)",
    "in_flight": "answered by the key's new owner while the polls were on their way "
                 "there (within 100 ms of the old owner's change: a 307 being followed)",
    "stale_hop": "answered by the key's old owner after it had moved the polls, reached "
                 "through an instance that had not seen the change (a hop is served "
                 "where it lands)",
    "backoff_cut": "every controller of the key in its back-off after its poll was cut",
    "backoff_refused_307": "every controller of the key in a back-off, one at least after a "
                           "307 to the dead instance was refused (from an instance that had "
                           "not seen it die)",
    "backoff_refused_svc": "every controller of the key in a back-off, one at least after "
                           "the Service sent it to the dead instance (refused)",
    "repoll": "the key's controllers re-polling (not all in a back-off)",
    "svc_dead": "the Service sent the dispatch to the dead instance (refused)",
    "stale_307": "redirected to the dead instance by one that had not seen it die (refused)",
    "cut": "in progress at the instance as it died or closed its connection",
    "other": "none of the above",
}


def classify(miss, event, before, after, seen):
    """The cause (a key of CAUSES) of one miss of an <event> window;
    <before>/<after>: the members (addresses) before and after it; <seen>:
    {address: seconds after the event it saw the change}."""
    k, t, err = miss["key"], miss["at_s"], miss["error"] or ""
    old, new = owner(k, before), owner(k, after)
    last = miss["via"][-1] if miss["via"] else None
    if miss["answer"] is None:
        if "refused" in err.lower():
            return "svc_dead" if err.endswith(f"at {VIP}") else "stale_307"
        return "cut" if re.search("reset|closed", err, re.I) else "other"
    if event == "kill":
        if old == new:
            return "other"
        if miss["backing_off"] >= 3:
            if miss["after_refused_307"]:
                return "backoff_refused_307"
            return "backoff_refused_svc" if miss["after_refused"] else "backoff_cut"
        return "repoll"
    moved_at = 0.0 if event == "drain" else seen.get(old, 0.0)
    if old != new and last == new:
        if event != "drain" and t < moved_at:
            return "early"
        return "in_flight" if t < moved_at + 0.1 else "other"
    if old != new and last == old and t >= moved_at:
        return "stale_hop"
    return "other"


def backoffs(procs, t0, t1):
    """The controllers' back-offs that began in [t0, t1): count and their
    total seconds (the real client's and the light ones')."""
    n, total, why = 0, 0.0, {}
    for p in procs:
        for e in list(p.events):
            if e.get("ev") == "backoff" and t0 <= e.get("t", 0) < t1:
                n += 1
                total += e.get("s", 0)
                w = e.get("why", "")
                kind = ("refused_svc" if re.search("refused", w, re.I) and VIP in w else
                        "refused_307" if re.search("refused", w, re.I) else
                        "cut" if re.search("reset|closed|incomplete|EPIPE|socket", w, re.I) else
                        "other")
                why[kind] = why.get(kind, 0) + 1
    return {"backoffs": n, "backoff_s": round(total, 1), "backoff_why": why}


def fleet(keys, per_key, node_keys):
    """Controller specs: <per_key> on each of <keys> keys; the keys in
    <node_keys> get the real WarmStartClient. (light specs, node specs)."""
    light, node = [], []
    for k in range(keys):
        for j in range(per_key):
            spec = {"id": f"ctl_k{k}_{j}", "key": list(key_of(k))}
            (node if k in node_keys else light).append(spec)
    return light, node


# --------------------------------------------------------------------------
# The scenario sequence the test and loadtest/ring-scale run
# --------------------------------------------------------------------------

def run_sequence(binary, *, keys=100, per_key=3, node_keys=range(0, 20), rate=60.0,
                 baseline_s=3.0, window_s=5.0, add_slot=3, drain_slot=1, kill_slot=0, seed=1,
                 extra_args=(), probe_ms=PROBE_MS, keep_records=False, backoff=True,
                 say=lambda s: None):
    """3 instances (every slot but <add_slot>), the fleet parked, dispatches
    flowing; then, each with a window of <window_s> after it: "add" (the 4th,
    <add_slot>, starts), "drain" (SIGTERM to <drain_slot>), "readd" (it
    starts again), "kill" (SIGKILL to <kill_slot>). <extra_args> go to every
    instance; <probe_ms> is the Service's probe period; <backoff> False: the
    light controllers poll again at once after an error. Returns {"baseline":
    figures, "events": [figures of each window], "all": ..., ...}."""
    wall = time.monotonic()
    procs, disp = [], None
    out = {"events": []}
    with Lab(binary, probe_ms=probe_ms, extra_args=extra_args) as lab:
        try:
            first = [s for s in range(len(ADDRS)) if s != add_slot]
            for s in first:
                lab.start(s)
            lab.wait_ring(3)
            lab.wait_endpoints(first)
            light, node = fleet(keys, per_key, set(node_keys))
            if node:
                procs.append(lab.node_controllers(node))
            if light:
                procs.append(lab.light_controllers(light, seed=seed, backoff=backoff))
            lab.wait_parked(len(light) + len(node), procs)
            say(f"{len(light) + len(node)} controllers parked "
                f"({len(node)} WarmStartClient) on {lab.live()}")
            disp = Dispatcher(lab.ns, rate, keys, seed=seed)
            t_base = time.time()
            time.sleep(baseline_s)
            marks = []

            def alive():
                return {i.name for i in lab.instances.values() if i.alive()}

            def event(name, fn, slot):
                m = {"name": name, "slot": slot, "before": lab.in_ns(lab.snapshot),
                     "alive": alive(), "members_before": [ADDRS[s] for s in lab.live()]}
                m["t0"] = fn(slot)
                m["members_after"] = [ADDRS[s] for s in lab.live()
                                      if not (name == "drain" and s == slot)]
                marks.append(m)
                say(f"{name} {ADDRS[slot]} at +{m['t0'] - t_base:.1f} s")
                return m["t0"]

            def close_window():
                m = marks[-1]
                time.sleep(max(0.0, m["t0"] + window_s - time.time()))
                m["t1"] = time.time()
                m["after"] = lab.in_ns(lab.snapshot)
                m["alive"] |= alive()

            event("add", lambda s: lab.start(s).started, add_slot)
            close_window()
            event("drain", lab.sigterm, drain_slot)
            lab.wait_exit(drain_slot)
            close_window()
            event("readd", lambda s: lab.start(s).started, drain_slot)
            close_window()
            event("kill", lab.sigkill, kill_slot)
            close_window()
            records = disp.stop()
            disp = None
            time.sleep(1.5)  # a true run's payload may still be on its way
            got = receipts_of(procs)
            pauses = pauses_of(procs)
            place(records, [m["t0"] for m in marks])
            out["baseline"] = figures(records, got, t_base, marks[0]["t0"], pauses)
            for m in marks:
                t0, t1 = m["t0"], m["t1"]
                f = figures(records, got, t0, t1, pauses)
                f["name"], f["slot"], f["window_s"] = m["name"], ADDRS[m["slot"]], round(t1 - t0, 2)
                f["ring"] = ring_delta(m["before"], {k: v for k, v in m["after"].items()
                                                     if k in m["alive"]})
                f["ring_total"] = ring_totals(f["ring"])
                f.update(backoffs(procs, t0, t1))
                f["ring_changes"] = {i.name: [(round(t - t0, 3), n, s)
                                              for t, n, s in i.ring_changes() if t0 <= t < t1]
                                     for i in list(lab.instances.values()) + lab.retired
                                     if i.name in m["alive"]}
                f["endpoints"] = [(round(t - t0, 3), [ADDRS[s] for s in e])
                                  for t, e in lab.endpoints if t0 <= t < t1]
                seen = {}
                for name, ch in f["ring_changes"].items():
                    want = len(m["members_after"]) if name.split("#")[0] in \
                        m["members_after"] else 3
                    hit = [t for t, n, _ in ch if n == want or (n == 3 and want == 3)]
                    if hit:
                        seen[name.split("#")[0]] = hit[0]
                f["seen"] = seen
                f["causes"] = {}
                for miss in f["missed"]:
                    miss["cause"] = classify(miss, m["name"], m["members_before"],
                                             m["members_after"], seen)
                    f["causes"][miss["cause"]] = f["causes"].get(miss["cause"], 0) + 1
                out["events"].append(f)
            b0, b1 = t_base, marks[0]["t0"]
            out["owner_model"] = owner_model_check(records, marks[0]["members_before"], b0, b1)
            if keep_records:
                out["records"] = records
            out["all"] = figures(records, got, 0, float("inf"))
            out["all"].pop("missed")
            out["stray"] = len({r for _, r, _ in got} - {r["run"] for r in records})
            out["controller_events"] = {}
            for p in procs:
                for e in list(p.events):
                    if e.get("ev") not in ("run", "polling"):
                        out["controller_events"][e["ev"]] = \
                            out["controller_events"].get(e["ev"], 0) + 1
        finally:
            if disp is not None:
                disp.stop()
            out["sanitizer_reports"] = lab.close()
    out["wall_s"] = round(time.monotonic() - wall, 1)
    return out


def describe(out):
    """The sequence's figures, one paragraph per window."""
    lines = []
    b = out["baseline"]
    lines.append(f"baseline: {b['dispatches']} dispatches, {b['misses']} misses "
                 f"({b['false']} false, {b['errors']} errors)")
    for f in out["events"]:
        rt = f["ring_total"]
        lines.append(
            f"{f['name']:5} {f['slot']}: {f['dispatches']} dispatches in {f['window_s']} s, "
            f"misses {f['misses']} ({f['false']} false, {f['errors']} errors), "
            f"recovery {f['recovery_s']:.2f} s; duplicates {f['duplicates']}, "
            f"true-unreceived {f['true_unreceived']}, false-received {f['false_received']}, "
            f"error-received {f['error_received']}; redirects poll/dispatch "
            f"{rt['redirects_poll']}/{rt['redirects_dispatch']}, hop-served poll/dispatch "
            f"{rt['hop_served_poll']}/{rt['hop_served_dispatch']}, moved {rt['moved']}; "
            f"controller back-offs {f['backoffs']} ({f['backoff_s']} s, {f['backoff_why']}); "
            f"miss causes {f['causes']}")
        lines.append("    seen: " + "; ".join(
            f"{n} " + ",".join(f"{m}@{t:+.3f}" for t, m, _ in ch)
            for n, ch in f["ring_changes"].items() if ch) + "; endpoints: " + ", ".join(
            f"{len(e)}@{t:+.3f}" for t, e in f["endpoints"]))
        for m in f["missed"]:
            lines.append(f"    miss +{m['at_s']:.3f} s key {m['key']} "
                         f"{'false' if m['answer'] is False else 'error'} via "
                         f"{'>'.join(str(v) for v in m['via'])}"
                         + (f" ({m['error']})" if m["error"] else "")
                         + f", {m['backing_off']} of its controllers backing off"
                         f" ({m['after_refused']} after a refusal): {m['cause']}")
    a = out["all"]
    lines.append(f"all: {a['dispatches']} dispatches, {a['true']} true, {a['false']} false, "
                 f"{a['errors']} errors; duplicates {a['duplicates']}, true-unreceived "
                 f"{a['true_unreceived']}, false-received {a['false_received']}, "
                 f"error-received {a['error_received']}, stray {out['stray']}; controller "
                 f"events {out['controller_events']}; owner model agrees with "
                 f"{out['owner_model'][0]} redirects, not with {out['owner_model'][1]}; "
                 f"wall {out['wall_s']} s")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# Light controllers, as a program (runs inside the namespace)
# --------------------------------------------------------------------------

def _emit(**event):
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class _Pool:
    """One kept connection per origin, as a client's agent keeps them."""

    def __init__(self):
        self.conns = {}

    async def get(self, origin):
        c = self.conns.get(origin)
        if c is not None and not c[0].at_eof() and not c[1].is_closing():
            return c
        self.drop(origin)
        c = await asyncio.open_connection(*origin)
        self.conns[origin] = c
        return c

    def drop(self, origin):
        c = self.conns.pop(origin, None)
        if c is not None:
            c[1].close()


async def _response(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        if k:
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _fetch(pool, origin, path, headers, state):
    """GET, following redirects as fetch does (at most 20); (status, body).
    state["origin"] names the connection in use, for an abort to drop."""
    for _ in range(21):
        state["origin"] = origin
        reader, writer = await pool.get(origin)
        req = f"GET {path} HTTP/1.1\r\nHost: {origin[0]}:{origin[1]}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(req.encode())
        await writer.drain()
        status, h, body = await _response(reader)
        if h.get("connection", "").lower() == "close":
            pool.drop(origin)
        if status in (301, 302, 303, 307, 308) and "location" in h:
            m = re.match(r"http://([^:/]+):(\d+)(/\S*)", h["location"])
            origin, path = (m.group(1), int(m.group(2))), m.group(3)
            continue
        return status, body
    raise OSError("redirect count exceeded")


async def _controller(spec, c):
    rng = random.Random(f"{spec['seed']}/{c['id']}")
    vip = (spec["host"], spec["port"])
    dep, ver, cpu, mem = c["key"]
    headers = {"x-trigger-workload-controller-id": c["id"], "x-trigger-deployment-id": dep,
               "x-trigger-deployment-version": ver, "x-trigger-machine-cpu": js_number(cpu),
               "x-trigger-machine-memory": js_number(mem),
               "x-trigger-worker-instance-name": "ring-lab"}
    pool, state = _Pool(), {}
    timeout_s = 30.0
    try:
        status, body = await _fetch(pool, vip, "/connect", {}, state)
        timeout_s = json.loads(body).get("connectionTimeoutMs", 30000) / 1000
    except (OSError, ValueError, asyncio.IncompleteReadError) as e:
        _emit(ev="connect_failed", ctl=c["id"], error=repr(e))
    first = True
    while True:
        retries = 0
        while True:  # one warmStart(): its long poll
            if first:
                _emit(ev="polling", ctl=c["id"])
                first = False
            why = None
            try:
                status, body = await asyncio.wait_for(
                    _fetch(pool, vip, "/warm-start", headers, state), timeout_s)
            except asyncio.TimeoutError:
                pool.drop(state.get("origin"))  # an abort ends its connection
                _emit(ev="timeout", ctl=c["id"], t=time.time())
                continue
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError) as e:
                pool.drop(state.get("origin"))
                why = repr(e)
            if why is None and 200 <= status < 300:
                try:
                    run = json.loads(body)["run"]["friendlyId"]
                except (ValueError, KeyError, TypeError):
                    why = f"status {status} without a run"
                else:
                    _emit(ev="run", ctl=c["id"], run=run, t=time.time())
                    break
            elif why is None:
                _emit(ev="status", ctl=c["id"], status=status, t=time.time())
                break
            delay = round(rng.random() * 2 ** retries) if spec.get("backoff", True) else 0
            retries += 1
            at = state.get("origin") or ("", 0)
            _emit(ev="backoff", ctl=c["id"], t=time.time(), s=delay, why=f"{why} at {at[0]}")
            await asyncio.sleep(delay)


async def _controllers_main(spec):
    for c in spec["controllers"]:
        asyncio.ensure_future(_controller(spec, c))
    await asyncio.sleep(spec["max_runtime_s"])
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "controllers":
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(_controllers_main(json.loads(sys.argv[2])))
    else:
        sys.exit("usage: ring_lab.py controllers SPEC_JSON")
