#!/usr/bin/env python3
"""bench_report.py -- turns loadtest/bench's JSON lines into the whole of
docs/benchmarks.md: the run (command, commit, machine, versions), the
targets with their verdicts, per scenario a table of medians with min-max
over the runs and each system's ratio to pilotlight, and the method with
the commands as they were run.

    bench_report.py RESULTS.jsonl [--meta META.json] [--commands COMMANDS.jsonl]

RESULTS: pl-loadgen's JSON lines with the bench's system and setting, and
those of bench_modes.py, bench_impaired.py, loadtest/callgrind --json,
loadtest/syscalls --json and loadtest/ack-latency --json.
META: what the bench knew of the run (command, wall time, commit, machine,
versions, settings). COMMANDS: one line per command the bench ran, with
placeholders for ports and pids."""

import argparse
import json
import math
import statistics
from collections import defaultdict

SYSTEMS = ["machine", "pilotlight", "pilotlight-written", "pilotlight-confirm", "floor",
           "bun-compiled", "bun", "node", "nchan", "nginx-204"]
MODES = ("written", "confirm")
CONFIRM_OVER_WRITTEN = 1.10   # confirm's CPU (and instructions) per cycle, at most
SYSCALLS_SHOWN = 0.01         # system calls per cycle under which a call gets no row
DELACK_MIN_MS, DELACK_MAX_MS = 40.0, 200.0  # Linux's delayed-ACK timer bounds
# The real client's cells (ack): up to ACK_NEAR_MS of RTT, a confirmation
# costs little beside the machine's own noise, so `confirm` is judged against
# `written` in the same cell (p90 at most ACK_P90_OVER_MS more, p99 at most
# ACK_P99_OVER_MS more); further away the round trip is the cost, and p90
# may exceed the cell's measured RTT by ACK_P90_OVER_RTT_MS. A delayed ACK
# (40 ms or more) misses every one of them.
ACK_NEAR_MS = 5.0
ACK_P90_OVER_MS, ACK_P99_OVER_MS, ACK_P90_OVER_RTT_MS = 2.0, 5.0, 5.0
ACK_METHODS = ("ack_event", "next_request", "next_turn", "poll_fallback", "late_check")
PROMISE = ("duplicates", "false_received", "true_unreceived", "lost")


def get(rec, path):
    v = rec
    for p in path.split("."):
        if not isinstance(v, dict) or p not in v:
            return None
        v = v[p]
    return v


class Runs:
    def __init__(self, recs):
        self.recs = recs

    def values(self, path):
        return [v for v in (get(r, path) for r in self.recs) if isinstance(v, (int, float))]

    def median(self, path):
        v = self.values(path)
        return statistics.median(v) if v else None

    def spread(self, path):
        v = self.values(path)
        return (min(v), max(v)) if v else None

    def total(self, path):
        return sum(self.values(path))


def fmt(x, digits=None):
    if x is None:
        return "–"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2
    return f"{x:,.{digits}f}"


def cell(runs, path, digits=None):
    m = runs.median(path)
    if m is None:
        return "–"
    lo, hi = runs.spread(path)
    if len(runs.values(path)) == 1 or lo == hi:
        return fmt(m, digits)
    return f"{fmt(m, digits)} ({fmt(lo, digits)}–{fmt(hi, digits)})"


def ratio(runs, base, path):
    a, b = runs.median(path), base.median(path) if base else None
    if a is None or b is None or b == 0:
        return "–"
    return f"{a / b:.2f}×"


def verdict(ok):
    return "met" if ok else "**missed**"


def row(cells):
    return "| " + " | ".join(cells) + " |"


def head(cells):
    return [row(cells), "|" + "---|" * len(cells)]


# (scenario, setting prefix, title, setting column or None, [(label, path, digits)],
#  headline path for the "× pilotlight" column or None)
TABLES = {
    "jitter": ("jitter", "cpu", "A pinned loop that only reads the clock, 3 s per CPU", "CPU",
               [("gaps >100 µs /s", "gaps_100us_per_s", 1), ("gaps >1 ms /s", "gaps_1ms_per_s", 1),
                ("gaps >5 ms /s", "gaps_5ms_per_s", 1), ("longest gap µs", "max_gap_us", 0),
                ("time lost in gaps >100 µs %", "lost_pct", 2)], None),
    "ceiling": ("ceiling", "wrk", "nginx `return 204` under wrk (-t1 -c50): the HTTP ceiling", None,
                [("requests/s", "req_per_s", 0), ("server CPU µs/request", "server_cpu_us_per_req", 2)],
                None),
    "closed": ("cycle", "closed", "Closed loop: each dispatcher sends again once answered", None,
               [("dispatch/s", "dispatch_per_s", 0), ("hit ratio", "hit_ratio", 3),
                ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1),
                ("server CPU %", "server_cpu_pct", 0), ("delivery p99 µs", "delivery_us.p99", 0),
                ("generator CPU %", "generator_cpu_pct", 0)], "server_cpu_us_per_cycle"),
    "rate": ("cycle", "rate", "At a fixed offered rate", "offered/s",
             [("delivered/s", "delivered_per_s", 0), ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1),
              ("delivery p50 µs", "delivery_us.p50", 0), ("delivery p99 µs", "delivery_us.p99", 0),
              ("delivery p99.9 µs", "delivery_us.p999", 0), ("delivery max µs", "delivery_us.max", 0),
              ("dispatch p99 µs", "dispatch_us.p99", 0)], "delivery_us.p99"),
    "idle": ("idle", "parked", "Parked polls held open", "parked",
             [("bytes/parked poll", "bytes_per_parked", 0), ("RSS before KiB", "rss_before_kb", 0),
              ("RSS with KiB", "rss_with_kb", 0), ("RSS 2 s after close KiB", "rss_after_kb", 0),
              ("probe after close", "probe_status", 0)], "bytes_per_parked"),
    "churn": ("churn", "cycles", "Connect, park, abort", "cycles",
              [("cycles/s", "cycles_per_s", 0), ("RSS warmed KiB", "rss_base_kb", 0),
               ("RSS peak KiB", "rss_peak_kb", 0), ("RSS end KiB", "rss_end_kb", 0),
               ("end − warmed KiB", "rss_growth_kb", 0), ("end − warmed %", "rss_growth_pct", 2),
               ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1), ("ledger ok", "ledger_ok", 0)],
              None),
    "scale99": ("scale", "scale", "Dispatch latency p99 (µs) at a fixed rate", None,
                [("1 k parked", "parked_small.dispatch_us.p99", 0),
                 ("large parked", "parked_large.dispatch_us.p99", 0),
                 ("1 key", "keys_one.dispatch_us.p99", 0),
                 ("1 key per poll", "keys_many.dispatch_us.p99", 0),
                 ("ratio parked", "p99_ratio_parked", 2), ("ratio keys", "p99_ratio_keys", 2)], None),
    "scale50": ("scale", "scale", "The same runs, p50 and p90 (µs)", None,
                [("1 k parked p50", "parked_small.dispatch_us.p50", 0),
                 ("large parked p50", "parked_large.dispatch_us.p50", 0),
                 ("1 key p50", "keys_one.dispatch_us.p50", 0),
                 ("1 key per poll p50", "keys_many.dispatch_us.p50", 0),
                 ("1 k parked p90", "parked_small.dispatch_us.p90", 0),
                 ("large parked p90", "parked_large.dispatch_us.p90", 0),
                 ("1 key p90", "keys_one.dispatch_us.p90", 0),
                 ("1 key per poll p90", "keys_many.dispatch_us.p90", 0)], None),
}


COUNTS = ("secs", "dispatches", "hits", "misses", "delivered", "lost", "reconnects")


def merge_slices(recs):
    """A sliced run (bench --interleave) comes as one line per slice with its
    run number: adds each run's slices up into one line. CPU per cycle is
    total CPU over total deliveries; rates are totals over total seconds;
    latency percentiles, which cannot be added, are the median of the
    slices'."""
    runs, out = defaultdict(list), []
    for r in recs:
        if "run" in r:
            runs[(r.get("scenario"), r.get("setting"), r.get("system"), r["run"])].append(r)
        else:
            out.append(r)
    for sl in runs.values():
        m = dict(sl[0], slices=len(sl))
        for k in COUNTS:
            m[k] = sum(x.get(k, 0) for x in sl)
        m["errors"] = {k: sum(x["errors"].get(k, 0) for x in sl) for k in sl[0].get("errors", {})}
        secs, n = m["secs"], m["delivered"]
        m["dispatch_per_s"] = m["dispatches"] / secs if secs else 0
        m["delivered_per_s"] = n / secs if secs else 0
        m["hit_ratio"] = m["hits"] / m["dispatches"] if m["dispatches"] else 0
        for k in ("server_cpu_pct", "generator_cpu_pct"):
            m[k] = sum(x[k] * x["secs"] for x in sl) / secs if secs else -1
        m["server_cpu_us_per_cycle"] = (sum(x["server_cpu_us_per_cycle"] * x["delivered"]
                                            for x in sl) / n if n else -1)
        m["server_rss_kb"] = max(x.get("server_rss_kb", -1) for x in sl)
        for lat in ("dispatch_us", "delivery_us"):
            if lat in m:
                m[lat] = {k: statistics.median(x[lat][k] for x in sl) for k in sl[0][lat]}
        out.append(m)
    return out


def group(recs):
    g = defaultdict(list)
    for r in recs:
        g[(r.get("scenario"), r.get("setting"), r.get("system"))].append(r)
    return g


def settings_of(g, scenario, prefix):
    return sorted({s for (sc, s, _) in g if sc == scenario and s and s.startswith(prefix)},
                  key=lambda s: (len(s), s))


def setting_value(setting, prefix):
    v = setting[len(prefix):]
    return f"{int(v):,}" if v.isdigit() else v


def table(g, key, out):
    """One table of TABLES: a row per system (and per setting, where the
    table has a setting column; otherwise one table per setting)."""
    scenario, prefix, title, setcol, cols, headline = TABLES[key]
    settings = settings_of(g, scenario, prefix)
    groups = [settings] if setcol else [[s] for s in settings]
    for sts in groups:
        rows = [(s, st) for st in sts for s in SYSTEMS if (scenario, st, s) in g]
        if not rows:
            continue
        if len({s for s, _ in rows}) == len(rows):  # a setting per system: system order
            rows.sort(key=lambda r: SYSTEMS.index(r[0]))
        out.append(f"**{title}**\n")
        cells = ["system", "runs"] + ([setcol] if setcol else []) + [c[0] for c in cols]
        if headline:
            cells.append("× pilotlight (" + next(c[0] for c in cols if c[1] == headline) + ")")
        out.extend(head(cells))
        for s, st in rows:
            runs = Runs(g[(scenario, st, s)])
            line = [s, str(len(runs.recs))] + ([setting_value(st, prefix)] if setcol else [])
            line += [cell(runs, c[1], c[2]) for c in cols]
            if headline:
                base = g.get((scenario, st, "pilotlight"))
                line.append(ratio(runs, Runs(base), headline) if base else "–")
            out.append(row(line))
        out.append("")


# ---- confirm against written --------------------------------------------------

def mode_runs(g, scenario, setting, mode, default_delivery):
    """The runs of pilotlight in <mode>: pilotlight-<mode>, else plain
    pilotlight when that is its default delivery."""
    r = g.get((scenario, setting, f"pilotlight-{mode}"))
    if not r and default_delivery == mode:
        r = g.get((scenario, setting, "pilotlight"))
    return Runs(r) if r else None


def modes_compared(g, default_delivery):
    """[(what, written Runs, confirm Runs, path, unit)] for every measure of
    the two modes side by side: CPU per cycle in each cycle setting, and
    user-space instructions per cycle."""
    rows = []
    for st in settings_of(g, "cycle", "closed") + settings_of(g, "cycle", "rate"):
        w, c = (mode_runs(g, "cycle", st, m, default_delivery) for m in MODES)
        if w and c:
            what = ("server CPU per cycle, closed loop" if st == "closed" else
                    f"server CPU per cycle, {setting_value(st, 'rate')} cycles/s offered")
            rows.append((what, w, c, "server_cpu_us_per_cycle", "µs"))
    for st in settings_of(g, "instructions", "rate"):
        w, c = (mode_runs(g, "instructions", st, m, None) for m in MODES)
        if w and c:
            rows.append((f"user-space instructions per cycle, {setting_value(st, 'rate')} cycles/s "
                         "(callgrind)", w, c, "instructions_per_cycle", "k"))
    return rows


def modes_cell(runs, path, unit):
    if unit == "k":
        v = [x / 1000 for x in runs.values(path)]
        return cell(Runs([{"v": x} for x in v]), "v", 1) + " k"
    return cell(runs, path, 1) + " µs"


def modes_compared_table(g, default_delivery, out):
    rows = modes_compared(g, default_delivery)
    if not rows:
        return
    out.append("**Per match cycle, each mode alone**\n")
    out.extend(head(["measure", "runs", "`written`", "`confirm`", "confirm ÷ written"]))
    for what, w, c, path, unit in rows:
        out.append(row([what, f"{len(w.recs)} + {len(c.recs)}", modes_cell(w, path, unit),
                        modes_cell(c, path, unit), f"{c.median(path) / w.median(path):.3f}"]))
    out.append("")


def modes_rounds(g):
    """The modes scenario (bench_modes.py): per setting and round, its
    slices, in order."""
    out = {}
    for st in settings_of(g, "modes", ""):
        recs = [r for r in g[("modes", st, "pilotlight")] if "ratio" in r]
        for rd in sorted({r["round"] for r in recs}):
            out[(st, rd)] = sorted((r for r in recs if r["round"] == rd),
                                   key=lambda r: r["slice"])
    return out


def modes_ratio(slices):
    """A round's confirm ÷ written, its standard error (relative), and what
    the second server costs over the first. Two neighbouring slices have
    the roles swapped, so the geometric mean of their ratios holds confirm's
    cost without the servers' own difference; the error comes from how
    such pairs spread. (None, None, None) with fewer than two pairs."""
    pairs = [(slices[i], slices[i + 1]) for i in range(0, len(slices) - 1, 2)
             if slices[i]["first"] != slices[i + 1]["first"]]
    if len(pairs) < 2:
        return None, None, None
    logs = [(math.log(x["ratio"]) + math.log(y["ratio"])) / 2 for x, y in pairs]
    by_first = {m: [math.log(r["ratio"]) for p in pairs for r in p if r["first"] == m]
                for m in MODES}
    # First server written: the ratio is confirm's cost times second ÷ first.
    servers = math.exp((statistics.mean(by_first["written"]) -
                        statistics.mean(by_first["confirm"])) / 2)
    return (math.exp(statistics.mean(logs)),
            statistics.stdev(logs) / math.sqrt(len(logs)), servers)


def modes_table(g, out):
    rounds = modes_rounds(g)
    if not rounds:
        return
    out.append("**In the same seconds (`modes`): two servers on CPU 0 in opposite delivery "
               "modes, swapped by SIGHUP slice by slice (A B B A …)**\n")
    out.extend(head(["setting", "round", "slices", "written µs/cycle", "confirm µs/cycle",
                     "confirm ÷ written", "± (1 s.e.)", "second server ÷ first",
                     "acked in written / confirm", "host steal % (median, max)"]))
    for (st, rd), sl in rounds.items():
        line = [st, str(rd), str(len(sl))]
        line += [cell(Runs(sl), f"{m}_us_per_cycle", 1) for m in MODES]
        x, se, servers = modes_ratio(sl)
        line += ["–"] * 3 if x is None else [f"{x:.3f}", f"{100 * se:.1f} %", f"{servers:.3f}"]
        line.append(" / ".join(f"{sum(r[m + '_acked'] for r in sl):,}" for m in MODES))
        steal = [r["steal_pct"] for r in sl]
        line.append(f"{statistics.median(steal):.1f}, {max(steal):.1f}")
        out.append(row(line))
    out.append("")


# ---- system calls -----------------------------------------------------------------

def syscalls_settings(g):
    return settings_of(g, "syscalls", "rate") + settings_of(g, "syscalls", "closed")


def syscalls_what(st):
    return "closed loop" if st == "closed" else f"{setting_value(st, 'rate')} cycles/s offered"


def syscalls_rounds(g, setting, mode, names=()):
    """loadtest/syscalls's rounds of <mode> in <setting> as Runs, one record
    per round (calls_per_cycle; but_wait, the same without epoll_wait;
    by_call.<call> for every call of <names> and of the rounds), or None.
    A call a round did not make is 0 there; one its setup window made more
    often than the measured one (a fraction of a call per thousand cycles:
    the subtraction's noise) is 0 too."""
    recs = g.get(("syscalls", setting, f"pilotlight-{mode}"))
    if not recs:
        return None
    rounds = [r for rec in recs for r in rec.get("per_round", [rec])]
    names = set(names) | {k for r in rounds for k in r["by_call"]}
    return Runs([dict(r, by_call={k: max(r["by_call"].get(k, 0.0), 0.0) for k in names},
                      but_wait=r["calls_per_cycle"] - r["by_call"].get("epoll_wait", 0.0))
                 for r in rounds])


def syscalls_compared(g):
    """[(setting, written Runs, confirm Runs)] where both modes were counted,
    each with the calls of both."""
    out = []
    for st in syscalls_settings(g):
        recs = [r for m in MODES for r in g.get(("syscalls", st, f"pilotlight-{m}"), [])]
        names = {k for rec in recs for r in rec.get("per_round", [rec]) for k in r["by_call"]}
        w, c = (syscalls_rounds(g, st, m, names) for m in MODES)
        if w and c:
            out.append((st, w, c))
    return out


def syscalls_table(g, out):
    rows = syscalls_compared(g)
    if not rows:
        return
    out.append("**System calls per match cycle, each mode alone (`strace -c -f` over a fixed "
               "number of cycles, the connections' own calls taken off), by call**\n")
    out.extend(head(["setting", "call", "rounds", "`written`", "`confirm`", "confirm ÷ written"]))
    for st, w, c in rows:
        tw, tc = w.median("calls_per_cycle"), c.median("calls_per_cycle")
        out.append(row([syscalls_what(st), "all", f"{len(w.recs)} + {len(c.recs)}",
                        cell(w, "calls_per_cycle", 2), cell(c, "calls_per_cycle", 2),
                        f"{tc / tw:.3f}"]))
        # The wake-ups follow the machine's timing; the rest follow the cycles.
        bw, bc = w.median("but_wait"), c.median("but_wait")
        out.append(row(["", "all but `epoll_wait`", "", cell(w, "but_wait", 2),
                        cell(c, "but_wait", 2), f"{bc / bw:.3f}"]))
        med = {k: (w.median(f"by_call.{k}"), c.median(f"by_call.{k}"))
               for k in w.recs[0]["by_call"]}
        # Ties by name: the calls come from a set, whose order changes run to run.
        for k, (mw, mc) in sorted(med.items(), key=lambda kv: (-sum(kv[1]), kv[0])):
            if max(mw, mc) < SYSCALLS_SHOWN:
                continue
            out.append(row(["", f"`{k}`", "", cell(w, f"by_call.{k}", 2),
                            cell(c, f"by_call.{k}", 2),
                            f"{mc / mw:.2f}" if mw >= SYSCALLS_SHOWN else "–"]))
    out.append("")


# ---- impaired network ------------------------------------------------------------

def delack_allowance_ms(rtt_ms):
    """How long a Linux peer may hold a delayed ACK on a path of <rtt_ms>:
    its delayed-ACK timer runs at least 40 ms and at most 200 ms, and is cut
    to the path's smoothed RTT when that is longer than 40 ms."""
    return min(DELACK_MAX_MS, max(DELACK_MIN_MS, rtt_ms))


def impaired_cells(g):
    """[(nominal RTT, mode, Runs)] in RTT order."""
    cells = []
    for (sc, st, sys), recs in g.items():
        if sc == "impaired" and sys.startswith("pilotlight-"):
            cells.append((recs[0]["rtt_nominal_ms"], sys[len("pilotlight-"):], Runs(recs)))
    return sorted(cells, key=lambda c: (c[0], MODES.index(c[1]) if c[1] in MODES else 9))


def skipped(g, scenario):
    recs = g.get(("skipped", scenario, None))
    return recs[0]["why"] if recs else None


def impaired_table(g, out):
    cells = impaired_cells(g)
    why = skipped(g, "impaired")
    if why:
        out.append(f"Not run on this machine: {why}.\n")
    if not cells:
        return
    out.extend(head(["RTT ms (measured)", "mode", "rounds", "true / false", "p50 ms", "p90 ms",
                     "p99 ms", "RTT + delayed ACK ms", "runs received twice",
                     "`false`, received", "`true`, not received", "lost"]))
    for rtt, mode, runs in cells:
        measured = runs.median("rtt_ms")
        out.append(row([
            f"{rtt:g} ({measured:.1f})", f"`{mode}`", str(len(runs.recs)),
            f"{runs.total('true'):,.0f} / {runs.total('false'):,.0f}",
            cell(runs, "p50_ms", 1), cell(runs, "p90_ms", 1), cell(runs, "p99_ms", 1),
            f"{measured + delack_allowance_ms(measured):.0f}" if mode == "confirm" else "–",
            *(f"{runs.total(k):.0f}" for k in ("duplicates", "false_received", "true_unreceived",
                                               "lost"))]))
    out.append("")


# ---- the real client (ack) -------------------------------------------------------------

# ack-latency's fleets, in the table's order, as the table names them
ACK_FLEETS = {"shared": "one pool", "own": "a pool each", "process": "a process each"}


def ack_cells(g):
    """loadtest/ack-latency's cells: [(bin, fleet, mtu, rtt, {mode: Runs})],
    by server, fleet, MTU (loopback last) and RTT (loopback's "lo" last)."""
    by = defaultdict(lambda: defaultdict(list))
    for (sc, _, _), recs in g.items():
        if sc != "ack":
            continue
        for r in recs:
            key = (r.get("bin", "pilotlight"), r.get("fleet", "shared"), r["mtu"], r["rtt"])
            by[key][r["mode"]].append(r)
    bins = list(dict.fromkeys(k[0] for k in by))
    fleets = list(ACK_FLEETS)

    def order(k):
        b, fleet, mtu, rtt = k
        return (bins.index(b), fleets.index(fleet) if fleet in fleets else len(fleets),
                rtt == "lo", mtu, math.inf if rtt == "lo" else float(rtt))
    return [(*k, {m: Runs(v) for m, v in by[k].items()}) for k in sorted(by, key=order)]


def ack_fleet(fleet):
    return ACK_FLEETS.get(fleet, fleet)


def ack_rtt(rtt, runs):
    """A cell's RTT as set on the wire and as the kernel measured it."""
    measured = runs.median("rtt_ms")
    digits = 2 if measured >= 0.1 else 3  # loopback's is a few µs
    return f"{'loopback' if rtt == 'lo' else rtt} ({measured:.{digits}f})"


def ack_latency(runs):
    if runs is None:
        return "–"
    return " / ".join(cell(runs, f"{p}_ms", 1) for p in ("p50", "p90", "p99", "max"))


def ack_methods(runs):
    """How `confirm` learnt its ACKs: pilotlight_confirm_method_total's
    methods that counted any, summed over the runs."""
    got = [(m, runs.total(f"method.{m}")) for m in ACK_METHODS]
    return ", ".join(f"{m} {n:,.0f}" for m, n in got if n) or "none"


def ack_lead(cells):
    """The columns that tell <cells> apart before MTU and RTT: the server
    where several ran, the fleet where several did. Returns (headers, a
    function of a cell's server and fleet giving its values)."""
    several = len({c[0] for c in cells}) > 1
    fleets = len({c[1] for c in cells}) > 1
    return ((["server"] if several else []) + (["fleet"] if fleets else []),
            lambda b, fleet: ([b] if several else []) + ([ack_fleet(fleet)] if fleets else []))


def ack_table(g, out):
    cells = ack_cells(g)
    why = skipped(g, "ack")
    if why:
        out.append(f"Not run on this machine: {why}.\n")
    if not cells:
        return
    heads, lead = ack_lead(cells)
    out.extend(head(heads + [
        "MTU", "RTT ms (measured)", "`confirm` p50 / p90 / p99 / max ms",
        "`written` p50 / p90 / p99 / max ms", "bytes per dispatch (`confirm`)",
        "data segments per dispatch (`confirm`)", "late ACK reports (`confirm`)",
        "`confirm` learnt its ACKs by", "twice / `false` received / `true` unreceived / lost"]))
    for b, fleet, mtu, rtt, modes in cells:
        c, w = modes.get("confirm"), modes.get("written")
        any_runs = c or w
        line = lead(b, fleet) + [
            "65,536" if rtt == "lo" else f"{mtu:,}", ack_rtt(rtt, any_runs),
            ack_latency(c), ack_latency(w),
            cell(c, "bytes_per_run", 0) if c else "–",
            cell(c, "segs_per_run", 2) if c else "–",
            f"{c.total('late_reports'):,.0f} of {c.total('dispatches'):,.0f}" if c else "–",
            ack_methods(c) if c else "–",
            " / ".join(f"{sum(r.total(k) for r in modes.values()):,.0f}" for k in PROMISE)]
        out.append(row(line))
    out.append("")


def ack_legs_cells(g):
    """ack_cells() whose `confirm` runs were captured on both TUN devices
    (ack-latency's legs)."""
    return [c for c in ack_cells(g) if c[4].get("confirm") and
            c[4]["confirm"].values("at_rtt_ms.p90")]


def ack_legs_table(g, out):
    """Where `confirm`'s time went, per wire cell with legs."""
    cells = ack_legs_cells(g)
    if not cells:
        return
    heads, lead = ack_lead(cells)
    out.extend(head(heads + [
        "MTU", "RTT ms (measured)", "crossings p50 / p90 / p99 ms",
        "`confirm` p50 / p90 / p99 ms", "`confirm`, crossings at the RTT, p50 / p90 / p99 ms",
        "`confirm` runs beyond the bound", "their time beyond the medians: to the "
        "wire / out / ACK / back / answer, ms", "of them / of all runs, in flight during a "
        "late wake-up", "late wake-ups; the latest, ms"]))
    for b, fleet, mtu, rtt, modes in cells:
        c = modes["confirm"]
        line = lead(b, fleet) + [
            f"{mtu:,}", ack_rtt(rtt, c),
            " / ".join(cell(c, f"crossings_ms.{p}", 1) for p in ("p50", "p90", "p99")),
            " / ".join(cell(c, f"{p}_ms", 1) for p in ("p50", "p90", "p99")),
            " / ".join(cell(c, f"at_rtt_ms.{p}", 1) for p in ("p50", "p90", "p99")),
            cell(c, "legs_slow", 0),
            " / ".join(cell(c, f"slow_beyond_ms.{k}", 0)
                       for k in ("to_wire", "out", "ack", "back", "answer")),
            f"{c.total('slow_met_late'):,.0f} of {c.total('slow'):,.0f} / "
            f"{c.total('runs_met_late'):,.0f} of {c.total('dispatches'):,.0f}",
            f"{cell(c, 'machine_late', 0)}; {cell(c, 'machine_worst_ms', 0)}"]
        out.append(row(line))
    out.append("")


def at_rtt(runs, p):
    """A real-client target's second figure: `confirm`'s <p> with the wire's
    crossings taken as the cell's RTT (ack-latency's legs), where measured;
    the verdict stays with the first."""
    z = runs.median(f"at_rtt_ms.{p}")
    return "" if z is None else f" (the wire's crossings taken as the RTT: {z:.1f} ms)"


def ack_targets(g):
    """The real client's targets: per cell, `confirm`'s tail against
    `written`'s (near) or against the round trip (far); and the promise
    over every cell of both modes."""
    rows, cells = [], ack_cells(g)
    _, lead = ack_lead(cells)
    for b, fleet, mtu, rtt, modes in cells:
        c, w = modes.get("confirm"), modes.get("written")
        if rtt == "lo" or c is None:
            continue
        where = "".join(f"{v}, " for v in lead(b, fleet)) + f"MTU {mtu:,}, RTT {rtt} ms"
        nominal = float(rtt)
        if nominal <= ACK_NEAR_MS:
            if w is None:
                continue
            for p, over in (("p90", ACK_P90_OVER_MS), ("p99", ACK_P99_OVER_MS)):
                x, y = c.median(f"{p}_ms"), w.median(f"{p}_ms")
                what = (f"Trigger.dev's client: `confirm` {p} ≤ `written` {p} + {over:g} ms, "
                        f"{where}")
                if x is None or y is None:
                    rows.append((what, "no answers", verdict(False)))
                    continue
                rows.append((what, f"{x:.1f} ms vs {y:.1f} + {over:g} = {y + over:.1f} ms"
                             + at_rtt(c, p), verdict(x <= y + over)))
        else:
            x, measured = c.median("p90_ms"), c.median("rtt_ms")
            what = (f"Trigger.dev's client: `confirm` p90 ≤ the measured RTT + "
                    f"{ACK_P90_OVER_RTT_MS:g} ms, {where}")
            if x is None:
                rows.append((what, "no answers", verdict(False)))
                continue
            bound = measured + ACK_P90_OVER_RTT_MS
            rows.append((what, f"{x:.1f} ms vs {measured:.1f} + {ACK_P90_OVER_RTT_MS:g} = "
                         f"{bound:.1f} ms" + at_rtt(c, "p90"), verdict(x <= bound)))
    if cells:
        runs = [r for *_, modes in cells for r in modes.values()]
        bad = sum(r.total(k) for r in runs for k in PROMISE)
        n = sum(r.total("dispatches") for r in runs)
        rows.append(("Trigger.dev's client, every MTU and RTT and loopback, both modes: no run "
                     "received twice, no `false` for a received run, no `true` for a run nobody "
                     "received, none lost",
                     f"{bad:.0f} such runs of {n:,.0f} ({len(runs)} cells)", verdict(bad == 0)))
    elif skipped(g, "ack"):
        rows.append(("Trigger.dev's client: `confirm` p90 and p99 against `written` and the RTT",
                     "not measured (see *Dispatch latency with Trigger.dev's client*)", "–"))
    return rows


# ---- targets ---------------------------------------------------------------------------

def targets(g, meta):
    """[(target, measured, verdict)]: every target the measured scenarios
    can judge."""
    rows = []
    default_delivery = meta.get("default_delivery")

    def cpu(sys, st):
        r = g.get(("cycle", st, sys))
        return Runs(r).median("server_cpu_us_per_cycle") if r else None

    def at(st):
        return "closed loop" if st == "closed" else f"{setting_value(st, 'rate')} cycles/s offered"

    cycle_settings = settings_of(g, "cycle", "closed") + settings_of(g, "cycle", "rate")
    pl, bun = cpu("pilotlight", "closed"), cpu("bun-compiled", "closed")
    if pl and bun:
        rows.append(("CPU per match cycle ≤ ⅕ of compiled Bun's, closed loop",
                     f"{pl:.1f} µs vs {bun:.1f} µs = 1/{bun / pl:.1f}", verdict(pl * 5 <= bun)))
    ngx = g.get(("ceiling", "wrk", "nginx-204"))
    n = Runs(ngx).median("server_cpu_us_per_req") if ngx else None
    if pl and n:
        rows.append(("CPU per match cycle ≤ two nginx `return 204` requests, closed loop",
                     f"{pl:.1f} µs vs 2 × {n:.2f} µs = {pl / n:.2f} requests", verdict(pl <= 2 * n)))
    for st in cycle_settings:
        fl, bun = cpu("floor", st), cpu("bun-compiled", st)
        for name in ("pilotlight", "pilotlight-written", "pilotlight-confirm"):
            p = cpu(name, st)
            if p and fl:
                rows.append((f"{name}: CPU per match cycle ≤ 1.15 × pl-floor's, {at(st)}",
                             f"{p:.1f} µs vs {fl:.1f} µs = {p / fl:.2f}×", verdict(p <= 1.15 * fl)))
            if p and bun:
                rows.append((f"{name}: CPU per match cycle ≤ ½ of compiled Bun's, {at(st)}",
                             f"{p:.1f} µs vs {bun:.1f} µs = {p / bun:.2f}×", verdict(2 * p <= bun)))
    for st in settings_of(g, "cycle", "rate"):
        r = g.get(("cycle", st, "pilotlight"))
        if r:
            r = Runs(r)
            p99, mx = r.median("delivery_us.p99"), r.median("delivery_us.max")
            rows.append((f"delivery p99 ≤ 0.5 ms, {at(st)}",
                         f"{p99 / 1000:.3f} ms (delivered {r.median('delivered_per_s'):,.0f}/s)",
                         verdict(p99 <= 500)))
            rows.append((f"delivery max ≤ 3 ms, {at(st)}", f"{mx / 1000:.3f} ms",
                         verdict(mx <= 3000)))
    for st in settings_of(g, "idle", "parked"):
        r = g.get(("idle", st, "pilotlight"))
        if r:
            b = Runs(r).median("bytes_per_parked")
            rows.append((f"RSS per parked poll ≤ 1 KiB, {setting_value(st, 'parked')} parked",
                         f"{b:,.0f} bytes", verdict(b <= 1024)))
    for st in settings_of(g, "churn", "cycles"):
        r = g.get(("churn", st, "pilotlight"))
        if not r:
            continue
        ch, cycles = Runs(r), setting_value(st, "cycles")
        worst = max(abs(v) for v in ch.values("rss_growth_pct"))
        peaks = ch.values("rss_peak_kb")
        spread = (max(peaks) - min(peaks)) * 100.0 / min(peaks)
        rows.append((f"churn of {cycles} cycles: RSS at the end within 1 % of the warmed baseline",
                     f"worst run {worst:.2f} %", verdict(worst <= 1.0)))
        rows.append((f"churn of {cycles} cycles: peak RSS within 1 % across runs",
                     f"{min(peaks):,.0f}–{max(peaks):,.0f} KiB = {spread:.2f} %",
                     verdict(spread <= 1.0)))
        ok = ch.values("ledger_ok")
        rows.append((f"churn of {cycles} cycles: every parked poll settled exactly once (ledger)",
                     f"{sum(1 for v in ok if v == 1)} of {len(ok)} runs balanced",
                     verdict(bool(ok) and all(v == 1 for v in ok))))
    r = g.get(("scale", "scale", "pilotlight"))
    if r:
        st = meta.get("settings", {})
        small, large = (f"{int(st[k]):,}" if str(st.get(k, "")).isdigit() else "?"
                        for k in ("SCALE_SMALL", "SCALE_LARGE"))
        for name, path in ((f"{small} against {large} polls parked", "p99_ratio_parked"),
                           ("1 key against 1 key per poll, half the dispatches missing",
                            "p99_ratio_keys")):
            v = Runs(r).median(path)
            rows.append((f"dispatch p99 within ±10 %: {name}", f"ratio {v:.2f}",
                         verdict(0.9 <= v <= 1.1)))
    for what, w, c, path, _ in modes_compared(g, default_delivery):
        x = c.median(path) / w.median(path)
        rows.append((f"`confirm` ≤ {CONFIRM_OVER_WRITTEN:.2f} × `written`: {what}", f"{x:.3f}×",
                     verdict(x <= CONFIRM_OVER_WRITTEN)))
    for st, w, c in syscalls_compared(g):
        tw, tc = w.median("calls_per_cycle"), c.median("calls_per_cycle")
        rows.append((f"`confirm` beside `written`: system calls per cycle, {syscalls_what(st)} "
                     "(strace; reported, not a target)",
                     f"{tc:.2f} vs {tw:.2f} = {tc / tw:.3f}×", "–"))
    by_setting = defaultdict(list)
    for (st, _), sl in modes_rounds(g).items():
        x = modes_ratio(sl)[0]
        if x is not None:
            by_setting[st].append(x)
    for st, rs in by_setting.items():
        met = sum(1 for x in rs if x <= CONFIRM_OVER_WRITTEN)
        rows.append((f"`confirm` ≤ {CONFIRM_OVER_WRITTEN:.2f} × `written` in the same seconds "
                     f"(`modes`), {st}, every round", ", ".join(f"{x:.3f}" for x in rs),
                     f"{verdict(met == len(rs))} ({met} of {len(rs)})"))
    cells = impaired_cells(g)
    for rtt, mode, runs in cells:
        if mode != "confirm":
            continue
        p50, measured = runs.median("p50_ms"), runs.median("rtt_ms")
        bound = measured + delack_allowance_ms(measured)
        rows.append((f"`confirm` dispatch latency p50 ≤ one RTT + the peer's delayed ACK, "
                     f"RTT {rtt:g} ms", f"{p50:.1f} ms vs {bound:.0f} ms", verdict(p50 <= bound)))
    if cells:
        bad = sum(runs.total(k) for _, _, runs in cells
                  for k in ("duplicates", "false_received", "true_unreceived", "lost"))
        n = sum(runs.total("dispatches") for _, _, runs in cells)
        rows.append(("impaired network, both modes, every RTT: no run received twice, no `false` "
                     "for a received run, no `true` for a run nobody received, none lost",
                     f"{bad:.0f} such runs of {n:,.0f}", verdict(bad == 0)))
    elif skipped(g, "impaired"):
        rows.append(("`confirm` dispatch latency p50 ≤ one RTT + the peer's delayed ACK",
                     "not measured (see *Dispatch latency at a distance*)", "–"))
    rows += ack_targets(g)
    return rows


# ---- the page -----------------------------------------------------------------------------

def header(meta, out):
    quick = meta.get("quick") == "1"
    out.append("# Benchmarks\n")
    out.append("pilotlight against the brokers it replaces, and its two delivery modes against "
               "each other, on one machine. This page is generated whole by "
               "`loadtest/bench --out docs/benchmarks.md`; to change it, change the bench "
               "(`loadtest/bench`, `loadtest/bench_report.py`) and run it again. How each "
               "figure is measured: *Method*, at the end.\n")
    if quick:
        out.append("> **Quick run** (`--quick`): every scenario shortened, to check that the "
                   "command works. These figures are not a measurement of pilotlight; the "
                   "full run is `loadtest/bench --out docs/benchmarks.md`.\n")
    if not meta:
        return
    wall = int(meta.get("wall_s", 0) or 0)
    commit = f"`{meta.get('commit', 'unknown')}`"
    if meta.get("dirty") == "1":
        commit += " with uncommitted changes"
    hv = f", {meta['hypervisor']} guest" if meta.get("hypervisor") else ""
    out.extend(head(["run", ""]))
    out.append(row(["command", f"`{meta.get('command', 'loadtest/bench')}` "
                    f"({wall // 60} min {wall % 60} s)"]))
    out.append(row(["commit", commit]))
    out.append(row(["machine", f"{meta.get('cpu', '?')}, {meta.get('cpus', '?')} CPUs{hv}, "
                    f"{meta.get('mem_gib', '?')} GiB; kernel {meta.get('kernel', '?')}; "
                    f"{meta.get('os', '?')}"]))
    out.append(row(["pilotlight", f"{meta.get('pilotlight', '?')}, `deploy/build.sh` (release, "
                    f"LTO, profile-guided), {meta.get('cc', '?')}; libuv "
                    f"{meta.get('libuv', '?')}, llhttp {meta.get('llhttp', '?')}; default "
                    f"`delivery = {meta.get('default_delivery', '?')}`"]))
    out.append(row(["references", f"Bun {meta.get('bun', '?')}, Node {meta.get('node', '?')}, "
                    f"{meta.get('nginx', '?')} with Nchan {meta.get('nchan', '?')}, wrk "
                    f"{meta.get('wrk', '?')}"]))
    out.append(row(["tools", f"{meta.get('valgrind', '?')}, {meta.get('strace', '?')}, "
                    f"{meta.get('python', '?')}"]))
    out.append("")


def results(g, meta, out):
    out.append("## Results\n")
    sections = [
        ("The machine", ["jitter"], "How often each pinned CPU is taken away: the floor under "
         "every latency tail below."),
        ("Match cycles", ["closed", "rate"], "A controller parks a poll, a dispatch for its key "
         "hands it the run, it polls again at once."),
        ("HTTP ceiling", ["ceiling"], None),
    ]
    for title, keys, text in sections:
        if any(settings_of(g, TABLES[k][0], TABLES[k][1]) for k in keys):
            out.append(f"### {title}\n")
            if text:
                out.append(text + "\n")
            for k in keys:
                table(g, k, out)
    if (modes_compared(g, meta.get("default_delivery")) or modes_rounds(g)
            or syscalls_compared(g)):
        out.append("### `confirm` against `written`\n")
        modes_compared_table(g, meta.get("default_delivery"), out)
        syscalls_table(g, out)
        modes_table(g, out)
    if impaired_cells(g) or skipped(g, "impaired"):
        out.append("### Dispatch latency at a distance\n")
        out.append("Controllers one round trip away (RTT: as set on the wire, and as the "
                   "kernel measured it over a handshake); latency from the dispatch sent to "
                   "its answer read, over every answer; the last four columns count what "
                   "would break the delivery promise.\n")
        impaired_table(g, out)
    if ack_cells(g) or skipped(g, "ack"):
        out.append("### Dispatch latency with Trigger.dev's client\n")
        out.append("Trigger.dev's `WarmStartClient` as every controller, across a wire of each "
                   "MTU and RTT and over loopback: how long a dispatch waits for its answer "
                   "when `confirm` waits for the controller's kernel to acknowledge the run "
                   "(and when `written` does not), what crossed the wire per dispatch both ways "
                   "(polls and answers included), how many ACK reports came later than the RTT "
                   "+ 20 ms (a delayed ACK), and how each ACK was learnt "
                   "(`pilotlight_confirm_method_total`: `ack_event`, the kernel's ACK report; "
                   "`next_request`, the controller's next request carried it; `next_turn`, a "
                   "look at the send queue on a busy loop's next turn; `poll_fallback`, a look "
                   "where the kernel refused reports; `late_check`, a look once the ACK was "
                   "late). The last column counts what would break the delivery promise, both "
                   "modes.\n")
        ack_table(g, out)
        if ack_legs_cells(g):
            out.append("Where `confirm`'s time went, from both TUN devices captured: a run's "
                       "time split into legs, to the wire (dispatcher and broker), out (the "
                       "wire's crossing), ACK (the controller's kernel), back (the ACK's "
                       "crossing) and answer (from the ACK's arrival to the answer read). "
                       "Crossings: out + back per run, what the round trip took on this wire, "
                       "whose wake-ups add a tail a real path does not have; `confirm` with "
                       "them taken as the cell's RTT is what the rest of the path took plus "
                       "that RTT. The runs slower than the bound (at RTT 1 ms or less, "
                       "`written`'s p90 + 2 ms; farther, the RTT + 5 ms), each leg's time "
                       "beyond its median summed over them, and how many of them (and of all "
                       "runs) were in flight while `pl-lateness` (a SCHED_FIFO thread on each "
                       "CPU waking every millisecond) woke a millisecond or more late; late "
                       "wake-ups: how many in the cell, and the latest.\n")
            ack_legs_table(g, out)
    for title, keys in (("Parked polls", ["idle"]), ("Churn", ["churn"]),
                        ("Scale", ["scale99", "scale50"])):
        if any(settings_of(g, TABLES[k][0], TABLES[k][1]) for k in keys):
            out.append(f"### {title}\n")
            for k in keys:
                table(g, k, out)


def method(meta, commands, out, exact_wire=False, legs=False):
    s = meta.get("settings", {})

    def v(name, default="?"):
        x = str(s.get(name, default))
        return f"{int(x):,}" if x.isdigit() else x

    def listed(name):
        x = [f"{int(i):,}" if i.isdigit() else i for i in v(name).split(",")]
        return ", ".join(x[:-1]) + " and " + x[-1] if len(x) > 1 else x[0]

    rtts = listed("IMPAIR_RTTS")
    out.append("## Method\n")
    out.append(
        f"- **Build.** `deploy/build.sh build-bench`, as the README builds pilotlight: release, "
        f"LTO, and a profile from pilotlight serving match cycles; pl-loadgen, pl-floor and "
        f"pl-wire come from the same build (pl-floor without a profile), the Bun broker is "
        f"compiled with `bun build --compile`.\n"
        f"- **Pinning.** One system at a time, each server under `taskset -c 0`, the generator "
        f"(`pl-loadgen`, or `wrk`) under `taskset -c 1`, a fresh port for every server.\n"
        f"- **Runs.** cycle, idle, churn and scale run {meta.get('runs', '?')} times per system "
        f"and setting (instructions, syscalls, impaired and ack: rounds, below); "
        f"a cell is the median over the runs with min–max in brackets, and ratios are of "
        f"medians. cycle and scale keep one server per system, after a warm-up run, and warm up "
        f"1 s inside each run; idle and churn start a fresh server for each run.\n"
        f"- **CPU and memory.** A server's CPU time is read over the measured window from "
        f"`/proc/<pid>/task/*/schedstat` (all threads; `/proc/<pid>/stat` where that is "
        f"missing), and divided by the cycles delivered; RSS from `/proc/<pid>/status`. For "
        f"nginx, the one worker's.\n"
        f"- **Reading the figures.** This machine's host takes its CPUs away now and then "
        f"(*The machine*), and its cost per wake-up drifts by several per cent between runs "
        f"minutes apart: tails (p99, max) land on those gaps, and differences of a few per cent "
        f"in CPU time between separate runs are noise. p50, p90 and CPU per cycle are the steady "
        f"figures; instruction counts, and `modes` (both delivery modes in the same seconds), "
        f"decide small differences.\n")
    out.append("Per scenario (`--scenarios`; `modes` only when asked for):\n")
    out.append(
        f"- **cycle**: {v('CONTROLLERS')} controllers long-poll `GET /warm-start` with the real "
        f"`x-trigger-*` headers over {v('KEYS')} keys and poll again the moment a payload "
        f"arrives; {v('DISPATCHERS')} dispatcher connections `POST` ~1.2 KB DequeuedMessages with "
        f"unique run ids for random keys: closed loop, then {v('RATE')} dispatches/s offered "
        f"(latency taken from when each dispatch was due, so a stalled server cannot hide its "
        f"queue). {v('CYCLE_SECS')} s measured per run. Delivery latency: dispatch due → the "
        f"controller has the payload with that run id. Nchan gets one channel per controller, "
        f"so that a publish reaches one poll. The ceiling: `wrk -t1 -c50` against nginx "
        f"`return 204`, CPU per request from `/proc/<pid>/stat`.\n"
        f"- **idle**: {v('IDLE_SMALL')} and then {v('IDLE_LARGE')} polls parked on their own "
        f"connections over 100 keys: RSS before, with them, and 2 s after they all close; bytes "
        f"per parked poll = (with − before) ÷ polls; then `GET /healthz`.\n"
        f"- **churn**: connect → poll → abort (FIN) cycles at {v('CHURN_RATE')}/s, 64 in flight, "
        f"each with a new controller id, after {v('CHURN_WARMUP')} warm-up cycles: RSS warmed, peak (every "
        f"20 ms) and at the end; for pilotlight the ledger from `/metrics` (`parked_now` 0, "
        f"`parked_now + Σ settled == parked_total`). {v('CHURN_PL')} cycles for pilotlight, "
        f"{v('CHURN_PEER')} for the others (half that for Node, whose accept loop is slow).\n"
        f"- **scale**: dispatch latency at {v('SCALE_RATE')}/s with {v('SCALE_SMALL')} against "
        f"{v('SCALE_LARGE')} polls parked on 25 keys, and with {v('SCALE_LARGE')} parked on one "
        f"key against one key per poll while half the dispatches go to 100,000 never-parked "
        f"keys; {v('SCALE_SECS')} s per point. Not for Nchan (many polls on one key is a "
        f"broadcast there).\n"
        f"- **instructions**: `loadtest/callgrind` runs its own release build (with `-g`, no "
        f"profile) under `valgrind --tool=callgrind` with instrumentation off, warms it up with "
        f"pl-loadgen's cycle (500 controllers, 50 dispatchers, 30 keys) at "
        f"{v('CALLGRIND_RATE')} cycles/s, then counts {v('CALLGRIND_SECS')} s: the process's "
        f"user-space instructions ÷ dispatches. Rounds: {v('CALLGRIND_RUNS')}, each mode once, "
        f"which goes first alternating. Instructions do not move with the machine, so they judge the "
        f"differences CPU time cannot.\n"
        f"- **syscalls**: `loadtest/syscalls` starts the bench's pilotlight on CPU 0, a fresh "
        f"one per round and mode, warms it with pl-loadgen's cycle (500 controllers, 50 "
        f"dispatchers, 30 keys, on CPU 1) at {v('SYSCALLS_RATE')} cycles/s, then counts its "
        f"system calls with `strace -c -f -p PID` over windows that each hold one whole "
        f"pl-loadgen run: {v('SYSCALLS_CYCLES')} cycles at {v('SYSCALLS_RATE')} cycles/s, the "
        f"closed loop for as long, and 2 cycles, whose calls (connecting, parking and closing "
        f"the 550 connections, which every window holds) are taken off the others'. A "
        f"window's cycles are the difference of `pilotlight_dispatch_total` read before and "
        f"after it with strace detached. Rounds: {v('SYSCALLS_RUNS')}, which mode goes first "
        f"alternating; a cell is the median over the rounds. strace stops the server at every "
        f"call, so the server runs slower than untraced: the figure is calls, not time. The "
        f"reads and writes per cycle do not depend on timing. How `confirm` learns each ACK "
        f"does (`ioctl`: a look at the send queue; `sendmsg`, `recvmsg`, `epoll_ctl`: a "
        f"report asked for and read), and so do the wake-ups (`epoll_wait`, one per turn of "
        f"the loop, which serves every cycle ready by then: few in the closed loop, or "
        f"wherever the traced server falls behind), which is why the table also gives the "
        f"total without them.\n"
        f"- **impaired**: the test suite's impaired-network harness (`tests/harness/impair.py`): "
        f"pilotlight and the dispatcher in one network namespace, 48 controllers over 4 keys in "
        f"another (half keep their connection after a run, half close it; each works "
        f"0.5–1.5 s, then polls again), joined by `pl-wire` with half the RTT each way and a "
        f"jitter of RTT/40. Per round, RTT ({rtts} ms) and mode, a fresh pilotlight "
        f"and {v('IMPAIR_DISPATCHES')} runs dispatched open loop at {v('IMPAIR_RATE')}/s; "
        f"rounds: {v('IMPAIR_RUNS')}. Not pinned: the wire's delay, not the CPU, sets these "
        f"figures. The target's allowance for the peer's delayed ACK is Linux's: at least "
        f"40 ms, at most 200 ms, and the path's RTT in between.\n"
        f"- **ack**: `loadtest/ack-latency` on the same harness, with Trigger.dev's "
        f"`WarmStartClient` (`@trigger.dev/core`, `tests/compat/controllers.mjs`) as every "
        f"controller: 40 of them in one node process over 4 keys, each working 0.5–1.5 s after "
        f"a run before it polls again, joined to pilotlight by `pl-wire` with half the RTT "
        f"each way, a jitter of RTT/40 and the cell's MTU on both ends"
        + ("" if not exact_wire else
           " (the delay fitted so that the kernel measures the cell's RTT over a handshake: "
           "pl-wire's own wake-ups add 0.1–0.4 ms a round trip here, which are taken off "
           "it, [notes/2026-12-05-wire-rtt.md](notes/2026-12-05-wire-rtt.md))") +
        "; MTU "
        f"{listed('ACK_MTUS')} × RTT {listed('ACK_RTTS')} ms, and the same fleet over "
        f"pilotlight's loopback (MTU 65,536). Per cell and mode a fresh pilotlight, a "
        f"fleet of its own and {v('ACK_DISPATCHES')} runs dispatched open loop at "
        f"{v('ACK_RATE')}/s, the two modes' pilotlights taking turns run by run, so both "
        f"are measured in the same seconds; rounds: {v('ACK_RUNS')}, a cell the median over "
        f"them (bytes and segments too; late reports and how ACKs were learnt: summed). "
        f"The controllers' side stands for machines of its own: the controllers run under "
        f"SCHED_IDLE and the wire under SCHED_FIFO, so a controller busy with the run it "
        f"has just received does not hold the CPU the broker needs to learn of its ACK "
        f"([notes/2026-12-05-confirm-cpu.md](notes/2026-12-05-confirm-cpu.md)). "
        f"Fleets (`ACK_FLEETS` {v('ACK_FLEETS', 'shared')}): *one pool* (shared), the 40 "
        f"clients sharing node's "
        f"connection pool, so a poll now and then leaves on a connection that delivered a "
        f"run within the last 40 ms: that puts the connection's receiving kernel in Linux's "
        f"ping-pong mode, where it holds the ACK of a one-segment answer until its "
        f"delayed-ACK timer fires or, solicited, until the client reads it: the case "
        f"`confirm` must handle "
        f"([notes/2026-12-05-soliciting-the-ack.md](notes/2026-12-05-soliciting-the-ack.md)); "
        f"*a pool each* (own), each client naming the server by a host name of its own, so its "
        f"connections are its own, as a run controller's are in its container: no answer "
        f"needed shaping, and a capture at MTU 9,001 saw every run ACKed on arrival "
        f"([notes/2026-12-05-mtu9001-ack.md](notes/2026-12-05-mtu9001-ack.md)). "
        f"Bytes and data segments: IP bytes "
        f"and TCP segments carrying data, both ways, counted by `pl-wire`, over the "
        f"dispatches; a late ACK report comes more than the RTT + 20 ms after the write; how "
        f"each ACK was learnt: `pilotlight_confirm_method_total`. Not pinned. Up to "
        f"{ACK_NEAR_MS:g} ms of RTT, `confirm` is judged against `written` in the same cell; "
        f"further, against the cell's RTT as the kernel measured it over a handshake; "
        f"loopback is shown, not judged."
        + ("" if not legs else
           " Each wire cell is also captured on both TUN devices (`AF_PACKET`, the kernel's "
           "timestamps) and each run split into legs by its segments (`impair.run_legs`): "
           "each target gives `confirm`'s figure once more with the two crossings taken as "
           "the cell's RTT, the rest of each run's time as measured (in brackets; the verdict is "
           "the measured figure's); and `pl-lateness` "
           "(`tests/impair/lateness.c`) runs through the dispatches, a SCHED_FIFO thread on "
           "each CPU waking every millisecond, to say when the machine itself was slow.")
        + "\n"
        f"- **modes**: two pilotlights share CPU 0, each under its own pl-loadgen on CPU 1, in "
        f"opposite delivery modes; every {v('MODE_SECS')} s, for {v('MODE_SLICES')} slices, "
        f"`loadtest/bench_modes.py` rewrites both configs and sends SIGHUP, swapping the roles "
        f"(A B B A …). Settings: closed loop, {v('RATE')}/s each, and {v('RATE')}/s each with "
        f"controllers that run {v('MODE_HOLD')} ms before they poll again (so their ACKs come "
        f"alone, as in production). A round's ratio is the geometric mean over pairs of "
        f"neighbouring slices, which cancels the two servers' own difference.\n")
    if commands:
        out.append("The commands, as run (`PORT`, `PID`: each server's; `RESULTS`: the run's "
                   "results directory, where nginx's configurations are "
                   "`loadtest/peers/*.conf.in` with the port filled in):\n")
        out.append("```")
        out.append("# the servers, on CPU 0")
        out.extend(c["cmd"] for c in commands if c["scenario"] == "server")
        shown = None
        for c in commands:
            if c["scenario"] == "server" or c["system"] not in ("pilotlight", "nginx-204",
                                                                   "machine"):
                continue
            if c["scenario"] != shown:
                shown = c["scenario"]
                out.append(f"# {shown}")
            out.append(c["cmd"])
        out.append("```\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--meta")
    ap.add_argument("--commands")
    a = ap.parse_args()
    recs = []
    with open(a.results) as f:
        for ln in f:
            ln = ln.strip()
            if ln.startswith("{"):
                recs.append(json.loads(ln))
    meta = {}
    if a.meta:
        with open(a.meta) as f:
            meta = json.load(f)
    commands = []
    if a.commands:
        with open(a.commands) as f:
            commands = [json.loads(ln) for ln in f if ln.startswith("{")]
    g = group(merge_slices(recs))
    out = []
    header(meta, out)
    rows = targets(g, meta)
    if rows:
        out.append("## Targets\n")
        out.extend(head(["target", "measured", "verdict"]))
        out.extend(row(list(r)) for r in rows)
        out.append("")
    results(g, meta, out)
    # Lines from before the wire was fitted carry no wire_rtt_ms.
    exact_wire = any(r.get("wire_rtt_ms") is not None for (sc, _, _), rs in g.items()
                     if sc == "ack" for r in rs)
    legs = any(get(r, "at_rtt_ms.p90") is not None for (sc, _, _), rs in g.items()
               if sc == "ack" for r in rs)
    method(meta, commands, out, exact_wire, legs)
    print("\n".join(out).rstrip("\n"))


if __name__ == "__main__":
    main()
