"""The status page (GET /status) and its JSON (GET /debug/status): every
kind of miss named by what was parked nearest its key, in
pilotlight_dispatch_miss_total{nearest}, in the JSON and in the page's own
words; the page as a reader without JavaScript gets it, escaped, well formed;
who may see it (the rules of /debug/waiters)."""

import base64
import hashlib
import hmac
import html.parser
import json
import socket
import time

from conftest import Conn, make_message, poll_headers
from test_confirm_lifecycle import pending_delivery
from test_faults import BIG_BODY_LIMIT
from test_identity import assert_json_error, dispatch_port_of

SECRET = "tr_wdt_status_8c1f2e"
DISPATCH_TOKEN = "dtok_status_51aa0c"
KINDS = ("key", "token", "machine", "version", "deployment", "none")
VOID = {"meta", "link", "br", "img", "input", "hr", "wbr", "source", "col", "area", "base"}


# --------------------------------------------------------------------------
# Reading the page as a browser without JavaScript would
# --------------------------------------------------------------------------

class Page(html.parser.HTMLParser):
    """The page's structure: every element closed in order (else
    .errors), the summary's figures (data-k, data-r, data-n), and the rows
    of each table by the id of the block holding it, as {cell class:
    text}."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.scripts = [], [], 0
        self.facts, self.tables, self.health = {}, {}, None
        self.block = self.row = self.cell = self.fact = None
        self.text = []
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"left open: {self.stack}")

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "div" and a.get("id"):
            self.block = a["id"]
        if tag == "p" and "health" in (a.get("class") or "").split():
            self.health = {"state": a["class"].split()[1], "text": ""}
            self.fact = ("health",)
        for k in ("data-k", "data-r", "data-n"):
            if k in a:
                self.fact = (k, a[k])
                self.facts[self.fact] = ""
        if tag == "tr":
            self.row = {}
        if tag == "td" and self.row is not None:
            self.cell = a.get("class", "")
            self.row[self.cell] = ""

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
        if tag == "tr" and self.row:
            self.tables.setdefault(self.block, []).append(self.row)
            self.row = None
        if tag in ("td",):
            self.cell = None
        if tag in ("dd", "span", "p"):
            self.fact = None

    def handle_data(self, data):
        self.text.append(data)
        if self.cell is not None and self.row is not None:
            self.row[self.cell] += data
        if self.fact == ("health",):
            self.health["text"] += data
        elif self.fact is not None:
            self.facts[self.fact] += data

    def rows(self, block):
        return [r for r in self.tables.get(block, []) if "none" not in r]


def fetch_page(port, headers=None):
    c = Conn(port)
    try:
        c.request("GET", "/status", headers)
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    assert r.headers["content-type"] == "text/html; charset=utf-8", r
    assert r.headers.get("cache-control") == "no-store", r
    csp = r.headers.get("content-security-policy", "")
    assert "default-src 'none'" in csp and "script-src 'sha256-" in csp, csp
    text = r.body.decode("utf-8")
    p = Page(text)
    assert not p.errors, p.errors
    assert p.scripts == 1
    return p, text


def get_on(port, path, headers=None):
    c = Conn(port)
    try:
        c.request("GET", path, headers)
        return c.read_response()
    finally:
        c.close()


def status(port, headers=None):
    c = Conn(port)
    try:
        c.request("GET", "/debug/status", headers)
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    assert r.headers["content-type"] == "application/json", r
    return r.json()


def metrics_text(port):
    c = Conn(port)
    try:
        c.request("GET", "/metrics")
        return c.read_response().body.decode()
    finally:
        c.close()


def misses_by_nearest(port):
    out = {}
    for kind in KINDS:
        line = f'pilotlight_dispatch_miss_total{{nearest="{kind}"}} '
        out[kind] = int(next(ln for ln in metrics_text(port).splitlines()
                             if ln.startswith(line)).split()[-1])
    return out


def dispatch_on(port, deployment, version="v1", cpu=1, memory=2, run_id="run_status",
                headers=None):
    c = Conn(port)
    try:
        body = json.dumps({"dequeuedMessage": make_message(deployment, version, cpu, memory,
                                                           run_id=run_id)})
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", "/warm-start", h, body)
        r = c.read_response()
    finally:
        c.close()
    assert r.status == 200, r
    return r.json()["didWarmStart"]


def park(srv, deployment, version="v1", cpu=1, memory=2, port=None, token=None):
    """A poll parked on <srv> (or on <port>, its controllers' side)."""
    before = srv.metrics().parked_total
    c = Conn(port or srv.port)
    c.request("GET", "/warm-start", poll_headers(deployment=token or deployment,
                                                 version=version, cpu=cpu, memory=memory))
    srv.conns.append(c)
    srv.wait_metrics(lambda m: m.parked_total >= before + 1, what="the poll to park")
    return c


def jwt(deployment, version, secret):
    """A deployment token as Trigger.dev mints them, signed with <secret>."""
    def b64(obj):
        raw = json.dumps(obj, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    claims = {"ver": 1, "deployment": deployment, "deployment_version": version,
              "environment_id": "env_1", "environment_type": "PRODUCTION", "org_id": "org_1",
              "project_id": "proj_1", "iss": "https://id.trigger.dev",
              "aud": "https://api.trigger.dev", "exp": int(time.time()) + 3600}
    head = b64({"alg": "HS256", "typ": "JWT"}) + "." + b64(claims)
    sig = hmac.new(secret.encode(), head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(sig).rstrip(b"=").decode()


def newest_miss(port, kind, words, run_id):
    """The newest miss, as /metrics, /debug/status and /status tell it: its
    nearest is <kind> and its words hold each of <words>."""
    j = status(port)
    m = j["misses"][0]
    assert m["result"] == "miss" and m["answer"] is False, m
    assert m["nearest"] == kind, m
    assert m["run"] == run_id, m
    for w in words:
        assert w in m["why"], (w, m["why"])
    assert j["misses_by_nearest"] == misses_by_nearest(port)
    p, _ = fetch_page(port)
    row = p.rows("misses")[0]
    assert row["nearest"] == kind and row["run"] == run_id, row
    assert row["why"] == m["why"], (row, m)
    assert row["answer"] == "false (miss)", row
    for k in KINDS:
        assert p.facts[("data-n", k)] == f"{k} {j['misses_by_nearest'][k]}"
    return m


# --------------------------------------------------------------------------
# Each kind of miss
# --------------------------------------------------------------------------

def test_nothing_parked(start_server):
    s = start_server()
    assert dispatch_on(s.port, "dep_alone", run_id="run_none") is False
    newest_miss(s.port, "none", ["no controller was parked on this instance at all"], "run_none")
    assert misses_by_nearest(s.port) == dict.fromkeys(KINDS, 0) | {"none": 1}


def test_nothing_for_the_deployment(start_server):
    s = start_server()
    park(s, "dep_other")
    park(s, "dep_third", cpu=2)
    assert dispatch_on(s.port, "dep_asked", run_id="run_dep") is False
    newest_miss(s.port, "deployment",
                ["nothing is parked for this deployment; 2 controllers are parked for "
                 "others"], "run_dep")


def test_another_version(start_server):
    s = start_server()
    for _ in range(3):
        park(s, "dep_v", version="20261130.1")
    park(s, "dep_v", version="20261129.4", cpu=2)
    assert dispatch_on(s.port, "dep_v", version="20261201.2", run_id="run_ver") is False
    m = newest_miss(s.port, "version",
                    ["3 controllers are parked for this deployment on version 20261130.1; "
                     "the run is 20261201.2 (4 for this deployment in all)"], "run_ver")
    assert m["nearest_key"] == {"deployment": "dep_v", "version": "20261130.1", "cpu": 1,
                                "memory": 2, "parked": 3}


def test_another_machine(start_server):
    s = start_server()
    park(s, "dep_m", cpu=0.5, memory=1)
    park(s, "dep_m", cpu=0.5, memory=1)
    park(s, "dep_m", version="v0", cpu=2, memory=4)
    assert dispatch_on(s.port, "dep_m", cpu=2, memory=4, run_id="run_mach") is False
    m = newest_miss(s.port, "machine",
                    ["2 controllers are parked for this deployment and version on 0.5 vCPU, "
                     "1 GB; the run needs 2 vCPU, 4 GB"], "run_mach")
    assert m["nearest_key"]["cpu"] == 0.5 and m["nearest_key"]["parked"] == 2


def test_a_refused_token(start_server):
    """token_mode = enforce: a poll for the deployment whose token did not
    verify is what a miss of that deployment names, even with another
    version of it parked when the refused poll asked for the run's key."""
    s = start_server("--token-mode", "enforce", env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    c = Conn(s.port)
    c.request("GET", "/warm-start", poll_headers(deployment=jwt("dep_tok", "v1", "not-it"),
                                                 version="v1", cpu=1, memory=2))
    assert c.read_response().status == 401
    c.close()
    park(s, "dep_tok", version="v0", token=jwt("dep_tok", "v0", SECRET))
    assert dispatch_on(s.port, "dep_tok", run_id="run_tok") is False
    newest_miss(s.port, "token", ["a poll for this deployment came with an invalid deployment "
                                  "token", "refused 401 (token_mode = enforce)",
                                  "WORKLOAD_TOKEN_SECRET"], "run_tok")
    # a bare id where a token is required, for a deployment nothing else of
    c = Conn(s.port)
    c.request("GET", "/warm-start", poll_headers(deployment="dep_bare", version="v7"))
    assert c.read_response().status == 401
    c.close()
    assert dispatch_on(s.port, "dep_bare", version="v8", run_id="run_bare") is False
    newest_miss(s.port, "token", ["(version v7) came with a bare deployment id where a signed "
                                  "token is required"], "run_bare")
    # a version of the deployment parked validly, the refused poll for
    # another one: the parked version is nearer
    assert dispatch_on(s.port, "dep_tok", version="v5", run_id="run_v5") is False
    newest_miss(s.port, "version", ["on version v0; the run is v5"], "run_v5")


def test_an_invalid_token_logged(start_server):
    """token_mode = log: the poll parked under its claim all the same; gone
    since, it is what a miss for its deployment names."""
    s = start_server("--token-mode", "log", env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    c = park(s, "dep_log", token=jwt("dep_log", "v1", "not-it"))
    c.close()
    s.wait_parked(0)
    assert dispatch_on(s.port, "dep_log", run_id="run_log") is False
    newest_miss(s.port, "token", ["came with an invalid deployment token",
                                  "token_mode = log"], "run_log")


def test_the_keys_own_polls_had_gone(start_server):
    """delivery = confirm: the one poll of the key half-closed while its run
    was in flight; nobody else could take it."""
    s = start_server("--delivery", "confirm", "--confirm-timeout-ms", "5000",
                     "--max-body-bytes", BIG_BODY_LIMIT)
    ctl, d, _ = pending_delivery(s, "run_gone")
    ctl.sock.shutdown(socket.SHUT_WR)
    r = d.read_response()
    assert r.json() == {"didWarmStart": False}, r
    ctl.close()
    d.close()
    newest_miss(s.port, "key", ["controllers were parked for this very key, but none could "
                                "take the run"], "run_gone")


# --------------------------------------------------------------------------
# The page without JavaScript, and the JSON
# --------------------------------------------------------------------------

def test_page_shows_what_the_json_and_metrics_say(start_server):
    s = start_server()
    for _ in range(2):
        park(s, "dep_pool", cpu=1, memory=2)
    park(s, "dep_pool", version="v2", cpu=1, memory=2)
    w = park(s, "dep_hit", cpu=4, memory=8)
    assert dispatch_on(s.port, "dep_hit", cpu=4, memory=8, run_id="run_h") is True
    w.read_response()
    assert dispatch_on(s.port, "dep_pool", version="v3", run_id="run_m") is False
    j = status(s.port)
    p, text = fetch_page(s.port)
    m = s.metrics()

    assert j["parked"] == m.parked_now == 3 and j["keys"] == m.keys_now == 2
    assert j["dispatches"] == {r: int(m.dispatched(r)) for r in j["dispatches"]}
    assert j["window"]["hits"] == 1 and j["window"]["misses"] == 1
    assert j["health"]["state"] == "ok", j["health"]
    assert j["health"]["text"].startswith("Warm starts are happening: 1 of 2 dispatches")
    # the page, rendered by the server: the same figures and words
    assert p.health == j["health"]
    facts = {k[1]: v for k, v in p.facts.items() if k[0] == "data-k"}
    assert facts["parked"] == "3" and facts["keys"] == "2"
    assert facts["hits"] == "1" and facts["misses"] == "1" and facts["ratio"] == "50 %"
    q = j["answer_us"]
    assert facts["answer"] == f"{q['p50']} / {q['p90']} / {q['p99']} µs"
    for r, n in j["dispatches"].items():
        assert p.facts[("data-r", r)] == f"{r} {n}"
    # every row of the pool, parked or dispatched to, as the JSON has it
    rows = p.rows("pool")
    assert len(rows) == len(j["pool"]) == 4
    for row, k in zip(rows, j["pool"]):
        assert (row["dep"], row["ver"], float(row["cpu"]), float(row["mem"])) == \
            (k["deployment"], k["version"], k["cpu"], k["memory"])
        assert int(row["parked"]) == k["parked"]
        assert (int(row["hits"]), int(row["misses"])) == (k["hits"], k["misses"])
    assert [(k["deployment"], k["version"], k["parked"]) for k in j["pool"]] == [
        ("dep_pool", "v1", 2), ("dep_pool", "v2", 1), ("dep_hit", "v1", 0),
        ("dep_pool", "v3", 0)]
    hit_row = next(k for k in j["pool"] if k["deployment"] == "dep_hit")
    assert hit_row["hits"] == 1 and hit_row["hit_ratio"] == 1
    assert hit_row["minutes"]["hits"][-1] == 1 and len(hit_row["minutes"]["hits"]) == 10
    # the last match and miss
    match = j["matches"][0]
    assert match["deployment"] == "dep_hit" and match["answer"] is True
    assert "run" not in match and match["waited_ms"] >= 0
    [mrow] = p.rows("matches")
    assert mrow["dep"] == "dep_hit" and mrow["answer"] == "true (hit)"
    assert p.rows("misses")[0]["run"] == "run_m"
    # what the JSON holds, all of it documented (docs/protocol.md)
    assert set(j) == {"version", "time", "draining", "health", "parked", "keys", "window",
                      "answer_us", "dispatches", "misses_by_nearest", "tokens", "pool",
                      "pool_truncated", "matches", "misses", "ring"}
    assert j["ring"] is None and p.rows("ring") == []
    assert "no key ring" in text


def test_hostile_strings_are_escaped(start_server):
    s = start_server()
    evil = "dep<script>alert(\"x\")</script>&'"
    park(s, evil)
    assert dispatch_on(s.port, evil, version="v<b>2</b>", run_id="run_<img src=x onerror=y>") \
        is False
    p, text = fetch_page(s.port)
    assert "<script>alert" not in text and "<img" not in text and "<b>2" not in text
    assert "dep&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;" in text
    row = p.rows("misses")[0]
    assert row["dep"] == evil and row["ver"] == "v<b>2</b>"
    assert row["run"] == "run_<img src=x onerror=y>"
    assert "on version v1; the run is v<b>2</b>" in row["why"]
    j = status(s.port)
    assert j["misses"][0]["deployment"] == evil and j["pool"][0]["deployment"] == evil


def test_health_line_says_what_is_missing(start_server):
    s = start_server()
    j = status(s.port)
    assert j["health"]["state"] == "warn"
    assert "TRIGGER_WARM_START_URL" in j["health"]["text"]
    park(s, "dep_h")
    j = status(s.port)
    assert "no dispatch has arrived" in j["health"]["text"]
    assert "TRIGGER_WARM_START_DISPATCH_URL" in j["health"]["text"]
    assert dispatch_on(s.port, "dep_elsewhere", run_id="run_x") is False
    j = status(s.port)
    assert j["health"]["state"] == "bad"
    assert j["health"]["text"].startswith("Every dispatch in the last 10 minutes missed (1); "
                                          "the last because nothing is parked for this "
                                          "deployment")
    e = start_server("--token-mode", "enforce", env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    c = Conn(e.port)
    c.request("GET", "/warm-start", poll_headers(deployment=jwt("dep_e", "v1", "nope"),
                                                 version="v1"))
    assert c.read_response().status == 401
    c.close()
    j = status(e.port)
    assert j["health"]["state"] == "bad" and "refused 401" in j["health"]["text"]
    assert "token_secret" in j["health"]["text"]


def test_a_cut_run_id_and_the_last_misses_kept(start_server):
    s = start_server()
    long_id = "run_" + "é" * 40  # 84 bytes: cut at a character's end
    assert dispatch_on(s.port, "dep_c", run_id=long_id) is False
    m = status(s.port)["misses"][0]
    assert m["run_cut"] is True and long_id.startswith(m["run"]) and len(m["run"]) < len(long_id)
    assert len(m["run"].encode()) <= 64
    for i in range(20):
        assert dispatch_on(s.port, f"dep_{i}", run_id=f"run_{i}") is False
    j = status(s.port)
    assert [m["run"] for m in j["misses"]] == [f"run_{i}" for i in range(19, 3, -1)]
    assert j["window"]["misses"] == 21


def test_ring_members_and_their_state(start_server):
    """A key ring of two on one host: the other member down (nothing
    listens there yet), then up."""
    from test_ring import RING_FLAGS, free_port_on
    pa, pb = free_port_on(["127.0.0.1"]), None
    while pb is None or pb == pa:
        pb = free_port_on(["127.0.0.1"])
    names = [f"127.0.0.1:{pa}", f"127.0.0.1:{pb}"]

    def args(i):
        return ["--listen", names[i], "--ring-peers", ",".join(names), "--ring-self", names[i],
                *RING_FLAGS]
    a = start_server(*args(0))
    assert a.port == pa
    j = status(pa)
    assert j["ring"]["members"] == 1
    assert {(p["name"], p["state"]) for p in j["ring"]["peers"]} == \
        {(names[0], "self"), (names[1], "down")}
    b = start_server(*args(1))
    a.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 2, what="the ring of two")
    j = status(pa)
    assert {(p["name"], p["state"], p["failed_checks"]) for p in j["ring"]["peers"]} == \
        {(names[0], "self", 0), (names[1], "up", 0)}
    p, text = fetch_page(pa)
    assert "2 members in this instance's view" in text
    assert {(r["name"], r["state"]) for r in p.rows("ring")} == \
        {(names[0], "self"), (names[1], "up")}
    b.stop()
    a.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 1, what="the ring of one")
    assert {(r["name"], r["state"]) for r in fetch_page(pa)[0].rows("ring")} == \
        {(names[0], "self"), (names[1], "down")}


# --------------------------------------------------------------------------
# Who may see it
# --------------------------------------------------------------------------

def test_served_where_metrics_is(start_server):
    s = start_server("--dispatch-listen", "127.0.0.1:0")
    dport = dispatch_port_of(s)
    for path in ("/status", "/debug/status"):
        assert_json_error(get_on(s.port, path), 403)
        assert get_on(dport, path).status == 200
    p, _ = fetch_page(dport)
    assert p.health["state"] == "warn"
    s.port = dport  # the teardown's ledger check reads /metrics there


def test_served_to_the_addresses_dispatch_allow_names(start_server):
    from test_access import from_address
    from conftest import build_request
    s = start_server("--dispatch-allow", "127.0.0.1/32", "--listen", "0.0.0.0:0")
    for path in ("/status", "/debug/status"):
        r = from_address(s.port, "127.0.0.2", build_request("GET", path)).read_response()
        assert r.status == 403 and "dispatch_allow" in r.json()["error"], (path, r)
        r = from_address(s.port, "127.0.0.1", build_request("GET", path)).read_response()
        assert r.status == 200, (path, r)


def test_warm_starts_off_says_so(start_server):
    s = start_server("--warm-starts", "off")
    assert dispatch_on(s.port, "dep_off", run_id="run_off") is False
    j = status(s.port)
    assert j["health"]["text"].startswith("Warm starts are off (warm_starts = off)")
    assert j["dispatches"]["off"] == 1 and j["window"]["misses"] == 0 and j["misses"] == []
    p, _ = fetch_page(s.port)
    assert p.facts[("data-r", "off")] == "off 1"


def test_needs_the_bearer_token_when_one_is_set(start_server):
    s = start_server("--dispatch-token", DISPATCH_TOKEN)
    for path in ("/status", "/debug/status"):
        r = get_on(s.port, path)
        assert_json_error(r, 401)
        assert r.headers.get("www-authenticate", "").split()[0] == "Bearer"
        r = get_on(s.port, path, {"Authorization": "Bearer wrong"})
        assert_json_error(r, 401)
    auth = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    assert status(s.port, auth)["health"]["state"] == "warn"
    fetch_page(s.port, auth)
    m = s.metrics()
    assert m.get("pilotlight_http_requests_total", route="status", **{"class": "4xx"}) == 4
    assert m.get("pilotlight_http_requests_total", route="status", **{"class": "2xx"}) == 2
