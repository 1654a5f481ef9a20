#!/usr/bin/env python3
"""bench_impaired.py -- loadtest/bench's `impaired` scenario: how long a
dispatcher waits for its answer under `delivery = confirm` and `written`
when the controllers are a round trip away.

It drives the test suite's impaired-network harness (tests/harness/impair.py,
the figures tests/blackbox/test_impaired.py asserts on): pilotlight and the
dispatcher in one network namespace, controllers in another, joined by
pl-wire with half the round-trip time each way. Per round, per RTT, per mode:
a fresh pilotlight, KEYS x PER_KEY controllers (our own, half keeping their
connection after a run, half closing it; each "works" 0.5-1.5 s before it
polls again), DISPATCHES runs with unique ids dispatched open loop at RATE a
second, round robin over the keys. Prints one JSON line per cell: the
dispatch latency p50/p90/p99 (request sent -> answer read, over every answer),
the RTT the kernel measured over a handshake, the answers, and what the
harness counts against the delivery promise (runs received twice, `false`
for a received run, `true` for a run nobody received, lost runs).

    bench_impaired.py --bin PILOTLIGHT --wire PL_WIRE [--rtts 0.2,20,80,200]
                      [--dispatches 240] [--rate 20] [--runs 1]

Needs root, iproute2 and /dev/net/tun, and pytest importable (the harness
uses the suite's conftest); without them it prints one "skipped" line with
the reason. The namespaces and the wire are removed after each round.
"""
import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("confirm", "written")
KEYS, PER_KEY = 4, 12
WORK_MS = (500, 1500)
FIGURES = ("dispatches", "true", "false", "errors", "duplicates", "false_received",
           "true_unreceived", "lost", "excess", "p50_ms", "p90_ms", "p99_ms", "rtt_ms")


def wire_settings(rtt):
    """The wire's settings for a nominal RTT. The wire's own wake-ups add
    about 0.1 ms to a round trip, so 0.2 ms asks for 0.1 (as the test
    suite's matrix does); a little jitter, as on a real path."""
    return {"rtt_ms": max(rtt - 0.1, 0.0) if rtt < 1 else rtt, "jitter_ms": rtt / 40}


def skipped(why):
    print(json.dumps({"scenario": "skipped", "setting": "impaired", "why": why}), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--wire", required=True)
    ap.add_argument("--rtts", default="0.2,20,80,200")
    ap.add_argument("--dispatches", type=int, default=240)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--runs", type=int, default=1)
    a = ap.parse_args()
    os.environ["PILOTLIGHT_BIN"] = a.bin  # conftest reads it as it is imported
    sys.path.insert(0, str(ROOT / "tests" / "harness"))
    try:
        import impair
    except ImportError as e:
        return skipped(f"the test harness cannot be imported: {e}")
    why = impair.why_unavailable()
    if why:
        return skipped(why)
    if not os.access(a.wire, os.X_OK):
        return skipped(f"{a.wire} is not built")
    rtts = [float(x) for x in a.rtts.split(",")]
    for rnd in range(1, a.runs + 1):
        with impair.ImpairedNet(a.wire, seed=rnd) as net:
            for rtt in rtts:
                # Which mode goes first alternates, so a slow minute of the
                # machine does not always fall on the same one.
                modes = MODES if (rnd + rtts.index(rtt)) % 2 else MODES[::-1]
                for mode in modes:
                    print(f"bench_impaired: round {rnd}, RTT {rtt:g} ms, {mode}",
                          file=sys.stderr, flush=True)
                    f = impair.run_cell(net, mode, dispatches=a.dispatches, rate=a.rate,
                                        keys=KEYS, per_key=PER_KEY, work_ms=WORK_MS,
                                        seed=rnd, tag=f"r{rnd}_{mode}_{rtt:g}",
                                        **wire_settings(rtt))
                    print(impair.describe(f), file=sys.stderr, flush=True)
                    line = {"scenario": "impaired", "setting": f"rtt{rtt:g}",
                            "system": f"pilotlight-{mode}", "round": rnd,
                            "rtt_nominal_ms": rtt, "rate": a.rate, "wall_s": round(f["wall_s"], 1),
                            "confirm": f["broker"]["confirm"], "dispatch": f["broker"]["dispatch"]}
                    line.update({k: round(f[k], 3) if isinstance(f[k], float) else f[k]
                                 for k in FIGURES})
                    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
