#!/usr/bin/env python3
"""bench_report.py -- turns loadtest/bench's JSON lines into the markdown
report: per scenario a table of medians with min-max over the runs and each
system's ratio to pilotlight, then the issue's targets, met or missed."""

import argparse
import json
import math
import statistics
from collections import defaultdict

SYSTEMS = ["machine", "pilotlight", "pilotlight-written", "pilotlight-confirm", "floor",
           "bun-compiled", "bun", "node", "nchan", "nginx-204"]


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


# (scenario, setting prefix) -> (title, [(label, path, digits)], headline path, note)
TABLES = [
    ("jitter", "cpu", "machine: a pinned loop that only reads the clock (3 s)",
     [("gaps >100 µs /s", "gaps_100us_per_s", 1), ("gaps >1 ms /s", "gaps_1ms_per_s", 1),
      ("gaps >5 ms /s", "gaps_5ms_per_s", 1), ("longest gap µs", "max_gap_us", 0),
      ("time lost in gaps >100 µs %", "lost_pct", 2)],
     None),
    ("ceiling", "wrk", "HTTP ceiling: nginx `return 204` driven by wrk (-t1 -c50)",
     [("requests/s", "req_per_s", 0), ("server CPU µs/request", "server_cpu_us_per_req", 2)],
     None),
    ("cycle", "closed", "cycle, closed loop (500 controllers, 50 dispatchers)",
     [("dispatch/s", "dispatch_per_s", 0), ("delivered/s", "delivered_per_s", 0),
      ("hit ratio", "hit_ratio", 3), ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1),
      ("server CPU %", "server_cpu_pct", 0), ("delivery p99 µs", "delivery_us.p99", 0),
      ("generator CPU %", "generator_cpu_pct", 0)],
     "server_cpu_us_per_cycle"),
    ("cycle", "rate", "cycle at a fixed offered rate",
     [("delivered/s", "delivered_per_s", 0), ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1),
      ("delivery p50 µs", "delivery_us.p50", 0), ("delivery p99 µs", "delivery_us.p99", 0),
      ("delivery p99.9 µs", "delivery_us.p999", 0), ("delivery max µs", "delivery_us.max", 0),
      ("dispatch p99 µs", "dispatch_us.p99", 0)],
     "delivery_us.p99"),
    ("idle", "parked", "idle: parked polls held open",
     [("bytes/parked poll", "bytes_per_parked", 0), ("RSS before KiB", "rss_before_kb", 0),
      ("RSS with KiB", "rss_with_kb", 0), ("RSS 2 s after close KiB", "rss_after_kb", 0),
      ("probe after close", "probe_status", 0)],
     "bytes_per_parked"),
    ("churn", "cycles", "churn: connect, park, abort",
     [("cycles/s", "cycles_per_s", 0), ("RSS warmed KiB", "rss_base_kb", 0),
      ("RSS peak KiB", "rss_peak_kb", 0), ("RSS end KiB", "rss_end_kb", 0),
      ("growth KiB", "rss_growth_kb", 0), ("growth %", "rss_growth_pct", 2),
      ("growth from start KiB", "rss_growth_from_start_kb", 0),
      ("server CPU µs/cycle", "server_cpu_us_per_cycle", 1), ("ledger ok", "ledger_ok", 0)],
     "rss_peak_kb"),
    ("scale", "scale", "scale: dispatch latency (µs) at a fixed rate, p99",
     [("1 k parked", "parked_small.dispatch_us.p99", 0),
      ("large parked", "parked_large.dispatch_us.p99", 0),
      ("1 key", "keys_one.dispatch_us.p99", 0), ("1 key per poll", "keys_many.dispatch_us.p99", 0),
      ("ratio parked", "p99_ratio_parked", 2), ("ratio keys", "p99_ratio_keys", 2)],
     None),
    ("scale", "scale", "scale: the same runs, p50 and p90",
     [("1 k parked p50", "parked_small.dispatch_us.p50", 0),
      ("large parked p50", "parked_large.dispatch_us.p50", 0),
      ("1 key p50", "keys_one.dispatch_us.p50", 0), ("1 key per poll p50", "keys_many.dispatch_us.p50", 0),
      ("1 k parked p90", "parked_small.dispatch_us.p90", 0),
      ("large parked p90", "parked_large.dispatch_us.p90", 0),
      ("1 key p90", "keys_one.dispatch_us.p90", 0), ("1 key per poll p90", "keys_many.dispatch_us.p90", 0)],
     None),
]


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


def table(g, scenario, setting, title, cols, headline, out):
    systems = [s for s in SYSTEMS if (scenario, setting, s) in g]
    if not systems:
        return
    base = Runs(g.get((scenario, setting, "pilotlight"), [])) if headline else None
    label = setting if setting not in ("closed", "wrk", "scale") else ""
    if scenario == "jitter":
        label = "CPU " + setting[3:]
    out.append(f"### {title}{' — ' + label if label else ''}\n")
    head = ["system", "runs"] + [c[0] for c in cols]
    if headline:
        head.append("vs pilotlight (" + next(c[0] for c in cols if c[1] == headline) + ")")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for s in systems:
        runs = Runs(g[(scenario, setting, s)])
        row = [s, str(len(runs.recs))] + [cell(runs, c[1], c[2]) for c in cols]
        if headline:
            row.append(ratio(runs, base, headline))
        out.append("| " + " | ".join(row) + " |")
    out.append("")


MODES = ("written", "confirm")


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
    out.append("### confirm against written in the same seconds: two servers on CPU 0 in "
               "opposite delivery modes, swapped by SIGHUP slice by slice (A B B A …)\n")
    head = ["setting", "round", "slices", "written µs/cycle", "confirm µs/cycle",
            "confirm ÷ written", "± (1 s.e.)", "second server ÷ first",
            "acked in written / confirm", "host steal % (median, max)"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for (st, rd), sl in rounds.items():
        row = [st, str(rd), str(len(sl))]
        row += [cell(Runs(sl), f"{m}_us_per_cycle", 1) for m in MODES]
        x, se, servers = modes_ratio(sl)
        row += ["–"] * 3 if x is None else [f"{x:.3f}", f"{100 * se:.1f} %", f"{servers:.3f}"]
        row.append(" / ".join(f"{sum(r[m + '_acked'] for r in sl):,}" for m in MODES))
        steal = [r["steal_pct"] for r in sl]
        row.append(f"{statistics.median(steal):.1f}, {max(steal):.1f}")
        out.append("| " + " | ".join(row) + " |")
    out.append("")


def verdict(ok):
    return "met" if ok else "**missed**"


def targets(g, out):
    def runs(sc, st_prefix, sys):
        for (a, b, c), v in g.items():
            if a == sc and b and b.startswith(st_prefix) and c == sys:
                return Runs(v)
        return None

    head = len(out)
    out.append("## Targets (issue 3)\n")
    out.append("| target | measured | verdict |")
    out.append("|---|---|---|")
    pl = runs("cycle", "closed", "pilotlight")
    bun = runs("cycle", "closed", "bun-compiled")
    ngx = runs("ceiling", "wrk", "nginx-204")
    if pl and bun:
        a, b = pl.median("server_cpu_us_per_cycle"), bun.median("server_cpu_us_per_cycle")
        if a and b:
            out.append(f"| server CPU per cycle ≤ 1/5 of compiled Bun's | {a:.1f} µs vs {b:.1f} µs "
                       f"= 1/{b / a:.1f} | {verdict(a * 5 <= b)} |")
    if pl and ngx:
        a, n = pl.median("server_cpu_us_per_cycle"), ngx.median("server_cpu_us_per_req")
        if a and n:
            out.append(f"| … and ≤ two nginx `return 204` requests | {a:.1f} µs vs 2 × {n:.2f} µs "
                       f"= {a / n:.2f} requests | {verdict(a <= 2 * n)} |")
    for (a_, st, sys) in sorted(g):
        if a_ == "cycle" and st.startswith("rate") and sys == "pilotlight":
            r = Runs(g[(a_, st, sys)])
            p99, mx = r.median("delivery_us.p99"), r.median("delivery_us.max")
            rate = r.median("delivered_per_s")
            out.append(f"| at {st[4:]} cycles/s offered: delivery p99 ≤ 0.5 ms | {p99 / 1000:.3f} ms "
                       f"(delivered {rate:,.0f}/s) | {verdict(p99 <= 500)} |")
            out.append(f"| … and max ≤ 3 ms | {mx / 1000:.3f} ms | {verdict(mx <= 3000)} |")
    for (a_, st, sys) in sorted(g, key=lambda k: (k[0], len(k[1] or ""), k[1] or "")):
        if a_ == "idle" and sys == "pilotlight":
            r = Runs(g[(a_, st, sys)])
            b = r.median("bytes_per_parked")
            out.append(f"| ≤ 1 KiB RSS per parked poll at {st[6:]} | {b:,.0f} bytes | "
                       f"{verdict(b <= 1024)} |")
    ch = runs("churn", "cycles", "pilotlight")
    if ch:
        st = next(b for (a, b, c) in g if a == "churn" and c == "pilotlight")
        worst = max(abs(v) for v in ch.values("rss_growth_pct"))
        peaks = ch.values("rss_peak_kb")
        spread = (max(peaks) - min(peaks)) * 100.0 / min(peaks) if peaks else 0
        out.append(f"| churn {st[6:]} cycles: RSS back within 1 % of warmed baseline | worst run "
                   f"{worst:.2f} % | {verdict(worst <= 1.0)} |")
        out.append(f"| … peak RSS across {len(peaks)} runs within 1 % | "
                   f"{min(peaks):,}–{max(peaks):,} KiB = {spread:.2f} % | {verdict(spread <= 1.0)} |")
        ok = all(v == 1 for v in ch.values("ledger_ok"))
        out.append(f"| … ledger balanced after churn | {ch.values('ledger_ok')} | {verdict(ok)} |")
    sc = runs("scale", "scale", "pilotlight")
    if sc:
        for name, path in (("1 k vs large parked", "p99_ratio_parked"),
                           ("1 vs many keys (+ misses)", "p99_ratio_keys")):
            v = sc.median(path)
            out.append(f"| scale p99 within ±10 %: {name} | ratio {v:.2f} | "
                       f"{verdict(0.9 <= v <= 1.1)} |")
    if len(out) == head + 3:  # none of its scenarios ran
        del out[head:]
    else:
        out.append("")


def targets_floor(g, out):
    """Issue 10, per cycle setting: confirm's cost over written, and
    pilotlight's over the floor and compiled Bun; and confirm over written
    per round of the modes scenario."""
    def cpu(sys, st):
        r = g.get(("cycle", st, sys))
        return Runs(r).median("server_cpu_us_per_cycle") if r else None

    def at(st, each=""):
        if st == "closed":
            return "in the closed loop"
        rate, _, hold = st[4:].partition("-hold")
        return f"at {rate} cycles/s offered{each}" + \
            (f", controllers running {hold} ms before they poll again" if hold else "")

    rows = []
    settings = settings_of(g, "cycle", "closed") + settings_of(g, "cycle", "rate")
    for st in settings:
        w, c = cpu("pilotlight-written", st), cpu("pilotlight-confirm", st)
        if w and c:
            rows.append(f"| `delivery = confirm` CPU per cycle ≤ 1.05 × `written`, {at(st)} | "
                        f"{c:.1f} µs vs {w:.1f} µs = {c / w:.3f}× | {verdict(c <= 1.05 * w)} |")
    by_setting = defaultdict(list)
    for (st, _), sl in modes_rounds(g).items():
        x = modes_ratio(sl)[0]
        if x is not None:
            by_setting[st].append(x)
    for st, rs in by_setting.items():
        met = sum(1 for x in rs if x <= 1.05)
        rows.append(f"| `confirm` ≤ 1.05 × `written` in the same seconds (modes), "
                    f"{at(st, ' each')}, per round | "
                    f"{', '.join(f'{x:.3f}' for x in rs)} | "
                    f"{verdict(met == len(rs))} ({met} of {len(rs)}) |")
    for st in settings:
        fl, bun = cpu("floor", st), cpu("bun-compiled", st)
        for name in ("pilotlight", "pilotlight-confirm", "pilotlight-written"):
            pl = cpu(name, st)
            if pl and fl:
                rows.append(f"| {name} CPU per cycle ≤ 1.15 × the floor (pl-floor), {at(st)} | "
                            f"{pl:.1f} µs vs {fl:.1f} µs = {pl / fl:.2f}× | "
                            f"{verdict(pl <= 1.15 * fl)} |")
            if pl and bun:
                rows.append(f"| … and ≤ ½ of compiled Bun's | {pl:.1f} µs vs {bun:.1f} µs = "
                            f"{pl / bun:.2f}× | {verdict(2 * pl <= bun)} |")
    if rows:
        out.append("## Targets (issue 10)\n")
        out.append("| target | measured | verdict |")
        out.append("|---|---|---|")
        out.extend(rows)
        out.append("")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--versions")
    ap.add_argument("--command", default="loadtest/bench")
    ap.add_argument("--wall", type=int, default=0)
    a = ap.parse_args()
    recs = []
    with open(a.results) as f:
        for ln in f:
            ln = ln.strip()
            if ln.startswith("{"):
                recs.append(json.loads(ln))
    g = group(merge_slices(recs))
    out = ["# Benchmarks: pilotlight and the reference brokers\n"]
    out.append(f"Command: `{a.command}` (wall time {a.wall // 60} min {a.wall % 60} s). "
               "Server pinned to CPU 0, generator (`pl-loadgen`, or `wrk` for the ceiling) "
               "to CPU 1; cells are medians over the runs with min–max in brackets; "
               "CPU figures are the server's run time (`/proc/<pid>/task/*/schedstat`, "
               "`/proc/<pid>/stat` where that is missing) over the measured window; with "
               "`--interleave` a cycle run is the sum of its slices.\n")
    if a.versions:
        with open(a.versions) as f:
            out.append(f.read())
    out.append("## Results\n")
    for scenario, prefix, title, cols, headline in TABLES:
        for setting in settings_of(g, scenario, prefix):
            table(g, scenario, setting, title, cols, headline, out)
    modes_table(g, out)
    targets(g, out)
    targets_floor(g, out)
    print("\n".join(out))


if __name__ == "__main__":
    main()
