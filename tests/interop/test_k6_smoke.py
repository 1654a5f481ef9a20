"""k6 smoke: loadtest/k6/controllers.js and dispatch.js, run by a real k6
(../shared/tools/k6, v0.49.0) against pilotlight for a few seconds. Both
runs must exit 0 (every threshold held: k6 exits 99 otherwise), report each
threshold as passed, and the dispatchers must have hit warm starts.

Skipped, saying why, only where the k6 binary is absent. Left out of the
valgrind pass (tests/run.sh): it tests the scripts, and the server at speed.
"""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, scrape

K6 = REPO_ROOT.parent / "shared" / "tools" / "k6"
K6_DIR = REPO_ROOT / "loadtest" / "k6"
CONNECTION_TIMEOUT_MS = 2000
CONTROLLERS = 60            # 5 deployments x 6 presets = 30 keys, two polls each

pytestmark = pytest.mark.skipif(
    not os.access(K6, os.X_OK),
    reason=f"k6 not found at {K6} (../shared/tools/k6 beside the checkout; see its README)")


def k6_run(script, summary, **env):
    """Starts `k6 run` on <script>; its end-of-test summary goes to <summary>."""
    args = [str(K6), "run", "--quiet", "--no-color", "--no-usage-report",
            "--address", "", "--summary-export", str(summary)]
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    return subprocess.Popen(args + [str(K6_DIR / script)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, K6_NO_USAGE_REPORT="true"))


def finish(proc, summary, timeout):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"k6 exited {proc.returncode} (99: a threshold failed):\n{out[-4000:]}"
    metrics = json.loads(Path(summary).read_text())["metrics"]
    # In k6's summary export a threshold maps to true when it was crossed.
    crossed = {(name, t) for name, m in metrics.items()
               for t, bad in m.get("thresholds", {}).items() if bad}
    assert not crossed, f"thresholds crossed: {crossed}\n{out[-4000:]}"
    assert any(m.get("thresholds") for m in metrics.values()), "no thresholds were evaluated"
    return metrics


def test_k6_controllers_and_dispatch(start_server, tmp_path):
    s = start_server("--connection-timeout-ms", str(CONNECTION_TIMEOUT_MS))
    base = f"http://127.0.0.1:{s.port}"
    ctl = k6_run("controllers.js", tmp_path / "controllers.json", BASE_URL=base,
                 VUS=CONTROLLERS, DURATION="6s", CONNECTION_TIMEOUT_MS=CONNECTION_TIMEOUT_MS)
    try:
        deadline = time.monotonic() + 15
        while scrape(s.port).parked_now < CONTROLLERS // 2:
            assert ctl.poll() is None, ctl.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "k6 controllers never parked"
            time.sleep(0.1)
        # p95 bounds for a smoke run on a shared machine (the suite also runs
        # against the sanitizer build): behaviour is checked, not speed.
        dsp = k6_run("dispatch.js", tmp_path / "dispatch.json", DISPATCH_URL=base,
                     VUS=5, DURATION="3s", P95_MS=250, MATCH_P95_MS=250)
        d = finish(dsp, tmp_path / "dispatch.json", timeout=60)
        c = finish(ctl, tmp_path / "controllers.json", timeout=60)
    finally:
        if ctl.poll() is None:
            ctl.kill()
            ctl.wait()
    hits = d["warm_start_hits"]["count"]
    assert hits > 0, d
    # Both sides saw the same warm starts; at most one per controller can be
    # lost to the race between its own 2 s timeout and a payload in flight.
    got = c["warm_start_payloads"]["count"]
    assert hits - CONTROLLERS <= got <= hits, (got, hits)
    m = scrape(s.port)
    assert m.dispatched("hit") == hits
    assert m.settled("matched") == hits
