#!/usr/bin/env python3
"""bench_modes.py -- confirm against written on one server: loadtest/bench's
`modes` scenario. While pl-loadgen keeps a steady load on a pilotlight
started with --config CONFIG, switches `delivery` between written and
confirm by rewriting CONFIG's `delivery` line and sending SIGHUP, slice by
slice in ABBA order, and prints one JSON line per slice: the server's CPU
(schedstat, all its threads) over the dispatches it answered (its own
/metrics), and the share of its CPU's time the host took (steal; not in
schedstat, but a host that takes much also leaves the caches cold).

Why one server: it takes a fresh server's own differences and start-up
out of the comparison, and ABBA keeps a linear drift of the machine from
favouring either mode. What it does not remove is the host: on a busy one,
neighbouring slices of one mode differ by up to 16 % and the rounds scatter
as widely as the bench's fresh-server slices (docs/benchmarks.md), so a
ratio to within a few per cent takes many slices (MODE_SLICES)."""

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.request

MODES = ("written", "confirm")


def cpu_seconds(pid):
    tasks = f"/proc/{pid}/task"
    total = 0
    for t in os.listdir(tasks):
        try:
            with open(f"{tasks}/{t}/schedstat") as f:
                total += int(f.read().split()[0])
        except FileNotFoundError:  # a thread that just ended
            pass
    return total / 1e9


def cpu_ticks(cpu):
    """(steal, all) clock ticks of one CPU (or of all, cpu None) so far."""
    name = "cpu" if cpu is None else f"cpu{cpu}"
    with open("/proc/stat") as f:
        for ln in f:
            v = ln.split()
            if v[0] == name:
                t = [int(x) for x in v[1:9]]  # user .. steal
                return t[7], sum(t)
    return 0, 0


def counters(port):
    """Answered dispatches (hit + miss) and acknowledged confirm attempts."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()

    def total(pattern):
        return sum(float(v) for v in re.findall(pattern, text, re.M))

    return (total(r'^pilotlight_dispatch_total\{result="(?:hit|miss)"\} (\S+)'),
            total(r'^pilotlight_confirm_total\{outcome="acked"\} (\S+)'))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--config", required=True, help="the server's config file")
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds left out after each switch (longer than "
                         "confirm_timeout_ms, so no delivery of the last mode "
                         "settles in the slice)")
    ap.add_argument("--cpu", type=int, help="the server's CPU, for the host's steal time")
    ap.add_argument("--label", default="{}", help="JSON object merged into every line")
    a = ap.parse_args()
    label = json.loads(a.label)
    with open(a.config) as f:
        rest = "".join(ln for ln in f if not re.match(r"\s*delivery\s*=", ln))
    for i in range(a.slices):
        mode = MODES[(i + i // 2) % 2]  # A B B A A B B A ...
        with open(a.config, "w") as f:
            f.write(rest + f"delivery = {mode}\n")
        os.kill(a.pid, signal.SIGHUP)
        time.sleep(a.settle)
        c0, (k0, ack0), t0 = cpu_seconds(a.pid), counters(a.port), time.monotonic()
        s0 = cpu_ticks(a.cpu)
        time.sleep(a.secs)
        c1, (k1, ack1), t1 = cpu_seconds(a.pid), counters(a.port), time.monotonic()
        s1 = cpu_ticks(a.cpu)
        n = k1 - k0
        print(json.dumps(dict(label, scenario="modes", slice=i + 1, mode=mode,
                              secs=round(t1 - t0, 3), dispatches=int(n),
                              acked=int(ack1 - ack0), server_cpu_s=round(c1 - c0, 6),
                              steal_pct=round(100.0 * (s1[0] - s0[0]) / (s1[1] - s0[1]), 2)
                              if s1[1] > s0[1] else 0.0,
                              server_cpu_us_per_cycle=round((c1 - c0) * 1e6 / n, 3)
                              if n else -1)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
