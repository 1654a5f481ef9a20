"""Controllers that vanish while parked: pl-wire drops every packet from and
to their address, or every packet at all (no FIN, no RST), on a 20 ms RTT
path (impair.py).

Under delivery = confirm a dispatch to vanished controllers answers `false`,
or reaches a live poll of the key, within answer_bound_s(): the budget for
the safe moves (--confirm-timeout-ms), the longest wait for an
acknowledgement that may still come (--confirm-wait-max-ms, passed where the
binary has it) and slack for a shared machine. Two vanished controllers
queued ahead of a live one on another address do not keep the run from it.
Under delivery = written a vanished controller gets `true` for a run it never
received: that is what written promises (a live socket took the payload),
and the test reports it as such.

With a key ring (three instances at 10.78.0.1-3, each controller reaching
them on its own TCP connection, through a virtual IP that nftables DNATs to
any of them, or straight to the first without nft, and following the 307 to
its key's owner; each dispatch sent to an instance that does not own its key
and followed): the same answers, false for a key whose controllers vanished,
true and received once for a key with a live controller behind them.

Skipped, with the reason, without root, iproute2 or /dev/net/tun.
"""
import json
import select
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse

import pytest

import impair
from conftest import BIN, EXAMPLE, Metrics, Server, key_of, run_binary

RTT_MS = 20
CONFIRM_TIMEOUT_MS = 2000
CONFIRM_WAIT_MAX_MS = 3000
SLACK_MS = 1500
KEY = ("deployment_vanish", "20261130.1", 0.5, 1)
GONE_IP, LIVE_IP = impair.CTL_IPS[1], impair.CTL_IPS[2]


def answer_bound_s(confirm_timeout_ms, confirm_wait_max_ms, slack_ms=SLACK_MS):
    """Longest time to an answer when controllers vanished, in seconds."""
    return (confirm_timeout_ms + confirm_wait_max_ms + slack_ms) / 1000


def has_flag(flag):
    """True if `pilotlight --help` lists <flag>."""
    rc, out, err = run_binary("--help")
    return rc == 0 and flag in out + err


def confirm_args():
    args = ["--delivery", "confirm", "--confirm-timeout-ms", str(CONFIRM_TIMEOUT_MS)]
    if has_flag("--confirm-wait-max-ms"):
        args += ["--confirm-wait-max-ms", str(CONFIRM_WAIT_MAX_MS)]
    return args


@pytest.fixture(scope="module")
def net():
    why = impair.why_unavailable()
    if why:
        pytest.skip(why)
    wire = impair.wire_binary(BIN)
    if wire is None:
        pytest.fail("tests/pl-wire is not built (ninja -C build)")
    try:
        n = impair.ImpairedNet(wire)
    except (OSError, RuntimeError) as e:
        pytest.skip(f"cannot make the namespaces and the wire here: {e}")
    with n:
        yield n


@pytest.fixture
def ns_server(net):
    """start(*args): pilotlight in the server namespace of a freshly shaped
    wire; stopped (exit 0, no sanitizer report) at teardown."""
    net.shape(rtt_ms=RTT_MS)
    servers, socks = [], []

    def start(*args):
        srv = impair.NsServer(Server, net.srv, *args)
        srv.socks = socks
        servers.append(srv)
        return srv
    yield start
    for s in socks:
        s.close()
    for srv in servers:
        srv.stop()


def park(net, srv, bind, controller_id):
    """A raw long poll from <bind> in the controller namespace; waits until
    the server has parked it. Returns the socket."""
    before = srv.metrics(Metrics).parked_now

    def go():
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((bind, 0))
        s.settimeout(10)
        s.connect((impair.SRV_IP, srv.port))
        s.sendall(impair.poll_request(KEY, controller_id))
        return s
    s = impair.in_ns(net.ctl, go)
    srv.socks.append(s)
    deadline = time.monotonic() + 10
    while srv.metrics(Metrics).parked_now < before + 1:
        assert time.monotonic() < deadline, f"{controller_id} did not park"
        time.sleep(0.02)
    return s


def message(run_id):
    m = json.loads(json.dumps(EXAMPLE))
    m["deployment"]["friendlyId"], m["backgroundWorker"]["version"] = KEY[0], KEY[1]
    m["run"]["machine"]["cpu"], m["run"]["machine"]["memory"] = KEY[2], KEY[3]
    m["run"]["friendlyId"] = run_id
    return m


def dispatch(net, srv, run_id):
    """(didWarmStart, seconds to the answer) from inside the server namespace."""
    t0 = time.monotonic()
    status, body = impair.ns_request(net.srv, srv.port, impair.dispatch_body(message(run_id)),
                                     timeout=60)
    return impair.answer_of(status, body), time.monotonic() - t0


def received(sock, wait):
    """The run id <sock> received within <wait> s, or None if nothing came."""
    sock.settimeout(wait)
    try:
        status, body, _ = impair.read_response(sock)
    except (OSError, impair.Closed):
        return None
    return json.loads(body)["run"]["friendlyId"] if status == 200 else None


def nothing_arrives(sock, wait=0.5):
    r, _, _ = select.select([sock], [], [], wait)
    return not r


def test_dispatches_to_vanished_controllers_answer_false(net, ns_server, request):
    """Three polls, then the whole controller side vanishes; three
    concurrent dispatches: each answers false (nobody can have the run)
    within the bound."""
    srv = ns_server(*confirm_args())
    gone = [park(net, srv, impair.CTL_IPS[i], f"ctl_gone_{i}") for i in range(3)]
    net.drop_all()
    bound = answer_bound_s(CONFIRM_TIMEOUT_MS, CONFIRM_WAIT_MAX_MS)
    disp = impair.Dispatcher(net.srv, srv.port, workers=3, timeout=60)
    try:
        runs = [(f"run_gone_{i}", message(f"run_gone_{i}")) for i in range(3)]
        answers = disp.run(runs, rate=1000)
    finally:
        disp.close()
    m = srv.metrics(Metrics)
    got = ", ".join(f"{r} {a} in {t * 1000:.0f} ms" + (f" ({e})" if e else "")
                    for r, (a, t, e) in sorted(answers.items()))
    impair.show(request, f"three vanished, confirm: {got}; bound {bound:.1f} s")
    assert all(a is False for a, _, _ in answers.values()), (got, m.text)
    assert all(t <= bound for _, t, _ in answers.values()), (got, bound)
    assert all(nothing_arrives(s, 0) for s in gone)


def test_two_vanished_ahead_of_a_live_one(net, ns_server, request):
    """fifo: two polls from an address that vanished, then a live one from
    another; the run reaches the live one, true, within the bound."""
    srv = ns_server(*confirm_args())
    gone = [park(net, srv, GONE_IP, f"ctl_gone_{i}") for i in range(2)]
    live = park(net, srv, LIVE_IP, "ctl_live")
    net.drop_ip(GONE_IP)
    bound = answer_bound_s(CONFIRM_TIMEOUT_MS, CONFIRM_WAIT_MAX_MS)
    answer, took = dispatch(net, srv, "run_behind_two")
    got = received(live, bound)
    m = srv.metrics(Metrics)
    impair.show(request, f"two vanished ahead of a live one, confirm: {answer} in"
                         f" {took * 1000:.0f} ms (bound {bound:.1f} s); the live poll got {got}")
    assert answer is True and got == "run_behind_two", m.text
    assert took <= bound, took
    assert all(nothing_arrives(s, 0) for s in gone)


def test_written_answers_true_for_a_vanished_controller(net, ns_server, request):
    """written's known limit, reported as what it is: the payload went into
    a live socket of a controller that had vanished, the answer is true,
    and nobody received the run."""
    srv = ns_server("--delivery", "written")
    gone = park(net, srv, GONE_IP, "ctl_gone")
    net.drop_ip(GONE_IP)
    answer, took = dispatch(net, srv, "run_into_the_void")
    void = nothing_arrives(gone, 1.0)
    impair.show(request, f"vanished, written: answered {answer} in {took * 1000:.1f} ms;"
                         f" received by nobody: {void} (written's known true for a run"
                         " nobody received)")
    assert answer is True and void, "written no longer answers true for a vanished controller:" \
        " update this test and docs/delivery.md"


# --------------------------------------------------------------------------
# With a key ring
# --------------------------------------------------------------------------

RING_IPS = [impair.SRV_IP, "10.78.0.2", "10.78.0.3"]
RING_PORT = 8080  # in the server namespace, ours alone
VIP = "10.78.0.100"


def http(sock, raw, buf=b""):
    """Sends <raw> on <sock> (unless empty) and reads one response:
    (status, headers, body, rest)."""
    if raw:
        sock.sendall(raw)
    while b"\r\n\r\n" not in buf:
        buf = impair._recv_more(sock, buf)
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(buf) < length:
        buf = impair._recv_more(sock, buf)
    return int(lines[0].split(" ", 2)[1]), headers, buf[:length], buf[length:]


def location(headers):
    """(host, port, target) of a Location http://HOST:PORT/PATH?QUERY."""
    u = urllib.parse.urlsplit(headers["location"])
    return u.hostname, u.port, f"{u.path}?{u.query}"


def post_raw(target, body):
    return (f"POST {target} HTTP/1.1\r\nHost: pilotlight\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def srv_request(net, ip, raw):
    """One request from inside the server namespace to <ip>:RING_PORT."""
    def go():
        with socket.create_connection((ip, RING_PORT), timeout=30) as s:
            return http(s, raw)[:3]
    return impair.in_ns(net.srv, go)


def ring_metrics(net, ip):
    status, _, body = srv_request(net, ip, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 200, (status, body[:300])
    return Metrics(body.decode())


def key_message(key, run_id):
    m = json.loads(json.dumps(EXAMPLE))
    m["deployment"]["friendlyId"], m["backgroundWorker"]["version"] = key[0], key[1]
    m["run"]["machine"]["cpu"], m["run"]["machine"]["memory"] = key[2], key[3]
    m["run"]["friendlyId"] = run_id
    return json.dumps({"dequeuedMessage": m}).encode()


def redirects(m, route):
    return int(m.get("pilotlight_ring_redirects_total", route=route))


def virtual_ip(net):
    """A virtual IP in the controllers' namespace that nftables DNATs, one
    connection after another, to each instance (as a Kubernetes Service
    does). Returns a reason when it cannot be made, else None."""
    if shutil.which("nft") is None:
        return "nft is not installed"
    rules = (f"table ip plvip {{\n chain out {{\n  type nat hook output priority -100;\n"
             f"  ip daddr {VIP} tcp dport {RING_PORT} dnat to numgen inc mod 3 map {{ "
             + ", ".join(f"{i} : {ip}" for i, ip in enumerate(RING_IPS)) + " }\n }\n}\n")
    p = subprocess.run(["ip", "netns", "exec", net.ctl, "nft", "-f", "-"], input=rules,
                       capture_output=True, text=True, timeout=10)
    return None if p.returncode == 0 else f"nft refused the rules: {p.stderr.strip()}"


@pytest.fixture
def ring_net(net):
    """The wire shaped; the instances' addresses on the server side, and
    the virtual IP on the controller side where nftables can make it; all
    removed afterwards. Yields the address controllers connect to first
    and how it is reached."""
    net.shape(rtt_ms=RTT_MS)
    added = []
    try:
        for ip in RING_IPS[1:]:
            impair._ip("-n", net.srv, "addr", "add", f"{ip}/32", "dev", net.srv_dev)
            added.append(ip)
        why = virtual_ip(net)
        yield (VIP, "an nftables virtual IP") if why is None else \
            (RING_IPS[0], f"the first instance's address ({why})")
    finally:
        subprocess.run(["ip", "netns", "exec", net.ctl, "nft", "delete", "table", "ip",
                        "plvip"], capture_output=True, timeout=10)
        for ip in added:
            subprocess.run(["ip", "-n", net.srv, "addr", "del", f"{ip}/32", "dev", net.srv_dev],
                           capture_output=True, timeout=10)


def ring_park(net, entry, bind, key, cid, owner_ip, socks):
    """A long poll from <bind> in the controller namespace, sent to <entry>
    and, when answered 307, sent again where the Location says, on a new
    connection from the same address; returns once the owner parked it.
    Returns the socket it is parked on."""
    before = ring_metrics(net, owner_ip).parked_total

    def connect(host, target):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((bind, 0))
        s.settimeout(10)
        s.connect((host, RING_PORT))
        raw = impair.poll_request(key, cid)
        s.sendall(raw.replace(b"GET /warm-start ", f"GET {target} ".encode(), 1))
        return s
    s = impair.in_ns(net.ctl, connect, entry, "/warm-start")
    socks.append(s)
    deadline = time.monotonic() + 10
    while ring_metrics(net, owner_ip).parked_total < before + 1:
        r, _, _ = select.select([s], [], [], 0.02)
        if r:
            status, headers, _, _ = http(s, b"")
            host, port, target = location(headers)
            assert status == 307 and (host, port) == (owner_ip, RING_PORT), (status, headers)
            s.close()
            s = impair.in_ns(net.ctl, connect, host, target)
            socks.append(s)
        assert time.monotonic() < deadline, f"{cid} did not park at {owner_ip}"
    return s


def test_ring_dispatches_to_vanished_controllers_answer_false(net, ring_net, request):
    """For each of three instances, two keys it owns: one whose two polls
    come from an address that then vanishes, one with a vanished poll ahead
    of a live one from another address. Every dispatch goes to an instance
    that does not own its key and follows the 307. Vanished keys: false;
    mixed keys: true, received once by the live controller; within the
    bound of one instance."""
    entry, how = ring_net
    names = [f"{ip}:{RING_PORT}" for ip in RING_IPS]
    servers, socks = [], []
    try:
        for ip, name in zip(RING_IPS, names):
            servers.append(Server(["--listen", name, "--ring-peers", ",".join(names),
                                   "--ring-self", name, "--ring-check-ms", "100",
                                   "--ring-check-timeout-ms", "300",
                                   *confirm_args()],
                                  listen=False, preexec_fn=impair.child_in(net.srv)))
        deadline = time.monotonic() + 20
        while any(ring_metrics(net, ip).get("pilotlight_ring_members") != 3 for ip in RING_IPS):
            assert time.monotonic() < deadline, "the ring did not form"
            time.sleep(0.05)
        # just after joining, an instance sends its misses on to where the
        # key's polls were before (2 checks + a check's timeout): past that,
        # a probe dispatch names the owner
        time.sleep(0.5)
        owned = {ip: [] for ip in RING_IPS}
        for i in range(200):
            key = key_of(i, "deployment_ringvanish")
            status, headers, body = srv_request(net, RING_IPS[0], post_raw(
                "/warm-start", key_message(key, "run_probe")))
            ip = location(headers)[0] if status == 307 else RING_IPS[0]
            assert status == 307 or impair.answer_of(status, body) is False, (status, body)
            if len(owned[ip]) < 2:
                owned[ip].append(key)
            if all(len(v) == 2 for v in owned.values()):
                break
        assert all(len(v) == 2 for v in owned.values()), owned
        gone_keys = {ip: keys[0] for ip, keys in owned.items()}
        mixed_keys = {ip: keys[1] for ip, keys in owned.items()}
        live = {}
        for n, ip in enumerate(RING_IPS):
            for j in range(2):
                ring_park(net, entry, GONE_IP, gone_keys[ip], f"ctl_gone_{n}_{j}", ip, socks)
            ring_park(net, entry, GONE_IP, mixed_keys[ip], f"ctl_ahead_{n}", ip, socks)
            live[ip] = ring_park(net, entry, LIVE_IP, mixed_keys[ip], f"ctl_live_{n}", ip, socks)
        net.drop_ip(GONE_IP)

        runs = []
        for n, ip in enumerate(RING_IPS):
            via = RING_IPS[(n + 1) % 3]
            runs.append((f"run_gone_{n}", gone_keys[ip], via, ip))
            runs.append((f"run_live_{n}", mixed_keys[ip], via, ip))
        answers = {}

        def dispatch_one(run_id, key, via, owner_ip):
            impair.enter(net.srv)
            body = key_message(key, run_id)
            t0 = time.monotonic()
            try:
                with socket.create_connection((via, RING_PORT), timeout=60) as s:
                    status, headers, _, _ = http(s, post_raw("/warm-start", body))
                host, port, target = location(headers)
                assert status == 307 and host == owner_ip, (status, headers)
                with socket.create_connection((host, port), timeout=60) as s:
                    status, _, resp, _ = http(s, post_raw(target, body))
                answers[run_id] = (impair.answer_of(status, resp), time.monotonic() - t0, None)
            except Exception as e:  # reported with the answers
                answers[run_id] = (None, time.monotonic() - t0, repr(e))
        threads = [threading.Thread(target=dispatch_one, args=r, daemon=True) for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        bound = answer_bound_s(CONFIRM_TIMEOUT_MS, CONFIRM_WAIT_MAX_MS)
        got = {ip: received(live[ip], bound) for ip in RING_IPS}
        again = {ip: not nothing_arrives(live[ip], 0.5) for ip in RING_IPS}
        receipts = [(f"ctl_live_{n}", got[ip]) for n, ip in enumerate(RING_IPS) if got[ip]]
        figures = impair.tally([r[0] for r in runs], answers, receipts)
        ms = [ring_metrics(net, ip) for ip in RING_IPS]
        per = [(redirects(m, "poll"), redirects(m, "dispatch")) for m in ms]
        text = ", ".join(f"{r} {a} in {t * 1000:.0f} ms" + (f" ({e})" if e else "")
                         for r, (a, t, e) in sorted(answers.items()))
        impair.show(request, f"ring of 3, controllers through {how}; confirm: {text};"
                             f" received {got}; bound {bound:.1f} s; duplicates"
                             f" {figures['duplicates']}, true-unreceived"
                             f" {figures['true_unreceived']}, false-received"
                             f" {figures['false_received']}; redirects (polls, dispatches)"
                             f" per instance {per}")
        for n, ip in enumerate(RING_IPS):
            assert answers[f"run_gone_{n}"][0] is False, text
            assert answers[f"run_live_{n}"][0] is True, text
            assert got[ip] == f"run_live_{n}", got
        assert not any(again.values()), again
        assert all(t <= bound for _, t, _ in answers.values()), (text, bound)
        assert figures["duplicates"] == figures["true_unreceived"] == 0, figures
        assert figures["false_received"] == figures["lost"] == 0, figures
        for m in ms:
            assert m.get("pilotlight_ring_redirects_total", route="dispatch") >= 2
            assert m.get("pilotlight_ring_hop_served_total", route="dispatch") == 0
    finally:
        for s in socks:
            s.close()
        for srv in servers:
            srv.stop()
