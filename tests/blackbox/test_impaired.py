"""The delivery promise on an impaired network, measured cell by cell.

pilotlight and the dispatcher live in one network namespace, 40 controllers
over 4 keys in another; pl-wire joins them with the delay and loss of each
cell (impair.py). 150 runs with unique ids are dispatched at 25 a second,
round-robin over the keys; each controller "works" 0.5-1.5 s after a run,
then polls again. Controllers record what they received, the dispatcher what
it was told. In both delivery modes, in every cell, the promise holds: no run
reaches two controllers, no `false` for a run a controller received, no
`true` for a run nobody received, nothing lost.

Cells: RTT 0.2, 20, 80 and 200 ms; RTT 1 ms with 2 % loss both ways; RTT
1 ms with 5 % of pure ACKs lost. In the RTT 20 ms and the ACK-loss cells
two of the four keys are served by Trigger.dev's real WarmStartClient
(tests/compat/controllers.mjs), the other two by our own controllers, half
of them keeping their connection after a run and half closing it.

The figures of each cell are printed as it ends and as a table at the end.
PL_IMPAIR_DISPATCHES and PL_IMPAIR_RATE change the number of runs and the
rate (for a longer measurement; the suite uses the defaults).

Skipped, with the reason, without root, iproute2 or /dev/net/tun. Runs
against the release build only (tests/run.sh): it measures timing-dependent
behaviour, which a sanitizer or valgrind would distort.
"""
import json
import os
import socket
import threading
import time

import pytest

import impair
from conftest import BIN, EXAMPLE

DISPATCHES = int(os.environ.get("PL_IMPAIR_DISPATCHES", "150"))
RATE = float(os.environ.get("PL_IMPAIR_RATE", "25"))
KEYS, PER_KEY = 4, 10
WORK_MS = (500, 1500)

# name -> wire settings; node_keys: the keys the real client serves. The
# wire's own wake-ups add about 0.1 ms to a round trip here, so the 0.2 ms
# cell sets 0.1 ms (the RTT the kernel measured is printed with each cell).
CELLS = {
    "rtt0.2": dict(rtt_ms=0.1),
    "rtt20": dict(rtt_ms=20, jitter_ms=1, node_keys=(2, 3)),
    "rtt80": dict(rtt_ms=80, jitter_ms=2),
    "rtt200": dict(rtt_ms=200, jitter_ms=5),
    "loss2": dict(rtt_ms=1, loss=0.02),
    "ackloss5": dict(rtt_ms=1, ackloss=0.05, node_keys=(2, 3)),
}
MODES = ("confirm", "written")


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


@pytest.fixture(scope="module")
def node_ready():
    """None when the real client can run, else why not."""
    return impair.ensure_node_modules()


@pytest.fixture(scope="module")
def table(request):
    """Collects each cell's figures; prints them as one table at the end."""
    rows = []
    yield rows
    if not rows:
        return

    def ms(v):
        return "-" if v is None else f"{v:.1f}"
    lines = ["impaired network, per cell (dup: runs delivered to two controllers or more;"
             " f-recv: false for a received run; t-unrecv: true for an unreceived run;"
             " extra: starts beyond what the answers allow;"
             " rtt: the kernel's, over a handshake):",
             f"{'mode':8} {'cell':9} {'rtt ms':>7} {'true':>5} {'false':>5} {'dup':>4} "
             f"{'f-recv':>6} {'t-unrecv':>8} {'lost':>4} {'err':>4} {'extra':>5} "
             f"{'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'wall s':>6}"]
    for mode, cell, f in rows:
        lines.append(f"{mode:8} {cell:9} {f['rtt_ms']:7.2f} {f['true']:5} {f['false']:5} "
                     f"{f['duplicates']:4} {f['false_received']:6} {f['true_unreceived']:8} "
                     f"{f['lost']:4} {f['errors']:4} {f['excess']:5} {ms(f['p50_ms']):>7} "
                     f"{ms(f['p90_ms']):>7} {ms(f['p99_ms']):>7} {f['wall_s']:6.1f}")
    impair.show(request, "\n".join(lines))


@pytest.mark.parametrize("mode,cell", [(m, c) for c in CELLS for m in MODES],
                         ids=[f"{m}-{c}" for c in CELLS for m in MODES])
def test_delivery_promise_holds(net, node_ready, table, request, mode, cell):
    settings = dict(CELLS[cell])
    if settings.get("node_keys") and node_ready:
        pytest.skip(node_ready)
    f = impair.run_cell(net, mode, dispatches=DISPATCHES, rate=RATE, keys=KEYS,
                        per_key=PER_KEY, work_ms=WORK_MS, tag=f"{mode}_{cell}", **settings)
    table.append((mode, cell, f))
    text = f"{mode} {cell}: " + impair.describe(f)
    impair.show(request, text)
    broken = {k: f[k] for k in ("duplicates", "false_received", "true_unreceived", "lost",
                                "errors", "stray")}
    assert broken == dict.fromkeys(broken, 0), text
    # The cell exercised delivery on the network it names: most runs found a
    # parked poll, every kind of controller in it received some, and the
    # wire delayed and dropped what it was told to.
    assert f["true"] >= DISPATCHES // 2, text
    assert all(gf["true"] > 0 for gf in f["by_group"].values()), text
    w = f["wire"]
    assert f["rtt_ms"] >= settings["rtt_ms"], text
    assert (w["ab_lost"] + w["ba_lost"] > 0) == (settings.get("loss", 0) > 0), text
    assert (w["ab_acklost"] + w["ba_acklost"] > 0) == (settings.get("ackloss", 0) > 0), text


def late_reports(f, after_s):
    """ACK reports that came later than <after_s> after their write: those
    past the first bound of pilotlight_confirm_ack_seconds at or above it."""
    buckets = f["ack_reports"]
    bound = min(float(le) for le in buckets if le != "+Inf" and float(le) >= after_s)
    return buckets.get("+Inf", 0) - next(v for le, v in buckets.items()
                                          if le != "+Inf" and float(le) == bound)


def test_the_real_clients_ack_a_run_at_once(net, node_ready, request):
    """A run goes to Trigger.dev's real client so that its kernel ACKs it at
    once, not at its delayed-ACK timer (40 ms or more). The 40 clients
    share one node process and so one connection pool, as the figures in
    docs/notes/2026-12-05-soliciting-the-ack.md do: a poll now and then
    leaves on a connection that delivered a run a moment before, which puts
    its kernel in ping-pong mode, where a lone segment waits for that
    timer (10-16 % of runs did, unsolicited). Over loopback every answer
    is one segment. Fails when the answers stop being shaped for it: more
    than a few per cent of the ACK reports come later than 25 ms."""
    if node_ready:
        pytest.skip(node_ready)
    n = 150
    f = impair.run_cell(net, "confirm", dispatches=n, rate=15, keys=KEYS, per_key=PER_KEY,
                        node_keys=tuple(range(KEYS)), work_ms=WORK_MS, tag="solicit",
                        loopback=True)
    text = "confirm, the real client on loopback: " + impair.describe(f)
    late = late_reports(f, 0.02)
    impair.show(request, f"{text}\n  ACK reports later than 25 ms: {late} of "
                         f"{f['ack_reports'].get('+Inf', 0)}")
    broken = {k: f[k] for k in ("duplicates", "false_received", "true_unreceived", "lost",
                                "errors", "stray")}
    assert broken == dict.fromkeys(broken, 0), text
    assert f["true"] >= n * 9 // 10 and f["ack_reports"].get("+Inf", 0) >= n // 2, text
    assert late <= n * 3 // 100, f"{late} ACK reports came 25 ms or more after their run\n{text}"


def test_modes_measured_together_keep_apart(net, request):
    """Both modes in one cell (impair.run_cells, as loadtest/ack-latency
    runs them): each pilotlight's runs reach its own fleet only, each
    keeps the promise, and the wire's figures are each pilotlight's own
    (pl-wire's per-port counters), adding up to no more than the whole."""
    n = 60
    fs = impair.run_cells(net, list(MODES), dispatches=n, rate=15, keys=KEYS, per_key=PER_KEY,
                          work_ms=WORK_MS, tag="together", rtt_ms=0.1)
    for mode, f in fs.items():
        text = f"{mode}, together: " + impair.describe(f)
        impair.show(request, text)
        broken = {k: f[k] for k in ("duplicates", "false_received", "true_unreceived", "lost",
                                    "errors", "stray")}
        assert broken == dict.fromkeys(broken, 0), text
        assert f["dispatches"] == n and f["true"] >= n // 2, text
        assert f["together"] == list(MODES), text
    confirm, written = fs["confirm"], fs["written"]
    assert confirm["broker"]["confirm"].get("acked", 0) == confirm["true"], confirm["broker"]
    assert not written["broker"]["confirm"], written["broker"]
    for d in ("ab", "ba"):
        for k in ("bytes", "segs"):
            mine = [fs[m]["wire"][f"{d}_{k}"] for m in MODES]
            assert all(v > 0 for v in mine), (d, k, mine)
            assert sum(mine) <= confirm["wire_all"][f"{d}_{k}"], (d, k, mine, confirm["wire_all"])


class Recorder:
    """A stand-in broker for the fleet's own tests: on 127.0.0.1 in <ns>,
    answers /connect, and each poll after 10 ms with the example run,
    keeping connections open; records each request as (connection number,
    Host, controller id, path)."""

    def __init__(self, ns):
        self.seen, self.conns, self.running = [], [], True
        self.sock = impair.in_ns(ns, lambda: socket.create_server(("127.0.0.1", 0)))
        self.port = self.sock.getsockname()[1]
        self.sock.settimeout(0.2)
        self.run = json.dumps(EXAMPLE).encode()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while self.running:
            try:
                c, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c, len(self.conns)), daemon=True).start()

    def _serve(self, c, n):
        buf = b""
        with c:
            while self.running:
                while b"\r\n\r\n" not in buf:
                    try:
                        data = c.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                fields = dict(ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                fields = {k.strip().lower(): v.strip() for k, v in fields.items()}
                path = lines[0].split()[1]
                self.seen.append((n, fields.get("host"),
                                  fields.get("x-trigger-workload-controller-id"), path))
                if path.startswith("/connect"):
                    body = b'{"connectionTimeoutMs":30000,"keepaliveMs":300000}'
                else:
                    time.sleep(0.01)
                    body = self.run
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    def stop(self):
        self.running = False
        self.thread.join(2)
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def test_own_pools_keep_each_controllers_connections(net, node_ready, request):
    """impair.node_controllers(own_pools=True), as loadtest/ack-latency
    --fleets own runs the real client: the clients share a node process but
    not its connections. Each names the server by a host name of its own,
    so node keeps a pool per client, as a run controller in its own
    container has: every connection carries one controller's requests,
    under that controller's host name, and connections are kept and used
    again."""
    if node_ready:
        pytest.skip(node_ready)
    rec = Recorder(net.ctl)
    ctls = [{"id": f"controller_own{i}", "key": list(impair.key_of(i % 2))} for i in range(6)]
    proc = impair.node_controllers(net.ctl, rec.port, ctls, (50, 150), host="127.0.0.1",
                                   own_pools=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.proc.poll() is None:
            polls = [s for s in rec.seen if s[3].startswith("/warm-start")]
            if all(sum(1 for s in polls if s[2] == c["id"]) >= 4 for c in ctls):
                break
            time.sleep(0.1)
    finally:
        proc.stop()
        rec.stop()
    seen = list(rec.seen)
    impair.show(request, f"own pools: {len(seen)} requests on {len(rec.conns)} connections")
    polls = [s for s in seen if s[3].startswith("/warm-start")]
    assert all(sum(1 for s in polls if s[2] == c["id"]) >= 4 for c in ctls), \
        (seen, "".join(proc.stderr_tail))
    index = {c["id"]: i for i, c in enumerate(ctls)}
    for conn, host, ctl, _ in polls:
        assert host == f"c{index[ctl]}.pl-fleet:{rec.port}", (conn, host, ctl)
    owners = {}
    for conn, host, _, _ in seen:
        owners.setdefault(conn, set()).add(host)
    assert all(len(h) == 1 for h in owners.values()), owners
    per_conn = [sum(1 for s in polls if s[0] == conn) for conn in owners]
    assert max(per_conn) >= 2, per_conn  # kept and used again


def test_fit_rtt_takes_the_wires_own_cost_off_its_delay(net):
    """ImpairedNet.fit_rtt, as loadtest/ack-latency's exact wire uses it:
    the delay asked of the wire is the RTT less what the wire was measured
    to add, and what the kernel then measures is at least that delay
    (nothing crosses faster than the wire is told) and not twice the RTT
    wanted."""
    assert impair.fitted_rtt(1.0, 1.3) == pytest.approx(0.7)
    assert impair.fitted_rtt(0.2, 0.7) == 0.0  # never below no delay at all
    assert impair.fitted_rtt(1.0, 0.9) == 1.0  # never adding what was not lost
    try:
        net.shape(rtt_ms=5)
        asked, measured = net.fit_rtt(5)
    finally:
        net.shape()
    assert 0 < asked <= 5
    assert asked <= measured < 10, (asked, measured)


def test_legs_split_each_run_where_its_time_went(net, tmp_path, request):
    """A cell captured on both TUN devices (run_cells' capture) is split run
    by run into legs (impair.run_legs): every answered run is found on the
    wire, neither crossing is shorter than the wire's delay each way (a run
    matched to the wrong segment would be), and no leg is negative; only
    `confirm` has an answer leg. pl-lateness ran through the dispatches."""
    rtt, n = 6.0, 40
    cap = str(tmp_path / "cell.txt")
    fs = impair.run_cells(net, list(MODES), dispatches=n, rate=20, keys=KEYS, per_key=PER_KEY,
                          work_ms=WORK_MS, tag="legs", rtt_ms=rtt, capture=cap, lateness=True)
    legs, cell_rtt = impair.read_legs(cap)
    assert cell_rtt == rtt
    figs = impair.legs_figures(legs, rtt)
    impair.show(request, f"legs at RTT {rtt:g} ms: {figs}")
    for mode in MODES:
        assert len(legs.get(mode, ())) == fs[mode]["true"] >= n // 2, (mode, fs[mode])
        for r in legs[mode]:
            assert r["out"] >= rtt / 2 and r["back"] >= rtt / 2, r
            assert min(r[k] for k in ("to_wire", "ack")) >= 0, r
            assert (r["answer"] is None) == (mode == "written"), r
            if mode == "confirm":
                assert r["answer"] >= 0 and r["latency"] >= r["out"] + r["back"], r
    assert figs["confirm"]["wire_rtt_ms"][0] >= rtt
    assert figs["confirm"]["at_rtt_ms"][0] <= fs["confirm"]["p50_ms"]
    machine = fs["confirm"]["machine"]
    assert machine["wakeups"] >= 1000, machine  # two seconds of dispatches, a wake-up a ms
    assert machine == fs["written"]["machine"] | {k: machine[k] for k in (
        "runs_met_late", "slow", "slow_met_late")}


def test_lateness_and_legs_arithmetic():
    """The harness's pure parts behind the legs: pl-lateness's lines, which
    runs met a late wake-up, the bound a `confirm` answer is slow beyond,
    and a cell's figures from its legs."""
    text = "0 1000000000 2000000\n1 3000000000 1500000\n# wakeups 5000 late 2 worst_ns 2000000\n"
    f = impair.read_lateness(text)
    assert f == {"wakeups": 5000, "late": 2, "worst_ms": 2.0,
                 "stalls": [(1.0, 1.002), (3.0, 3.0015)]}
    # runs in flight [start, end): one overlaps the first stall, one the
    # second, one neither; a run ending as a stall begins did not meet it
    assert impair.met_stalls([(0.999, 1.0005), (2.9, 3.1), (1.5, 1.6), (0.9, 1.0)],
                             f["stalls"]) == 2
    assert impair.slow_bound_ms(1.0, 0.8) == pytest.approx(2.8)
    assert impair.slow_bound_ms(0.2, None) is None
    assert impair.slow_bound_ms(20.0, 0.8) == 25.0

    def run(latency, to_wire, out, ack, back, answer):
        return {"latency": latency, "to_wire": to_wire, "out": out, "ack": ack, "back": back,
                "answer": answer}
    legs = {"confirm": [run(2.0, 0.2, 0.6, 0.0, 0.6, 0.6)] * 8
            + [run(6.0, 0.2, 4.6, 0.0, 0.6, 0.6), run(9.0, 0.2, 0.6, 0.0, 0.6, 7.6)],
            "written": [run(0.5, 0.2, 0.6, 0.0, 0.6, None)] * 10}
    figs = impair.legs_figures(legs, 1.0)
    c = figs["confirm"]
    assert c["wire_rtt_ms"] == pytest.approx([1.2, 1.2, 5.2])
    assert c["at_rtt_ms"] == pytest.approx([1.8, 1.8, 8.8])  # the crossings as 1 ms
    assert c["slow"] == 2  # beyond 0.5 + 2 ms
    assert c["slow_beyond_ms"] == pytest.approx({"to_wire": 0, "out": 4.0, "ack": 0,
                                                 "back": 0, "answer": 7.0})
    assert "at_rtt_ms" not in figs["written"] and "answer" not in figs["written"]["legs_p50_ms"]


def test_pl_lateness_reports_its_wakeups(tmp_path):
    """pl-lateness wakes on every CPU, prints a line per wake-up past its
    threshold (1 µs here: nearly all of them; a timer never fires early)
    and its summary on SIGTERM."""
    wire = impair.wire_binary(BIN)
    probe = wire and impair.lateness_binary(wire)
    if probe is None:
        pytest.fail("tests/pl-lateness is not built (ninja -C build)")
    p = impair.Lateness(probe, period_us=1000, threshold_us=1)
    time.sleep(0.3)
    f = p.stop()
    assert p.proc.returncode == 0
    assert f["wakeups"] >= 100 * len(os.sched_getaffinity(0)), f["wakeups"]
    assert f["late"] == len(f["stalls"]) >= f["wakeups"] * 9 // 10, (f["late"], f["wakeups"])
    assert all(0 < b - a <= f["worst_ms"] / 1000 + 1e-9 for a, b in f["stalls"])
