"""pilotlight's metrics, alert rules and dashboard, checked by the real
Prometheus tools (Debian's prometheus package): promtool lints the live
/metrics output under load, after it and while draining; promtool checks and
unit-tests the alert rules; and a real Prometheus server scrapes pilotlight
(a key ring of one, so the ring's series are served too) under pl-loadgen
traffic, then evaluates every dashboard query and every alert expression
through its HTTP API."""

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from conftest import HOST, REPO_ROOT, free_port, get, loadgen

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "pilotlight.json"

# What Grafana would put in place of its own variables.
GRAFANA_VARS = {"$__rate_interval": "1m", "$instance": ".*"}


def need(path):
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} not found: deploy/install-deps.sh --test installs prometheus")


def lint(text):
    """promtool check metrics on <text>; returns its complaints."""
    need(PROMTOOL)
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=30)
    return p.returncode, (p.stdout + p.stderr).strip()


def assert_lints_clean(port, when):
    r = get(port, "/metrics")
    assert r.status == 200, r
    rc, out = lint(r.body.decode())
    assert rc == 0 and out == "", f"promtool check metrics {when}:\n{out}"


def test_promtool_finds_a_bad_exposition():
    """The lint can fail: a counter without _total and a missing HELP."""
    rc, out = lint("# TYPE pilotlight_things counter\npilotlight_things 1\n")
    assert rc != 0 and "pilotlight_things" in out, (rc, out)


def test_metrics_lint_under_load_after_it_and_while_draining(start_server):
    s = start_server("--drain-delay-ms", "3000")
    result = {}
    t = threading.Thread(target=lambda: result.update(recs=loadgen(
        s, "--controllers", "40", "--dispatchers", "4", "--keys", "8",
        "--duration", "1.5", "--warmup", "0.2", "cycle")[0]))
    t.start()
    time.sleep(0.8)
    m = s.metrics()
    assert m.parked_now > 0 and m.dispatched("hit") > 0, m.text
    assert_lints_clean(s.port, "under load")
    t.join(60)
    assert result["recs"][0]["hits"] > 0
    s.wait_parked(0)
    assert_lints_clean(s.port, "after the load")
    s.sigterm()
    s.wait_metrics(lambda m: True)  # still answering during drain_delay_ms
    assert s.get("/readyz").status == 503
    assert_lints_clean(s.port, "while draining")


def test_alert_rules_check_and_unit_tests():
    need(PROMTOOL)
    p = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def alert_rules():
    import yaml
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_alert_has_a_unit_test_and_a_runbook():
    import yaml
    with open(RULE_TESTS) as f:
        tests = yaml.safe_load(f)["tests"]
    tested = {a["alertname"] for t in tests for a in t["alert_rule_test"]
              if a.get("exp_alerts")}
    for rule in alert_rules():
        assert rule["alert"] in tested, f"{rule['alert']} never shown firing in {RULE_TESTS.name}"
        assert rule["annotations"].get("runbook"), f"{rule['alert']} has no runbook line"


def dashboard_queries():
    with open(DASHBOARD) as f:
        dash = json.load(f)
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, f"panel {panel['title']!r}: unknown variable in {expr}"
            out.append((panel["title"], expr))
    return dash, out


def test_dashboard_is_importable():
    dash, queries = dashboard_queries()
    assert dash["uid"] and dash["title"] and len(queries) >= 15
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "instance"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]


class Prometheus:
    def __init__(self, target_port, tmp):
        need(PROMETHEUS)
        self.port = free_port()
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files:\n  - {RULES}\n"
            "scrape_configs:\n  - job_name: pilotlight\n"
            f"    static_configs:\n      - targets: ['{HOST}:{target_port}']\n")
        self.log = open(Path(tmp) / "prometheus.log", "w+")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={cfg}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address={HOST}:{self.port}", "--log.level=warn"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not self._ready():
            assert self.proc.poll() is None, f"prometheus exited:\n{self.logs()}"
            assert time.monotonic() < deadline, f"prometheus not ready:\n{self.logs()}"
            time.sleep(0.1)

    def logs(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def _ready(self):
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.port}/-/ready", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path, **params):
        url = f"http://{HOST}:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:  # 400 with the parse error
            return json.load(e)

    def query(self, expr):
        return self.api("query", query=expr)

    def wait(self, expr, timeout=15):
        deadline = time.monotonic() + timeout
        while True:
            r = self.query(expr)
            if r["status"] == "success" and r["data"]["result"]:
                return r
            assert time.monotonic() < deadline, f"no result for {expr}: {r}"
            time.sleep(0.25)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus_for():
    started, tmp = [], tempfile.mkdtemp(prefix="pl-prometheus-")

    def start(port):
        p = Prometheus(port, tmp)
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def test_prometheus_evaluates_every_dashboard_query_and_alert(start_server, prometheus_for):
    # A ring of one, so that the key ring's series (served only with a ring)
    # are there for its panels and alerts; it serves every key itself.
    port = free_port()
    me = f"{HOST}:{port}"
    server = start_server("--listen", me, "--ring-peers", me, "--ring-self", me)
    server.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 1, what="the ring of one")
    prom = prometheus_for(server.port)
    prom.wait('up{job="pilotlight"} == 1')
    recs, _ = loadgen(server, "--controllers", "60", "--dispatchers", "6", "--keys", "12",
                      "--duration", "3", "--warmup", "0.3", "cycle")
    assert recs[0]["hits"] > 0
    # Scrapes from during the load and one after it.
    prom.wait('count_over_time(pilotlight_parked_now{job="pilotlight"}[1m]) >= 5')
    prom.wait('increase(pilotlight_dispatch_total{result="hit"}[1m]) > 0')

    _, queries = dashboard_queries()
    empty, broken = [], []
    for title, expr in queries:
        r = prom.query(expr)
        if r["status"] != "success":
            broken.append((title, expr, r.get("error")))
        elif not r["data"]["result"]:
            empty.append((title, expr))
    assert not broken, f"dashboard queries Prometheus rejects: {broken}"
    assert not empty, f"dashboard queries with no series: {empty}"

    for rule in alert_rules():
        r = prom.query(rule["expr"])
        assert r["status"] == "success", (rule["alert"], r.get("error"))
    # A healthy broker under load trips none of them (loop lag aside: a
    # sanitizer build on a busy machine may well be late).
    firing = [r["alert"] for r in alert_rules()
              if r["alert"] != "PilotlightEventLoopLag" and prom.query(r["expr"])["data"]["result"]]
    assert not firing, f"alerts true on a healthy server: {firing}"

    # Prometheus loaded the rule file and evaluates it without errors.
    groups = prom.api("rules")["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in alert_rules()}
    for name, r in loaded.items():
        assert r["health"] == "ok", (name, r["health"], r.get("lastError"))
