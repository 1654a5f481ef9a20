#!/usr/bin/env python3
"""bench_modes.py -- confirm against written, measured in the same seconds:
loadtest/bench's `modes` scenario. Two pilotlight servers share one CPU,
each started with its own --config FILE and each under its own steady
pl-loadgen, and are always in opposite delivery modes: slice by slice the
script rewrites both files' `delivery` line and sends both a SIGHUP,
swapping the roles in A B B A order. It prints one JSON line per slice:
each mode's server CPU (schedstat, all its threads) over the dispatches it
answered (its own /metrics), and confirm's over written's.

Why two at once: what the host takes from the CPU (steal, cold caches)
comes and goes within seconds, and moved one server's cost per cycle by up
to 16 % between neighbouring 3 s slices. Two servers on the same CPU in
the same seconds both pay it, and their ratio moves by a few per cent at
most. Why the swap: the two servers differ a little by themselves (a few
per cent, whichever mode they run); each mode runs half the slices on
each, so two neighbouring slices together cancel it."""

import argparse
import json
import os
import re
import signal
import sys
import time
import urllib.request

MODES = ("written", "confirm")


def per_task(pid, name, value):
    """Sum over <pid>'s threads of value(text of /proc/<pid>/task/*/<name>)."""
    tasks = f"/proc/{pid}/task"
    total = 0
    for t in os.listdir(tasks):
        try:
            with open(f"{tasks}/{t}/{name}") as f:
                total += value(f.read())
        except FileNotFoundError:  # a thread that just ended
            pass
    return total


def cpu_seconds(pid):
    return per_task(pid, "schedstat", lambda text: int(text.split()[0])) / 1e9


def sleeps(pid):
    """Times <pid> went to sleep so far: its threads' voluntary switches."""
    return per_task(pid, "status", lambda text: int(
        re.search(r"^voluntary_ctxt_switches:\s*(\d+)", text, re.M).group(1)))


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


class Server:
    def __init__(self, spec):
        pid, port, self.config = spec.split(":", 2)
        self.pid, self.port = int(pid), int(port)
        with open(self.config) as f:
            self.rest = "".join(ln for ln in f if not re.match(r"\s*delivery\s*=", ln))

    def switch(self, mode):
        with open(self.config, "w") as f:
            f.write(self.rest + f"delivery = {mode}\n")
        os.kill(self.pid, signal.SIGHUP)

    def sample(self):
        return (cpu_seconds(self.pid),) + counters(self.port)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", action="append", required=True, metavar="PID:PORT:CONFIG",
                    help="twice: the two servers and their config files")
    ap.add_argument("--slices", type=int, default=16)
    ap.add_argument("--secs", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=0.3,
                    help="seconds left out after each switch (longer than "
                         "confirm_timeout_ms, so no delivery of the last mode "
                         "settles in the slice)")
    ap.add_argument("--cpu", type=int, help="the servers' CPU, for the host's steal time")
    ap.add_argument("--label", default="{}", help="JSON object merged into every line")
    a = ap.parse_args()
    if len(a.server) != 2:
        ap.error("--server is given twice")
    servers = [Server(s) for s in a.server]
    label = json.loads(a.label)
    for i in range(a.slices):
        first = MODES[(i + i // 2) % 2]  # the first server's: A B B A A B B A ...
        modes = (first, MODES[first == "written"])
        for s, m in zip(servers, modes):
            s.switch(m)
        time.sleep(a.settle)
        before, s0 = [s.sample() for s in servers], cpu_ticks(a.cpu)
        time.sleep(a.secs)
        after, s1 = [s.sample() for s in servers], cpu_ticks(a.cpu)
        line = dict(label, scenario="modes", slice=i + 1, first=first,
                    steal_pct=round(100.0 * (s1[0] - s0[0]) / (s1[1] - s0[1]), 2)
                    if s1[1] > s0[1] else 0.0)
        for m, b, e in zip(modes, before, after):
            n = e[1] - b[1]
            line[f"{m}_dispatches"] = int(n)
            line[f"{m}_acked"] = int(e[2] - b[2])
            line[f"{m}_us_per_cycle"] = round((e[0] - b[0]) * 1e6 / n, 3) if n else -1
        if line["written_dispatches"] and line["confirm_dispatches"]:
            line["ratio"] = round(line["confirm_us_per_cycle"] / line["written_us_per_cycle"], 4)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
