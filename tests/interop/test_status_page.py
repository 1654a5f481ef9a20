"""The status page in a real browser: Debian's chromium, headless, driven by
playwright-core (tests/status-page/page.mjs) over a live pilotlight with a
warm pool and a miss of every kind. What the page shows must be what
/metrics and /debug/status say, before and after it refreshes itself (no
reload), with JavaScript off too; the console stays clean; the page fits a
phone's width. The screenshots are kept (the path is printed; copied to
$PL_ARTIFACTS when set)."""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import time

import pytest

from conftest import (
    Conn, make_message, poll_headers, scrape, wait_metrics,
)

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "status-page"
CHROMIUM = ("/usr/bin/chromium", "/usr/lib/chromium/chromium")
SECRET = "tr_wdt_page_4b7e90"
BIG = str(4 << 20)  # a 900 KB run, for the miss whose polls had gone
KINDS = ("key", "token", "machine", "version", "deployment", "none")


def chromium():
    for path in CHROMIUM:
        if os.access(path, os.X_OK):
            return path
    pytest.skip("chromium is not installed (deploy/install-deps.sh --test installs it): "
                "the status page cannot be looked at in a browser")


def node_modules():
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm are not installed: playwright-core cannot drive chromium")
    if not (DRIVER / "node_modules" / "playwright-core" / "package.json").exists():
        p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=DRIVER,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"npm ci failed:\n{p.stdout}\n{p.stderr}"
    return node


# --------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------

def park(srv, deployment, version, cpu, memory, token=None):
    before = scrape(srv.port).parked_total
    c = Conn(srv.port)
    c.request("GET", "/warm-start", poll_headers(deployment=token or deployment,
                                                 version=version, cpu=cpu, memory=memory))
    srv.conns.append(c)
    wait_metrics(srv.port, lambda m: m.parked_total >= before + 1, what="the poll to park")
    return c


def dispatch(srv, deployment, version, cpu, memory, run_id):
    c = Conn(srv.port)
    try:
        c.request("POST", "/warm-start", {"Content-Type": "application/json"},
                  json.dumps({"dequeuedMessage": make_message(deployment, version, cpu,
                                                              memory, run_id=run_id)}))
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    return r.json()["didWarmStart"]


def jwt_bad(deployment, version):
    """A token with a deployment claim and a signature that cannot verify."""
    import base64

    def seg(obj):
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()
    return (seg({"alg": "HS256", "typ": "JWT"}) + "." +
            seg({"deployment": deployment, "deployment_version": version}) + ".c2lnbmF0dXJl")


def gone_before_its_run(srv, run_id):
    """delivery = confirm: the key's one poll half-closes while its run is in
    flight (a window too small for it), and nobody else can take it."""
    ctl = Conn(srv.port, rcvbuf=4096)
    ctl.request("GET", "/warm-start", poll_headers(deployment="dep_key", version="v1",
                                                   cpu=1, memory=1))
    wait_metrics(srv.port, lambda m: m.get("pilotlight_keys_now") >= 1 and
                 m.parked_now >= 1, what="the poll to park")
    msg = make_message("dep_key", "v1", 1, 1, run_id=run_id)
    msg["run"]["padding"] = "x" * 900_000
    d = Conn(srv.port)
    d.request("POST", "/warm-start", {"Content-Type": "application/json"},
              json.dumps({"dequeuedMessage": msg}))
    assert ctl.sock.recv(1, socket.MSG_PEEK)
    ctl.sock.shutdown(socket.SHUT_WR)
    assert d.read_response().json() == {"didWarmStart": False}
    ctl.close()
    d.close()


def warm_pool_and_misses(srv):
    assert dispatch(srv, "dep_first", "v1", 1, 1, "run_none") is False  # nothing parked
    gone_before_its_run(srv, "run_key")
    for _ in range(3):
        park(srv, "dep_web", "20261130.1", 1, 2)
    park(srv, "dep_web", "20261130.1", 2, 4)
    for _ in range(2):
        park(srv, "dep_worker", "v7", 0.5, 1)
    park(srv, "dep_batch", "v1", 4, 8)
    for run in ("run_w1", "run_w2"):
        assert dispatch(srv, "dep_web", "20261130.1", 1, 2, run) is True
    assert dispatch(srv, "dep_worker", "v7", 0.5, 1, "run_k1") is True
    assert dispatch(srv, "dep_web", "20261130.1", 8, 16, "run_machine") is False
    assert dispatch(srv, "dep_web", "20261201.2", 1, 2, "run_version") is False
    assert dispatch(srv, "dep_elsewhere", "v1", 1, 2, "run_deployment") is False
    t = park(srv, "dep_tok", "v3", 1, 2, token=jwt_bad("dep_tok", "v3"))
    t.close()
    wait_metrics(srv.port, lambda m: m.settled("disconnect") >= 2, what="the poll to go")
    assert dispatch(srv, "dep_tok", "v3", 1, 2, "run_token") is False


# --------------------------------------------------------------------------
# What the page shows against what pilotlight says
# --------------------------------------------------------------------------

def get_json(port, path):
    c = Conn(port)
    try:
        c.request("GET", path)
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    return r.json()


def quantile(buckets, count, q):
    """histogram_quantile() over (bound, cumulative count) pairs."""
    rank, prev, lower = q * count, 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            return lower + (bound - lower) * (rank - prev) / (cum - prev)
        prev, lower = cum, bound
    return buckets[-1][0]


def matches_pilotlight(page, port):
    """Every figure and row the page shows equals /debug/status's and, where
    /metrics has it, /metrics's."""
    j = get_json(port, "/debug/status")
    m = scrape(port)
    f = page["facts"]
    assert int(f["k:parked"]) == j["parked"] == m.parked_now
    assert int(f["k:keys"]) == j["keys"] == m.keys_now
    w = j["window"]
    assert (int(f["k:hits"]), int(f["k:misses"])) == (w["hits"], w["misses"])
    assert f["k:ratio"] == f"{w['hits'] * 100 // (w['hits'] + w['misses'])} %"
    for r, n in j["dispatches"].items():
        assert f[f"r:{r}"] == f"{r} {n}" and n == m.dispatched(r), (r, n)
    for k in KINDS:
        n = m.get("pilotlight_dispatch_miss_total", nearest=k)
        assert f[f"n:{k}"] == f"{k} {int(n)}" and j["misses_by_nearest"][k] == n, k
    bounds = sorted((float(ls[0][1]), v) for (name, ls), v in m.samples.items()
                    if name == "pilotlight_dispatch_duration_seconds_bucket"
                    and ls[0][1] != "+Inf")
    count = m.get("pilotlight_dispatch_duration_seconds_count")
    q = j["answer_us"]
    for key, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert abs(q[key] - quantile(bounds, count, p) * 1e6) <= 1, (key, q)
    assert f["k:answer"] == f"{q['p50']} / {q['p90']} / {q['p99']} µs"
    assert page["health"] == j["health"]
    assert [(r["dep"], r["ver"], float(r["cpu"]), float(r["mem"]), int(r["parked"]),
             int(r["hits"]), int(r["misses"])) for r in page["pool"]] == \
        [(k["deployment"], k["version"], k["cpu"], k["memory"], k["parked"], k["hits"],
          k["misses"]) for k in j["pool"]]
    assert [(r["dep"], r["answer"]) for r in page["matches"]] == \
        [(e["deployment"], "true (hit)") for e in j["matches"]]
    assert [(r["run"], r["nearest"], r["why"]) for r in page["misses"]] == \
        [(e["run"], e["nearest"] or "–", e["why"]) for e in j["misses"]]
    return j


def test_status_page_in_chromium(start_server, tmp_path):
    browser = chromium()
    node = node_modules()
    srv = start_server("--delivery", "confirm", "--confirm-timeout-ms", "5000",
                       "--max-body-bytes", BIG, "--token-mode", "log",
                       env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    warm_pool_and_misses(srv)
    t0 = time.monotonic()
    drv = subprocess.Popen([node, str(DRIVER / "page.mjs"), f"http://127.0.0.1:{srv.port}/status",
                            browser, str(tmp_path)], cwd=DRIVER, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def step(want):
            line = drv.stdout.readline()
            assert line, f"page.mjs ended early:\n{drv.stderr.read()[-3000:]}"
            out = json.loads(line)
            assert out["step"] == want, out
            return out

        seen = step("seen")["page"]
        j = matches_pilotlight(seen, srv.port)
        assert [m["nearest"] for m in j["misses"]] == \
            ["token", "deployment", "version", "machine", "key", "none"]
        assert seen["misses"][2]["why"] == ("2 controllers are parked for this deployment on "
                                            "version 20261130.1; the run is 20261201.2")
        assert seen["live"].startswith("live")
        # one more warm start; the page shows it without a reload
        park(srv, "dep_worker", "v7", 0.5, 1)
        assert dispatch(srv, "dep_worker", "v7", 0.5, 1, "run_k2") is True
        hits = get_json(srv.port, "/debug/status")["window"]["hits"]
        assert hits == j["window"]["hits"] + 1
        drv.stdin.write(json.dumps({"hits": hits}) + "\n")
        drv.stdin.flush()
        updated = step("updated")["page"]
        assert updated["marker"] == "first load", "the page reloaded"
        assert updated["refreshed"] >= 1
        matches_pilotlight(updated, srv.port)
        drv.stdin.write("next\n")
        drv.stdin.flush()
        nojs = step("nojs")
        assert nojs["phone_overflow"] <= 0, "the page is wider than a phone"
        assert nojs["page"]["live"] == "live updates need JavaScript; reload to refresh"
        matches_pilotlight(nojs["page"], srv.port)
        done = step("done")
        assert done["errors"] == [], done["errors"]
    finally:
        drv.stdin.close()
        try:
            drv.wait(30)
        except subprocess.TimeoutExpired:
            drv.kill()
            drv.wait()
    assert drv.returncode == 0, drv.stderr.read()[-3000:]
    assert time.monotonic() - t0 < 60
    for shot in done["screenshots"]:
        assert pathlib.Path(shot).stat().st_size > 10_000, shot
        print(f"screenshot: {shot}")
        if os.environ.get("PL_ARTIFACTS"):
            dest = pathlib.Path(os.environ["PL_ARTIFACTS"])
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, dest / pathlib.Path(shot).name)
            print(f"screenshot: {dest / pathlib.Path(shot).name}")
