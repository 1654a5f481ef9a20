"""What pilotlight answers on each endpoint (docs/protocol.md), case by case."""

import json
import os
import signal
import time

from conftest import (EXAMPLE, assert_ledger, make_message, poll_headers,
                      read_payload, scrape, wait_stopped)


def error_of(resp):
    """The "error" string of a JSON error response."""
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), str), resp
    return body["error"]


# -- GET /connect ------------------------------------------------------------

def test_connect_reports_configured_values(start_server):
    s = start_server("--connection-timeout-ms", "12345", "--keepalive-ms", "67890")
    r = s.get("/connect")
    assert r.status == 200, r
    assert r.json() == {"connectionTimeoutMs": 12345, "keepaliveMs": 67890}


def test_connect_reports_defaults(server):
    r = server.get("/connect")
    assert r.status == 200, r
    assert r.json() == {"connectionTimeoutMs": 30000, "keepaliveMs": 300000}


# -- matched poll --------------------------------------------------------------

def test_matched_poll_gets_exact_dequeued_message(server):
    c = server.park()
    assert server.dispatch(EXAMPLE) is True
    r = c.read_response()
    assert r.status == 200, r
    assert r.headers["content-type"].split(";")[0].strip().lower() == "application/json"
    assert json.loads(r.body) == EXAMPLE
    m = assert_ledger(server.metrics())
    assert m.settled("matched") == 1
    assert m.dispatched("hit") == 1
    assert m.parked_now == 0 and m.keys_now == 0


def test_matched_poll_with_unicode_and_escapes(server):
    msg = make_message(run_id="run_\u00e9\u4e2d\"quote\"\\back\n")
    msg["run"]["annotations"]["emoji"] = "\U0001F680"
    c = server.park()
    assert server.dispatch(msg) is True
    assert read_payload(c) == msg


# -- park timeout ---------------------------------------------------------------

def test_park_timeout_answers_204_without_body(start_server):
    s = start_server("--park-timeout-ms", "300", "--connection-timeout-ms", "250")
    t0 = time.monotonic()
    c = s.park()
    r = c.read_response(timeout=5)
    elapsed = time.monotonic() - t0
    assert r.status == 204, r
    assert "content-length" not in r.headers or r.headers["content-length"] == "0", r
    assert "transfer-encoding" not in r.headers, r
    assert 0.25 <= elapsed < 3.0, f"204 after {elapsed:.3f}s, park timeout 300 ms"
    # No body bytes may follow the 204 on that connection.
    assert c.buf == b""
    assert c.silent_for(0.2) or (c.eof and c.buf == b""), c.buf
    m = assert_ledger(s.metrics())
    assert m.settled("timeout") == 1
    assert m.parked_now == 0
    # And the timed-out poll is gone: a dispatch finds nobody.
    assert s.dispatch() is False


# -- disconnect while parked -----------------------------------------------------

def test_disconnect_while_parked_is_recorded_and_dispatch_misses(server):
    c = server.park()
    server.wait_parked(1)
    c.close()
    m = server.wait_metrics(lambda m: m.parked_now == 0, what="parked_now == 0")
    assert m.settled("disconnect") == 1
    assert m.keys_now == 0
    assert server.dispatch() is False
    m = assert_ledger(server.metrics())
    assert m.settled("matched") == 0
    assert m.dispatched("miss") == 1


# -- replaced --------------------------------------------------------------------

def test_same_controller_parking_again_replaces_older_poll(server):
    old = server.park(controller_id="controller_same")
    new = server.park(controller_id="controller_same")
    r = old.read_response()
    assert r.status == 409, r
    m = assert_ledger(server.metrics())
    assert m.settled("replaced") == 1
    assert m.parked_now == 1
    msg = make_message(run_id="run_after_replace")
    assert server.dispatch(msg) is True
    assert read_payload(new) == msg
    # Only one waiter was left: a second dispatch misses.
    assert server.dispatch() is False


def test_replacement_chain(server):
    polls = [server.park(controller_id="controller_chain") for _ in range(4)]
    for p in polls[:3]:
        assert p.read_response().status == 409
    m = assert_ledger(server.metrics())
    assert m.settled("replaced") == 3 and m.parked_now == 1
    assert server.dispatch() is True
    assert read_payload(polls[3]) == EXAMPLE


def test_other_controller_ids_do_not_replace(server):
    a = server.park(controller_id="controller_a")
    b = server.park(controller_id="controller_b")
    server.wait_parked(2)
    assert a.silent_for(0.1) and b.silent_for(0.1)
    assert server.metrics().settled("replaced") == 0


def test_hung_up_poll_read_after_its_repoll_is_a_disconnect(server):
    """A controller that gives up its poll (closes it) and polls again on a
    connection it holds already (Trigger.dev's client does) may be read in
    the other order: the new poll first. The older poll was given up, not
    replaced: it counts as a disconnect and no 409 is written. The server is
    stopped while both arrive, so it reads the new poll first."""
    old = server.park(controller_id="controller_gone")
    spare = server.conn()
    scrape(server.port, conn=spare)  # accepted, idle, watched
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_stopped(pid)
        spare.request("GET", "/warm-start", poll_headers(controller_id="controller_gone"))
        old.close()
    finally:
        os.kill(pid, signal.SIGCONT)
    m = server.wait_metrics(lambda m: m.parked_total == 2 and m.parked_now == 1,
                            what="the second poll parked, the first settled")
    assert_ledger(m)
    assert (m.settled("disconnect"), m.settled("replaced")) == (1, 0), m.text
    assert server.dispatch() is True
    assert read_payload(spare) == EXAMPLE


# -- caps -------------------------------------------------------------------------

def test_per_key_cap_answers_503_json(start_server):
    s = start_server("--max-waiters-per-key", "2")
    s.park(controller_id="c1")
    s.park(controller_id="c2")
    third = s.park(controller_id="c3")
    r = third.read_response()
    assert r.status == 503, r
    error_of(r)
    # Another key still has room.
    other = s.park(controller_id="c4", deployment="deployment_other")
    m = s.wait_parked(3)
    assert other.silent_for(0.1)
    assert m.settled("rejected") == 1
    assert_ledger(m)
    # The two first ones are still parked and matchable.
    assert s.dispatch() is True
    assert s.dispatch() is True
    assert s.dispatch() is False


def test_global_cap_answers_503_json(start_server):
    s = start_server("--max-waiters", "3")
    for i in range(3):
        s.park(deployment=f"deployment_g{i}")
    fourth = s.park(deployment="deployment_g3")
    r = fourth.read_response()
    assert r.status == 503, r
    error_of(r)
    m = assert_ledger(s.metrics())
    assert m.parked_now == 3 and m.settled("rejected") == 1
    # A freed slot can be used again.
    assert s.dispatch(make_message(deployment="deployment_g0")) is True
    s.wait_parked(2)
    again = s.park(deployment="deployment_g3")
    s.wait_parked(3)
    assert again.silent_for(0.1)


# -- health, readiness, routing ----------------------------------------------------

def test_healthz_and_readyz(server):
    assert server.get("/healthz").status == 200
    assert server.get("/readyz").status == 200


def test_unknown_path_404(server):
    r = server.get("/nope")
    assert r.status == 404, r
    r = server.get("/warm-start/extra")
    assert r.status == 404, r


def _allow(resp):
    return {t.strip().upper() for t in resp.headers.get("allow", "").split(",") if t.strip()}


def test_wrong_method_405_with_allow(server):
    r = server.request("DELETE", "/warm-start")
    assert r.status == 405, r
    assert {"GET", "POST"} <= _allow(r), r
    r = server.request("POST", "/connect", body=b"{}")
    assert r.status == 405, r
    assert "GET" in _allow(r) and "POST" not in _allow(r), r
    for path in ("/healthz", "/readyz", "/metrics"):
        r = server.request("PUT", path, body=b"x")
        assert r.status == 405, (path, r)
        assert "GET" in _allow(r), (path, r)


def test_query_string_does_not_change_route(server):
    assert server.get("/healthz?probe=1").status == 200
    r = server.get("/connect?x=y")
    assert r.status == 200 and "connectionTimeoutMs" in r.json(), r


# -- metrics ----------------------------------------------------------------------

METRIC_TYPES = {
    "pilotlight_parked_now": "gauge",
    "pilotlight_keys_now": "gauge",
    "pilotlight_parked_total": "counter",
    "pilotlight_settled_total": "counter",
    "pilotlight_dispatch_total": "counter",
    "pilotlight_http_requests_total": "counter",
    "pilotlight_connections_open": "gauge",
    "pilotlight_dispatch_duration_seconds": "histogram",
    "pilotlight_wait_duration_seconds": "histogram",
}


def test_metrics_is_prometheus_text_with_every_name(server):
    r = server.get("/metrics")
    assert r.status == 200, r
    ctype = r.headers.get("content-type", "").replace(" ", "").lower()
    assert ctype.startswith("text/plain") and "version=0.0.4" in ctype, r.headers
    from conftest import Metrics
    m = Metrics(r.body.decode())
    for name, typ in METRIC_TYPES.items():
        assert m.types.get(name) == typ, f"# TYPE {name} {typ} missing: {m.types}"
        if typ == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                assert name + suffix in m.names, f"{name}{suffix} missing"
            assert m.get(name + "_bucket", le="+Inf") == m.get(name + "_count")
        else:
            assert name in m.names, f"{name} missing"
    for outcome in ("matched", "timeout", "disconnect", "replaced", "shutdown", "rejected"):
        assert ("pilotlight_settled_total", (("outcome", outcome),)) in m.samples, outcome
    for result in ("hit", "miss", "invalid"):
        assert ("pilotlight_dispatch_total", (("result", result),)) in m.samples, result
    assert_ledger(m)
    assert m.parked_now == 0 and m.parked_total == 0 and m.keys_now == 0


def test_metrics_count_requests_and_durations(server):
    server.get("/connect")
    server.get("/nope")
    c = server.park()
    server.dispatch()
    read_payload(c)
    server.dispatch()  # miss
    m = server.metrics()
    assert m.get("pilotlight_http_requests_total", route="connect", **{"class": "2xx"}) >= 1
    assert m.get("pilotlight_http_requests_total", route="other", **{"class": "4xx"}) >= 1
    assert m.get("pilotlight_http_requests_total", route="dispatch", **{"class": "2xx"}) == 2
    assert m.get("pilotlight_http_requests_total", route="park", **{"class": "2xx"}) == 1
    assert m.get("pilotlight_wait_duration_seconds_count") == 1
    assert m.get("pilotlight_dispatch_duration_seconds_count") >= 1
    assert m.dispatched("hit") == 1 and m.dispatched("miss") == 1
    assert m.get("pilotlight_connections_open") >= 1  # this scrape's own
    # Histogram buckets are cumulative.
    buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in m.samples.items()
                      if n == "pilotlight_wait_duration_seconds_bucket"))
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), buckets


def test_keys_now_counts_distinct_keys(server):
    server.park(deployment="deployment_a")
    server.park(deployment="deployment_a")
    server.park(deployment="deployment_b", cpu="1")
    m = server.wait_parked(3)
    assert m.keys_now == 2
