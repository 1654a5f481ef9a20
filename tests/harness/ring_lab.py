"""ring_lab.py -- the key ring at work behind a Kubernetes-style L4 Service:
up to four pilotlight instances in a network namespace, a virtual IP in
front of them, controllers and a dispatcher that reach them only through it,
and the bookkeeping that says, per run, who received it and what the
dispatcher was told.

    The namespace (pl-ring<pid>): instance i listens on ADDRS[i]:PORT (loopback
        aliases) with the drain delay a deployment would use. Its ring
        settings are in a config file of its own, so that a reload (SIGHUP)
        can change them: either a static list ("list": ring_peers and
        ring_self) or a DNS name ("dns": ring_dns = RING_NAME:PORT,
        resolved from a private /etc/hosts per instance, in which the lab
        turns each member's line on and off, instance by instance, as DNS
        caches that expire at different moments would).
    The Service: VIP:PORT, an nftables nat chain on the output hook that
        DNATs each new connection at random (numgen random mod N) to one of
        the instances in a map, as kube-proxy's nftables mode does; the
        established connections keep their instance (conntrack). The same
        chain can give an instance a second address, ALIASES[i] (a DNAT to
        it alone), so that it can be listed under two names.
    The endpoints controller: a readiness probe per instance, as the kubelet
        runs one (Probe: a GET /readyz on a new connection every period,
        given a timeout; failures and successes in a row take it out and
        put it in; each instance's probe on its own phase), and the map
        rewritten in one nft transaction when the ready set changes. The
        default is the lab's fast probe (LAB_PROBE, every 200 ms);
        chart_probe() is the one deploy/helm/pilotlight/values.yaml sets.
    Controllers: Trigger.dev's own WarmStartClient (tests/compat/
        controllers.mjs) and light ones from here (`python3 ring_lab.py
        controllers SPEC`) that behave as that client does (below). Each
        prints a receipt per run it gets.
    The dispatcher: open loop at a fixed rate, unique run ids, each POST
        through the VIP and, on a 307, the same body to the Location, as the
        supervisor's fetch does (20 redirects at most: the 21st is an error);
        each answer recorded with the instances that gave it (the VIP's
        choice is read back from conntrack) and when each redirect came.

What the light controllers model of WarmStartClient.warmStart() (4.8.3):
each poll is a GET of VIP/warm-start; a 307 is followed at once with every
header kept, 20 at most (fetch's limit: the 21st is a network error); a 2xx
with a run is a receipt, and the controller polls again at once (its "work"
takes no time, so the fleet stays parked); a non-2xx answer ends the poll
(warmStart returns null) and it polls again at once; its own timeout
(connectionTimeoutMs from /connect) aborts the request and polls again at
once; a network error (refused, reset, closed, too many redirects) and a
2xx without a JSON body (a 204) wait round(random() * 2^n) seconds, n
counting the errors of this poll from 0 (the client's FullJitter back-off).
One kept connection per origin, reused while it has not been closed by the
other end. Each poll that was redirected is reported with when each
redirect came ({"ev": "chain"}), as each dispatch's record is.

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

REPO_ROOT = HERE.parents[1]
COMPAT = REPO_ROOT / "tests" / "compat"
EXAMPLE_PATH = REPO_ROOT / "tests" / "blackbox" / "data" / "dequeued-message.json"
CHART_VALUES = REPO_ROOT / "deploy" / "helm" / "pilotlight" / "values.yaml"
ADDRS = [f"10.77.0.{i}" for i in range(1, 5)]
ALIASES = [f"10.77.0.{i}" for i in range(11, 15)]  # a second address of ADDRS[i]
VIP = "10.77.0.100"
PORT = 8080
RING_NAME = "pl-ring.lab"  # ring_dns's name, from each instance's own /etc/hosts
RESOLVE_MS = 5000          # ring_resolve_ms: the default
STAGGER_S = 4.5            # the spread of a change over the instances (< RESOLVE_MS)
REDIRECTS_MAX = 20         # fetch's: the 21st redirect is a network error
DRAIN_DELAY_MS = 2000  # as the Compose file sets it (the chart: 5000)
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


class Probe:
    """A readiness probe as the kubelet runs one: every <period_ms> a GET
    /readyz on a new connection, given <timeout_ms>; <failures> failures in
    a row take the instance out of the Service, <successes> successes in a
    row put it in. Each instance's probe keeps its own phase (its first
    probe a random part of a period after its start), as each pod's does.
    Not modelled: the endpoints controller's and kube-proxy's own delays,
    and the kubelet marking a pod not ready when it sees its container
    exit (which does not wait for a probe)."""

    def __init__(self, name, period_ms, timeout_ms, failures=1, successes=1):
        self.name, self.period_ms, self.timeout_ms = name, period_ms, timeout_ms
        self.failures, self.successes = failures, successes

    def __repr__(self):
        return (f"{self.name} (every {self.period_ms} ms, timeout {self.timeout_ms} ms, "
                f"out after {self.failures}, in after {self.successes})")


# The lab's own: fast, so that what a change costs is the ring's.
LAB_PROBE = Probe("lab", 200, 500)


def chart_probe(path=CHART_VALUES):
    """The readiness probe deploy/helm/pilotlight/values.yaml gives the
    pods (its readinessProbe block, read without a YAML library)."""
    vals, inside = {}, False
    for ln in Path(path).read_text().splitlines():
        if re.match(r"^readinessProbe:\s*(#.*)?$", ln):
            inside = True
        elif inside and re.match(r"^\s+\w+:", ln):
            k, _, v = ln.strip().partition(":")
            vals[k] = v.split("#")[0].strip()
        elif inside and ln.strip() and not ln.startswith((" ", "#")):
            break
    try:
        return Probe("chart", int(vals["periodSeconds"]) * 1000,
                     int(vals["timeoutSeconds"]) * 1000, int(vals["failureThreshold"]),
                     int(vals["successThreshold"]))
    except (KeyError, ValueError):
        raise RuntimeError(f"{path}: no readinessProbe with periodSeconds, timeoutSeconds, "
                           f"failureThreshold and successThreshold: {vals}") from None


def probe_named(name):
    """"lab", "chart", or a period in ms (a timeout of half of it, at
    most 1 s)."""
    if name == "lab":
        return LAB_PROBE
    if name == "chart":
        return chart_probe()
    ms = int(name)
    return Probe(f"{ms} ms", ms, min(1000, max(1, ms // 2)))


# --------------------------------------------------------------------------
# The lab: namespace, instances, Service
# --------------------------------------------------------------------------

class Instance:
    """One pilotlight in the lab's namespace, on ADDRS[slot]:PORT, its ring
    settings in <conf> (which a reload reads again)."""

    def __init__(self, lab, slot, binary, extra_args, conf, generation=1, preexec=None):
        self.slot, self.addr = slot, ADDRS[slot]
        # its name in the figures: the address, and which start there
        self.name = self.addr if generation == 1 else f"{self.addr}#{generation}"
        self.errf = impair.log_file()
        self.args = [binary, "--config", str(conf), "--listen", f"{self.addr}:{PORT}",
                     "--drain-delay-ms", str(lab.drain_delay_ms), *extra_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PILOTLIGHT_")}
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.errf, env=env,
                                     preexec_fn=preexec or impair.child_in(lab.ns))
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

    def reloads(self):
        """How many reloads it logged: (taken, failed)."""
        msgs = [r.get("msg") for r in self.log()]
        return msgs.count("reloaded"), msgs.count("reload failed: configuration unchanged")

    def alive(self):
        return self.proc.poll() is None


class Lab:
    """The namespace with its Service; instances started by slot. Use as a
    context manager: processes, threads and the namespace go on exit.
    <mode>: how the instances know each other, "list" (ring_peers, by
    default every address of ADDRS) or "dns" (ring_dns, each instance's
    /etc/hosts listing the members it has been told of: dns_set());
    <probe>: the Service's readiness probe (Probe)."""

    def __init__(self, binary, drain_delay_ms=DRAIN_DELAY_MS, probe=LAB_PROBE,
                 extra_args=(), mode="list", resolve_ms=RESOLVE_MS):
        if mode not in ("list", "dns"):
            raise ValueError(f"mode {mode!r}: list or dns")
        self.binary, self.drain_delay_ms, self.probe = binary, drain_delay_ms, probe
        self.mode, self.resolve_ms = mode, resolve_ms
        self.extra_args = list(extra_args)
        self.ns = f"pl-ring{os.getpid()}"
        self.instances = {}      # slot -> Instance (the latest one started there)
        self.retired = []        # instances stopped or killed, for their logs
        self.endpoints = []      # [(epoch s, ready slots)] each time the map changed
        self.last = {}           # instance name -> its latest ring_figures
        self.procs = []
        self.aliases = {}        # ALIASES[slot] -> slot, while the second address is on
        self.peers = {}          # slot -> its ring_peers ("list"), as its file has them
        self._ready = set()      # slots the probes find ready
        self._map_lock = threading.Lock()
        self._stop = threading.Event()
        self._probers, self._sampler = [], None
        self._ns_made = False
        self.dir = Path(tempfile.mkdtemp(prefix="pl-ringlab"))
        self._hosts = {}         # slot -> {address: offset of its line's first byte}
        sweep_namespaces()
        try:
            _run("ip", "netns", "add", self.ns)
            self._ns_made = True
            _run("ip", "-n", self.ns, "link", "set", "lo", "up")
            for a in ADDRS:
                _run("ip", "-n", self.ns, "addr", "add", f"{a}/32", "dev", "lo")
            # Routes to the VIP and the second addresses (nothing listens
            # there): the DNAT on the output hook sends each connection on
            # to an instance.
            for a in [VIP, *ALIASES]:
                _run("ip", "-n", self.ns, "route", "add", f"{a}/32", "dev", "lo")
            self._set_map(())
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
        for every new connection when none is ready (kube-proxy rejects);
        and a DNAT for each second address that is on."""
        rule = (f"ip daddr {VIP} tcp dport {PORT} dnat to numgen random mod {len(slots)} map "
                "{ " + ", ".join(f"{i} : {ADDRS[s]}" for i, s in enumerate(slots)) + " }"
                if slots else "")
        reject = "" if slots else f"ip daddr {VIP} tcp dport {PORT} reject with tcp reset"
        alias = "".join(f"    ip daddr {a} tcp dport {PORT} dnat to {ADDRS[s]}\n"
                        for a, s in sorted(self.aliases.items()))
        script = ("table ip plring {}\ndelete table ip plring\n"
                  "table ip plring {\n"
                  "  chain svc {\n    type nat hook output priority -100; policy accept;\n"
                  f"    {rule}\n{alias}  }}\n"
                  "  chain noep {\n    type filter hook output priority 0; policy accept;\n"
                  f"    {reject}\n  }}\n"
                  "}\n")
        _run("ip", "netns", "exec", self.ns, "nft", "-f", "-", stdin=script)

    def _apply(self):
        """The map for the ready set now (the caller holds _map_lock)."""
        slots = tuple(sorted(self._ready))
        try:
            self._set_map(slots)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            sys.stderr.write(f"ring_lab: endpoints not updated: {e}\n")
            return
        if not self.endpoints or self.endpoints[-1][1] != slots:
            self.endpoints.append((time.time(), slots))

    def _prober(self, inst):
        """The readiness probe of one instance (one pod), until the lab
        closes or another instance starts in its slot."""
        impair.enter(self.ns)
        p = self.probe
        due = inst.started + random.random() * p.period_ms / 1000
        fails = oks = 0
        ready = False
        while not self._stop.is_set() and self.instances.get(inst.slot) is inst:
            wait = due - time.time()
            if wait > 0:
                self._stop.wait(min(wait, 0.05))
                continue
            due += p.period_ms / 1000
            try:
                status, _ = http_get((inst.addr, PORT), "/readyz", timeout=p.timeout_ms / 1000)
            except (OSError, Closed, ValueError, IndexError):
                status = 0
            oks, fails = (oks + 1, 0) if status == 200 else (0, fails + 1)
            if not (fails >= p.failures if ready else oks >= p.successes):
                continue
            ready = not ready
            with self._map_lock:
                if self.instances.get(inst.slot) is not inst:
                    break
                (self._ready.add if ready else self._ready.discard)(inst.slot)
                self._apply()

    def set_alias(self, slot, on):
        """Gives ADDRS[slot] its second address ALIASES[slot] (a DNAT to it
        alone), or takes it away."""
        with self._map_lock:
            if on:
                self.aliases[ALIASES[slot]] = slot
            else:
                self.aliases.pop(ALIASES[slot], None)
            self._set_map(tuple(sorted(self._ready)))

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

    def wait_endpoints(self, slots, timeout=None):
        if timeout is None:
            timeout = 10 + 2 * self.probe.period_ms / 1000
        deadline = time.monotonic() + timeout
        while tuple(sorted(slots)) != self.ready_slots():
            if time.monotonic() > deadline:
                raise AssertionError(f"endpoints {self.ready_slots()}, wanted {sorted(slots)}")
            time.sleep(0.02)

    # -- the ring settings

    def _write_conf(self, slot, peers=None):
        """Writes ADDRS[slot]'s ring settings (replacing the file: a reload
        reads the path again). <peers>: ring_peers's addresses ("list")."""
        if self.mode == "dns":
            text = f"ring_dns = {RING_NAME}:{PORT}\nring_resolve_ms = {self.resolve_ms}\n"
        else:
            text = (f"ring_peers = {','.join(f'{a}:{PORT}' for a in peers)}\n"
                    f"ring_self = {ADDRS[slot]}:{PORT}\n")
        self.peers[slot] = list(peers or ())
        path = self.dir / f"{ADDRS[slot]}.conf"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path

    def _write_hosts(self, slot, members):
        """ADDRS[slot]'s /etc/hosts: a line per address of ADDRS, those not
        in <members> commented out, so that dns_set() turns one on or off
        by rewriting its first byte (one write, never seen half done)."""
        text, offsets = "127.0.0.1 localhost\n", {}
        for a in ADDRS:
            offsets[a] = len(text)
            text += f"{' ' if a in members else '#'}{a} {RING_NAME}\n"
        path = self.dir / f"hosts-{ADDRS[slot]}"
        if slot in self._hosts:  # bind-mounted already: in place
            with open(path, "r+b") as f:
                f.write(text.encode())
        else:
            path.write_text(text)
        self._hosts[slot] = offsets
        return path

    def dns_set(self, slot, addr, on):
        """Lists <addr> under RING_NAME in ADDRS[slot]'s /etc/hosts, or not
        (a slot never started has none yet: start() writes it)."""
        if slot not in self._hosts:
            return
        with open(self.dir / f"hosts-{ADDRS[slot]}", "r+b") as f:
            f.seek(self._hosts[slot][addr])
            f.write(b" " if on else b"#")

    def peers_of(self, slot):
        return self.peers.get(slot, [])

    def reload(self, slot, peers):
        """Gives ADDRS[slot] the static list <peers> (addresses, of ADDRS or
        ALIASES) and SIGHUPs it; returns once it logged the reload."""
        inst = self.instances[slot]
        before = inst.reloads()
        self._write_conf(slot, peers)
        inst.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while (now := inst.reloads()) == before:
            if time.monotonic() > deadline or not inst.alive():
                raise AssertionError(f"{inst.addr} did not reload: {inst.stderr()[-3000:]}")
            time.sleep(0.005)
        if now[1] != before[1]:
            raise AssertionError(f"{inst.addr}: reload failed: {inst.stderr()[-3000:]}")

    # -- instances

    def start(self, slot, peers=None, dns=None):
        """Starts an instance on ADDRS[slot] (must be free). Returns it.
        "list": <peers> is its ring_peers (addresses; every one of ADDRS by
        default). "dns": <dns> the addresses its /etc/hosts lists (itself
        added)."""
        old = self.instances.get(slot)
        if old is not None:
            if old.alive():
                raise RuntimeError(f"slot {slot} is running")
            self.retired.append(old)
        gen = 1 + sum(1 for i in self.retired if i.slot == slot)
        conf = self._write_conf(slot, ADDRS if peers is None else peers)
        preexec = None
        if self.mode == "dns":
            hosts = self._write_hosts(slot, set(dns or ()) | {ADDRS[slot]})
            enter, private = impair.child_in(self.ns), impair.private_hosts(hosts)

            def preexec():
                enter()
                private()
        inst = Instance(self, slot, self.binary, self.extra_args, conf, gen, preexec)
        with self._map_lock:
            self.instances[slot] = inst
            self._ready.discard(slot)  # a new pod: ready at its first probe
            self._apply()
        t = threading.Thread(target=self._prober, args=(inst,), daemon=True)
        t.start()
        self._probers.append(t)
        return inst

    def sigterm(self, slot):
        t = time.time()
        self.instances[slot].proc.send_signal(signal.SIGTERM)
        return t

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
        for t in [*self._probers, self._sampler]:
            if t is not None:
                t.join(5)
        if self._ns_made:
            subprocess.run(["ip", "netns", "del", self.ns], capture_output=True, timeout=10)
            self._ns_made = False
        shutil.rmtree(self.dir, ignore_errors=True)
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
    that answered, in order: a 307's target follows its sender; a second
    address as the instance's own), rt (when each 307 came, epoch s).
    Redirects are followed as fetch follows them: 20, and the 21st is an
    error ("redirect count exceeded")."""

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
            rec = {"run": run, "key": k, "due": due, "answer": None, "error": None, "via": [],
                   "rt": []}
            origin, path = (VIP, PORT), "/warm-start"
            try:
                for _ in range(REDIRECTS_MAX + 1):
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
                        rec["rt"].append(time.time())
                        if len(rec["rt"]) > REDIRECTS_MAX:
                            rec["error"] = "redirect count exceeded"
                            break
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
        peer = (_conntrack_peer(sock) if origin[0] == VIP else
                ADDRS[ALIASES.index(origin[0])] if origin[0] in ALIASES else origin[0])
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
    "views": "while the members' views disagree for good (two member lists, two names "
             "for one member) or as two names become one again: whoever answered",
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
    if event in ("split", "alias", "unalias"):
        return "views"
    if event == "leave":
        event = "drain"
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
                kind = ("redirect_limit" if "redirect count" in w else
                        "refused_svc" if re.search("refused", w, re.I) and VIP in w else
                        "refused_307" if re.search("refused", w, re.I) else
                        "cut" if re.search("reset|closed|incomplete|EPIPE|socket", w, re.I) else
                        "other")
                why[kind] = why.get(kind, 0) + 1
    return {"backoffs": n, "backoff_s": round(total, 1), "backoff_why": why}


def chains_of(procs, records):
    """[(route, id, [epoch s of each redirect])]: every poll of the light
    controllers and every dispatch that was redirected (the real client's
    polls are not seen; fetch's limit is, as its back-off's cause)."""
    out = [("poll", e["ctl"], e["rt"]) for p in procs for e in list(p.events)
           if e.get("ev") == "chain"]
    return out + [("dispatch", r["run"], r["rt"]) for r in records if r.get("rt")]


def redirect_figures(chains, procs, records, t0, t1):
    """What [t0, t1) cost in redirects, per route: the most one request
    had in it, one more if the request had been redirected before t0 (it
    came into the change redirected once already) -- the hop rule allows
    2 --; the longest whole chain among those requests; the requests over
    2, with when each redirect came (seconds after t0); and how many gave
    up at fetch's limit (the 21st redirect)."""
    most, longest, over = {"poll": 0, "dispatch": 0}, {"poll": 0, "dispatch": 0}, []
    for route, what, rt in chains:
        inside = sum(1 for t in rt if t0 <= t < t1)
        if not inside:
            continue
        n = inside + any(t < t0 for t in rt)
        most[route] = max(most[route], n)
        longest[route] = max(longest[route], len(rt))
        if n > 2:
            over.append({"route": route, "id": what, "at_s": [round(t - t0, 3) for t in rt]})
    limit = sum(1 for p in procs for e in list(p.events)
                if e.get("ev") == "backoff" and t0 <= e.get("t", 0) < t1
                and "redirect count" in e.get("why", ""))
    limit += sum(1 for r in records if r["error"] == "redirect count exceeded"
                 and t0 <= r.get("t", r["due"]) < t1)
    return {"redirects_most": most, "chain_longest": longest, "over_2": over,
            "redirect_limit": limit}


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
# The scenario sequences the test and loadtest/ring-scale run
# --------------------------------------------------------------------------

SEQUENCES = {
    # ring_peers: a 4th joins by the documented reload (it starts with the
    # new list, the others get it and a SIGHUP one after another); one
    # drains; it returns (still in every list: a join by a list made in
    # advance); one is SIGKILLed.
    "list": ("add", "drain", "readd", "kill"),
    # ring_dns: a 4th starts under the name, which each instance's cache
    # lists at another moment; one drains as the name drops it, cache by
    # cache; it returns the same way.
    "dns": ("add", "leave", "readd"),
    # ring_peers, views that never agree until fixed: a 4th listed by some
    # instances only ("split"), then by all ("heal"); one instance listed
    # under a second address too by the others ("alias"), then not.
    "disagree": ("split", "heal", "alias", "unalias"),
}


def run_sequence(binary, *, sequence="list", events=None, keys=100, per_key=3,
                 node_keys=range(0, 20), rate=60.0, baseline_s=3.0, window_s=5.0,
                 stagger_s=STAGGER_S, resolve_ms=RESOLVE_MS, add_slot=3, drain_slot=1,
                 kill_slot=0, seed=1, extra_args=(), probe=LAB_PROBE, keep_records=False,
                 backoff=True, say=lambda s: None):
    """3 instances (every slot but <add_slot>), the fleet parked, dispatches
    flowing; then each of <events> (SEQUENCES[<sequence>] by default), each
    with a window after it of <window_s>, plus <stagger_s> where the change
    is spread over the instances (their reloads, or their DNS caches: one at
    the event, the last <stagger_s> later, the others between), plus
    <window_s> more where views disagree for good. <extra_args> go to every
    instance; <probe>: the Service's readiness probe; <backoff> False: the
    light controllers poll again at once after an error. Returns
    {"baseline": figures, "events": [figures of each window], "all": ...}."""
    events = SEQUENCES[sequence] if events is None else tuple(events)
    mode = "dns" if sequence == "dns" else "list"
    rng = random.Random(f"{seed}/{sequence}")
    wall = time.monotonic()
    procs, disp = [], None
    out = {"sequence": sequence, "probe": repr(probe), "stagger_s": stagger_s, "events": []}
    with Lab(binary, probe=probe, extra_args=extra_args, mode=mode,
             resolve_ms=resolve_ms) as lab:
        try:
            first = [s for s in range(len(ADDRS)) if s != add_slot]
            named = {ADDRS[s] for s in first}  # the static lists' members, or the name's
            for s in first:
                lab.start(s, peers=[ADDRS[x] for x in first], dns=named)
            lab.wait_ring(3)
            lab.wait_endpoints(first)
            light, node = fleet(keys, per_key, set(node_keys))
            if node:
                procs.append(lab.node_controllers(node))
            if light:
                procs.append(lab.light_controllers(light, seed=seed, backoff=backoff))
            lab.wait_parked(len(light) + len(node), procs)
            say(f"{sequence}: {len(light) + len(node)} controllers parked "
                f"({len(node)} WarmStartClient) on {lab.live()}")
            disp = Dispatcher(lab.ns, rate, keys, seed=seed)
            t_base = time.time()
            time.sleep(baseline_s)
            marks = []
            state = {"odd": None}

            def alive():
                return {i.name for i in lab.instances.values() if i.alive()}

            def spread(slots, t0, fn, what):
                """fn(slot) for each of <slots> in a random order, the first
                at <t0>, the last <stagger_s> later; [(epoch s, what)]."""
                slots = list(slots)
                rng.shuffle(slots)
                acts = []
                for i, s in enumerate(slots):
                    at = t0 + (i * stagger_s / (len(slots) - 1) if len(slots) > 1 else 0.0)
                    time.sleep(max(0.0, at - time.time()))
                    fn(s)
                    acts.append((time.time(), f"{what} {ADDRS[s]}"))
                return acts

            def others(slot):
                return [s for s in lab.live() if s != slot]

            def join(slot):
                """A member starts: the others learn of it as <sequence> says."""
                if mode == "dns":
                    named.add(ADDRS[slot])
                    t0 = lab.start(slot, dns=named).started
                    return t0, spread(others(slot), t0,
                                      lambda s: lab.dns_set(s, ADDRS[slot], True), "hosts+"), True
                listed = all(ADDRS[slot] in lab.peers_of(s) for s in others(slot))
                t0 = lab.start(slot, peers=ADDRS).started
                if listed:  # in every list already
                    return t0, [], False
                return t0, spread(others(slot), t0, lambda s: lab.reload(s, ADDRS),
                                  "reload"), True

            def reload_all(slots, peers):
                acts = []
                for s in slots:
                    lab.reload(s, peers)
                    acts.append((time.time(), f"reload {ADDRS[s]}"))
                return acts

            def do(name):
                """Does the event <name>: (the slot it is about, its start,
                [(epoch s, what was done)], {address: members that instance
                should count after it}, whether it was spread over
                <stagger_s>, its window in <window_s>s)."""
                live = lab.live()
                if name in ("add", "readd"):
                    slot = add_slot if name == "add" else drain_slot
                    t0, acts, staggered = join(slot)
                    n = len(lab.live())
                    return slot, t0, acts, {ADDRS[s]: n for s in lab.live()}, staggered, 1
                if name in ("drain", "leave"):
                    t0 = lab.sigterm(drain_slot)
                    acts = []
                    if name == "leave":
                        named.discard(ADDRS[drain_slot])
                        acts = spread(others(drain_slot), t0,
                                      lambda s: lab.dns_set(s, ADDRS[drain_slot], False),
                                      "hosts-")
                    lab.wait_exit(drain_slot)
                    return drain_slot, t0, acts, {ADDRS[s]: len(live) - 1 for s in live}, \
                        name == "leave", 1
                if name == "kill":
                    t0 = lab.sigkill(kill_slot)
                    return kill_slot, t0, [], {ADDRS[s]: len(live) - 1 for s in live
                                               if s != kill_slot}, False, 1
                if name == "split":  # the 4th in every list but one instance's
                    state["odd"] = odd = rng.choice(first)
                    t0 = lab.start(add_slot, peers=ADDRS).started
                    acts = reload_all([s for s in first if s != odd], ADDRS)
                    return add_slot, t0, acts, {ADDRS[s]: 4 for s in lab.live() if s != odd}, \
                        False, 2
                if name == "heal":
                    odd = state["odd"]
                    t0 = time.time()
                    return odd, t0, reload_all([odd], ADDRS), {ADDRS[odd]: 4}, False, 1
                if name in ("alias", "unalias"):  # <target> under two names, or one
                    target = state["odd"] if state["odd"] is not None else live[0]
                    peers = ADDRS + ([ALIASES[target]] if name == "alias" else [])
                    t0 = time.time()
                    if name == "alias":
                        lab.set_alias(target, True)
                    acts = reload_all([s for s in live if s != target], peers)
                    if name == "unalias":
                        lab.set_alias(target, False)
                    return target, t0, acts, {ADDRS[s]: len(peers) for s in live
                                              if s != target}, False, 2 if name == "alias" else 1
                raise ValueError(f"no event {name!r}")

            for name in events:
                before = {"before": lab.in_ns(lab.snapshot), "alive": alive(),
                          "members_before": [ADDRS[s] for s in lab.live()]}
                slot, t0, acts, expect, staggered, windows = do(name)
                m = dict(before, name=name, slot=slot, t0=t0, actions=acts, expect=expect)
                m["members_after"] = [ADDRS[s] for s in lab.live()]
                say(f"{name} {ADDRS[slot]} at +{t0 - t_base:.1f} s"
                    + (f" ({', '.join(f'{w} +{t - t0:.2f}' for t, w in acts)})" if acts else ""))
                length = windows * window_s + (stagger_s if staggered else 0.0)
                time.sleep(max(0.0, t0 + length - time.time()))
                m["t1"] = time.time()
                m["after"] = lab.in_ns(lab.snapshot)
                m["alive"] |= alive()
                marks.append(m)
            records = disp.stop()
            disp = None
            time.sleep(1.5)  # a true run's payload may still be on its way
            got = receipts_of(procs)
            pauses = pauses_of(procs)
            chains = chains_of(procs, records)
            place(records, [m["t0"] for m in marks])
            out["baseline"] = figures(records, got, t_base, marks[0]["t0"], pauses)
            out["baseline"].update(redirect_figures(chains, procs, records, t_base,
                                                    marks[0]["t0"]))
            for m in marks:
                out["events"].append(window_figures(lab, m, records, got, pauses, procs,
                                                    chains))
            b0, b1 = t_base, marks[0]["t0"]
            out["owner_model"] = owner_model_check(records, marks[0]["members_before"], b0, b1)
            if keep_records:
                out["records"] = records
            out["all"] = figures(records, got, 0, float("inf"))
            out["all"].pop("missed")
            out["all"].update(redirect_figures(chains, procs, records, 0, float("inf")))
            # whole chains of 3 or more: each crossed two changes or more
            # unless a window's "over_2" lists it
            out["all"]["long_chains"] = sum(1 for _, _, rt in chains if len(rt) > 2)
            out["all"].pop("over_2")
            out["stray"] = len({r for _, r, _ in got} - {r["run"] for r in records})
            out["controller_events"] = {}
            for p in procs:
                for e in list(p.events):
                    if e.get("ev") not in ("run", "polling", "chain"):
                        out["controller_events"][e["ev"]] = \
                            out["controller_events"].get(e["ev"], 0) + 1
        finally:
            if disp is not None:
                disp.stop()
            out["sanitizer_reports"] = lab.close()
    out["wall_s"] = round(time.monotonic() - wall, 1)
    return out


def window_figures(lab, m, records, got, pauses, procs, chains):
    """The figures of one event's window <m> (run_sequence's marks)."""
    t0, t1 = m["t0"], m["t1"]
    f = figures(records, got, t0, t1, pauses)
    f["name"], f["slot"], f["window_s"] = m["name"], ADDRS[m["slot"]], round(t1 - t0, 2)
    f["actions"] = [(round(t - t0, 3), w) for t, w in m["actions"]]
    f["ring"] = ring_delta(m["before"], {k: v for k, v in m["after"].items()
                                         if k in m["alive"]})
    f["ring_total"] = ring_totals(f["ring"])
    f.update(backoffs(procs, t0, t1))
    f.update(redirect_figures(chains, procs, records, t0, t1))
    # (a log line's time is cut to the millisecond: one may read a little
    # before the event that caused it)
    f["ring_changes"] = {i.name: [(round(t - t0, 3), n, s)
                                  for t, n, s in i.ring_changes() if t0 - 0.002 <= t < t1]
                         for i in list(lab.instances.values()) + lab.retired
                         if i.name in m["alive"]}
    f["endpoints"] = [(round(t - t0, 3), [ADDRS[s] for s in e])
                      for t, e in lab.endpoints if t0 <= t < t1]
    # when the Service stopped sending new connections to the instance gone
    gone = [t for t, e in f["endpoints"] if m["name"] in ("kill", "drain", "leave")
            and f["slot"] not in e]
    f["svc_out_s"] = gone[0] if gone else None
    # when each instance first counted the members it should after the change
    seen = {}
    for name, ch in f["ring_changes"].items():
        hit = [t for t, n, _ in ch if n == m["expect"].get(name.split("#")[0])]
        if hit:
            seen[name.split("#")[0]] = hit[0]
    f["seen"] = seen
    f["first_seen_s"] = min(seen.values()) if seen else None
    f["all_seen_s"] = max(seen.values()) if len(seen) == len(m["expect"]) else None
    last = max((x["at_s"] for x in f["missed"]), default=None)
    f["late_s"] = (None if last is None else
                   round(last - (f["first_seen_s"] or 0.0), 3))
    # each miss after the latest moment an instance took the change before
    # it: the misses of a change come as each instance takes it
    f["after_change_s"] = max((round(x["at_s"] - max([s for s in seen.values()
                                                      if s <= x["at_s"]], default=0.0), 3)
                               for x in f["missed"]), default=None)
    f["causes"] = {}
    for miss in f["missed"]:
        miss["cause"] = classify(miss, m["name"], m["members_before"], m["members_after"], seen)
        f["causes"][miss["cause"]] = f["causes"].get(miss["cause"], 0) + 1
    return f


def describe(out):
    """The sequence's figures, one paragraph per window."""
    def s_(v):
        return "-" if v is None else f"{v:+.3f}"
    lines = [f"sequence {out.get('sequence', 'list')}, probe {out.get('probe')}, "
             f"stagger {out.get('stagger_s')} s"]
    b = out["baseline"]
    lines.append(f"baseline: {b['dispatches']} dispatches, {b['misses']} misses "
                 f"({b['false']} false, {b['errors']} errors); redirects per request at most "
                 f"{b['redirects_most']['poll']}/{b['redirects_most']['dispatch']} (poll/"
                 f"dispatch)")
    for f in out["events"]:
        rt, rm, cl = f["ring_total"], f["redirects_most"], f["chain_longest"]
        lines.append(
            f"{f['name']:7} {f['slot']}: {f['dispatches']} dispatches in {f['window_s']} s, "
            f"misses {f['misses']} ({f['false']} false, {f['errors']} errors), "
            f"last {f['recovery_s']:.2f} s after it, {s_(f['late_s'])} s after the first "
            f"member saw the change ({s_(f['first_seen_s'])}; all by {s_(f['all_seen_s'])}); "
            f"duplicates {f['duplicates']}, "
            f"true-unreceived {f['true_unreceived']}, false-received {f['false_received']}, "
            f"error-received {f['error_received']}; redirects per request at most "
            f"{rm['poll']}/{rm['dispatch']} (poll/dispatch; longest chain {cl['poll']}/"
            f"{cl['dispatch']}), over 2: {len(f['over_2'])}, at fetch's limit "
            f"{f['redirect_limit']}; redirects poll/dispatch "
            f"{rt['redirects_poll']}/{rt['redirects_dispatch']}, hop-served poll/dispatch "
            f"{rt['hop_served_poll']}/{rt['hop_served_dispatch']}, moved {rt['moved']}; "
            f"controller back-offs {f['backoffs']} ({f['backoff_s']} s, {f['backoff_why']}); "
            + (f"Service out {s_(f['svc_out_s'])} s; " if f["svc_out_s"] is not None else "")
            + f"miss causes {f['causes']}")
        if f["actions"]:
            lines.append("    done: " + ", ".join(f"{w} {t:+.3f}" for t, w in f["actions"]))
        lines.append("    seen: " + "; ".join(
            f"{n} " + ",".join(f"{m}@{t:+.3f}" for t, m, _ in ch)
            for n, ch in f["ring_changes"].items() if ch) + "; endpoints: " + ", ".join(
            f"{len(e)}@{t:+.3f}" for t, e in f["endpoints"]))
        for o in f["over_2"][:10]:
            lines.append(f"    over 2: {o['route']} {o['id']} redirected at "
                         + ",".join(f"{t:+.3f}" for t in o["at_s"]))
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
                 f"error-received {a['error_received']}, stray {out['stray']}; longest chain "
                 f"{a['chain_longest']['poll']}/{a['chain_longest']['dispatch']} ("
                 f"{a['long_chains']} of 3 or more), at fetch's "
                 f"limit {a['redirect_limit']}; controller "
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


class RedirectLimit(OSError):
    """fetch's network error at the 21st redirect of one request."""


async def _fetch(pool, origin, path, headers, state):
    """GET, following redirects as fetch does (at most 20: the 21st is a
    network error); (status, body). state["origin"] names the connection
    in use, for an abort to drop; state["rt"] gets when each 307 came."""
    state["rt"] = []
    while True:
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
            state["rt"].append(time.time())
            if len(state["rt"]) > REDIRECTS_MAX:
                raise RedirectLimit("redirect count exceeded")
            m = re.match(r"http://([^:/]+):(\d+)(/\S*)", h["location"])
            origin, path = (m.group(1), int(m.group(2))), m.group(3)
            continue
        return status, body


def _chain(c, began, state, end):
    """One poll's redirects, if it had any: when each came."""
    if state.get("rt"):
        _emit(ev="chain", ctl=c["id"], t0=began, rt=state["rt"], end=end)


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
            why, began = None, time.time()
            try:
                status, body = await asyncio.wait_for(
                    _fetch(pool, vip, "/warm-start", headers, state), timeout_s)
            except asyncio.TimeoutError:
                pool.drop(state.get("origin"))  # an abort ends its connection
                _emit(ev="timeout", ctl=c["id"], t=time.time())
                _chain(c, began, state, "timeout")
                continue
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    ValueError) as e:
                pool.drop(state.get("origin"))
                why = repr(e)
            _chain(c, began, state, "error" if why else str(status))
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
