"""Identity: signed deployment tokens (token_mode disabled|log|enforce), the
split dispatch listener (dispatch_listen), the dispatcher's bearer token
(dispatch_token) and GET /debug/waiters.

Tokens are minted live by tests/token/mint.mjs with the real `jose` library,
the way Trigger.dev mints them (`node mint.mjs --many`, one call per module),
so these tests need node and tests/token's `npm ci` (done here if missing).
"""

import base64
import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (
    Conn, EX_CPU, EX_MEMORY, EX_VERSION, assert_ledger, get, make_message, poll_headers,
    read_payload, request, run_binary, scrape, wait_metrics,
)

TOKEN_DIR = Path(__file__).resolve().parents[2] / "tests" / "token"

SECRET = "tr_wdt_identity_5e3f9a1c7b"
DISPATCH_TOKEN = "dtok_identity_9b2e4f70aa"
VER = EX_VERSION  # the tokens' deployment_version and the polls' header

# One deployment per kind of token, so in log mode each parks under its own
# key and a dispatch for that deployment can only reach that one poll.
DEP = {
    "valid": "deployment_id_valid",
    "bad_signature": "deployment_id_badsig",
    "tampered": "deployment_id_tampered",
    "expired": "deployment_id_expired",
    "alg_none": "deployment_id_algnone",
    "alg_none_unsecured": "deployment_id_unsecured",
    "version_mismatch": "deployment_id_mismatch",
    "legacy": "deployment_id_legacy",
}

# What the server logs (at debug) as the reason it refused each kind.
REASON = {
    "bad_signature": "bad_signature",
    "tampered": "bad_signature",
    "expired": "expired",
    "alg_none": "bad_alg",
    "alg_none_unsecured": "malformed",
    "version_mismatch": "version_mismatch",
    "legacy": "legacy",
}

BAD_KINDS = ["bad_signature", "tampered", "expired", "alg_none",
             "alg_none_unsecured", "version_mismatch", "legacy"]


# --------------------------------------------------------------------------
# Tokens
# --------------------------------------------------------------------------

def _node():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: cannot mint deployment tokens")
    if not (TOKEN_DIR / "node_modules" / "jose" / "package.json").exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: cannot install jose")
        p = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TOKEN_DIR,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"npm ci failed:\n{p.stdout}\n{p.stderr}"
    return node


def mint_many(specs):
    """Tokens for <specs> (see mint.mjs --many), minted in one node call."""
    p = subprocess.run([_node(), "mint.mjs", "--many"], cwd=TOKEN_DIR,
                       input=json.dumps(specs), capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, f"mint.mjs --many failed:\n{p.stdout}\n{p.stderr}"
    tokens = json.loads(p.stdout)
    assert len(tokens) == len(specs)
    return tokens


def claims_of(token):
    """The (unverified) payload of a JWT."""
    seg = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4)))


@pytest.fixture(scope="module")
def tokens():
    specs = {
        "valid": {"secret": SECRET, "deployment": DEP["valid"], "version": VER},
        "bad_signature": {"secret": "not-" + SECRET, "deployment": DEP["bad_signature"],
                          "version": VER},
        "tampered": {"secret": SECRET, "deployment": DEP["tampered"], "version": VER},
        "expired": {"secret": SECRET, "deployment": DEP["expired"], "version": VER,
                    "exp": -60},
        "alg_none": {"secret": SECRET, "deployment": DEP["alg_none"], "version": VER,
                     "kind": "raw", "header": {"alg": "none"}},
        "alg_none_unsecured": {"deployment": DEP["alg_none_unsecured"], "version": VER,
                               "kind": "unsecured"},
        # signed, but for another version than the poll's header says
        "version_mismatch": {"secret": SECRET, "deployment": DEP["version_mismatch"],
                             "version": "20250615.99"},
    }
    names = list(specs)
    t = dict(zip(names, mint_many([specs[n] for n in names])))
    h, p, s = t["tampered"].split(".")
    t["tampered"] = f"{h}.{p}.{('B' if s[0] == 'A' else 'A') + s[1:]}"
    t["legacy"] = DEP["legacy"]
    # the mint is what we think it is
    assert claims_of(t["valid"])["deployment"] == DEP["valid"]
    assert claims_of(t["valid"])["deployment_version"] == VER
    assert t["alg_none_unsecured"].endswith(".")
    return t


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def token_checks(m):
    return {r: m.get("pilotlight_token_checks_total", result=r)
            for r in ("valid", "invalid", "legacy", "absent")}


def poll(port, deployment, version=VER, **kw):
    """A poll on its own connection, not waited for."""
    c = Conn(port)
    c.request("GET", "/warm-start", poll_headers(deployment=deployment, version=version, **kw))
    return c


def park_on(s, metrics_port, deployment, version=VER, **kw):
    """Parks a poll on <s>'s controller port; waits (scraping <metrics_port>)
    until it reached the engine."""
    before = scrape(metrics_port).parked_total
    c = poll(s.port, deployment, version, **kw)
    s.conns.append(c)
    wait_metrics(metrics_port, lambda m: m.parked_total >= before + 1,
                 what="the poll to reach the engine")
    return c


def dispatch_on(port, deployment, version=VER, run_id="run_identity", headers=None):
    body = json.dumps({"dequeuedMessage": make_message(deployment=deployment, version=version,
                                                       run_id=run_id)})
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return request(port, "POST", "/warm-start", h, body)


def did_warm_start(r):
    assert r.status == 200, r
    body = r.json()
    assert set(body) == {"didWarmStart"}, r
    return body["didWarmStart"]


def assert_json_error(r, status):
    assert r.status == status, r
    assert r.headers.get("content-type", "").split(";")[0].strip() == "application/json", r
    body = r.json()
    assert isinstance(body.get("error"), str) and body["error"], r
    return body["error"]


def waiters(port, headers=None):
    r = get(port, "/debug/waiters", headers)
    assert r.status == 200, r
    assert r.headers.get("content-type", "").split(";")[0].strip() == "application/json", r
    text = r.body.decode("utf-8")  # JSON is UTF-8: a decode error is a bug
    return json.loads(text), text


def dispatch_port_of(s, timeout=5.0):
    """The dispatch listener's port, from its "listening" log line."""
    deadline = time.monotonic() + timeout
    while True:
        for rec in s.log_lines():
            if rec.get("msg") == "listening" and rec.get("serves") == "dispatch":
                return int(rec["address"].rsplit(":", 1)[1])
        if time.monotonic() > deadline or s.proc.poll() is not None:
            raise AssertionError(f"no dispatch 'listening' line:\n{s.stderr()[-3000:]}")
        time.sleep(0.01)


@pytest.fixture
def start_split(start_server):
    """start_split(*flags, env=...) -> (server, dispatch_port) with
    --dispatch-listen 127.0.0.1:0. At teardown the server's port is pointed
    at the dispatch side, so start_server's ledger scrape can read /metrics."""
    started = []

    def start(*args, env=None):
        s = start_server("--dispatch-listen", "127.0.0.1:0", *args, env=env)
        dport = dispatch_port_of(s)
        started.append((s, dport))
        return s, dport

    yield start
    for s, dport in started:
        s.port = dport


def enforce_server(start_server, *args):
    return start_server("--token-mode", "enforce", *args,
                        env={"PILOTLIGHT_TOKEN_SECRET": SECRET})


# --------------------------------------------------------------------------
# token_mode = enforce
# --------------------------------------------------------------------------

def test_enforce_valid_token_parks_under_the_claimed_deployment(start_server, tokens):
    s = enforce_server(start_server)
    w = s.park(deployment=tokens["valid"], version=VER)
    m = s.wait_parked(1)
    assert token_checks(m) == {"valid": 1, "invalid": 0, "legacy": 0, "absent": 0}
    inv, _ = waiters(s.port)
    assert [k["deployment"] for k in inv["keys"]] == [DEP["valid"]], inv
    assert inv["keys"][0]["version"] == VER
    # the token text is not the key, nor another version
    assert did_warm_start(dispatch_on(s.port, tokens["valid"])) is False
    assert did_warm_start(dispatch_on(s.port, DEP["valid"], version="20250615.99")) is False
    assert s.metrics().parked_now == 1
    assert did_warm_start(dispatch_on(s.port, DEP["valid"], run_id="run_enforce_ok")) is True
    assert read_payload(w)["run"]["friendlyId"] == "run_enforce_ok"
    m = assert_ledger(s.metrics())
    assert m.settled("matched") == 1 and m.parked_now == 0


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_enforce_refuses_bad_tokens_with_401(start_server, tokens, kind):
    s = enforce_server(start_server)
    r = s.request("GET", "/warm-start", poll_headers(deployment=tokens[kind], version=VER))
    err = assert_json_error(r, 401)
    assert "token" in err, r
    assert SECRET not in r.body.decode("utf-8", "replace")
    m = assert_ledger(s.metrics())
    assert m.parked_total == 0 and m.parked_now == 0 and m.keys_now == 0, m.text
    want = {"valid": 0, "invalid": 0, "legacy": 0, "absent": 0}
    want["legacy" if kind == "legacy" else "invalid"] = 1
    assert token_checks(m) == want
    assert m.get("pilotlight_http_requests_total", route="park", **{"class": "4xx"}) == 1
    # nothing was parked under the claimed deployment (nor the token text)
    assert did_warm_start(dispatch_on(s.port, DEP[kind])) is False
    assert did_warm_start(dispatch_on(s.port, tokens[kind])) is False
    assert assert_ledger(s.metrics()).parked_total == 0


def test_enforce_missing_deployment_header_is_400_and_counted_absent(start_server):
    s = enforce_server(start_server)
    r = s.request("GET", "/warm-start", poll_headers(omit=("x-trigger-deployment-id",)))
    assert "x-trigger-deployment-id" in assert_json_error(r, 400)
    r = s.request("GET", "/warm-start", poll_headers(deployment=""))
    assert "x-trigger-deployment-id" in assert_json_error(r, 400)
    m = assert_ledger(s.metrics())
    assert m.parked_total == 0
    assert token_checks(m) == {"valid": 0, "invalid": 0, "legacy": 0, "absent": 2}


def test_enforce_cached_token_is_refused_once_expired(start_server):
    """A verified token may be cached, but never past its exp."""
    s = enforce_server(start_server)
    for _ in range(3):  # a slow node start leaves too little time: mint again
        exp = math.ceil(time.time() + 1.2)  # whole seconds, as Trigger.dev mints
        tok = mint_many([{"secret": SECRET, "deployment": DEP["valid"], "version": VER,
                          "exp_at": exp}])[0]
        assert claims_of(tok)["exp"] == exp
        if time.time() < exp - 0.4:
            break
    else:
        pytest.fail("minting took too long to test expiry")
    w = s.park(deployment=tok, version=VER)
    s.wait_parked(1)
    time.sleep(max(0.0, exp - time.time()) + 0.05)
    r = s.request("GET", "/warm-start", poll_headers(deployment=tok, version=VER))
    assert_json_error(r, 401)
    m = assert_ledger(s.metrics())
    assert m.parked_total == 1
    assert token_checks(m) == {"valid": 1, "invalid": 1, "legacy": 0, "absent": 0}
    w.close()


# --------------------------------------------------------------------------
# token_mode = log
# --------------------------------------------------------------------------

def test_log_mode_parks_every_poll_and_counts_exactly(start_server, tokens):
    s = start_server("--token-mode", "log", "--log-level", "debug",
                     env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    kinds = ["valid"] + BAD_KINDS
    conns = {k: s.park(deployment=tokens[k], version=VER) for k in kinds}
    # no deployment header at all, and an empty one: 400, counted "absent"
    r = s.request("GET", "/warm-start", poll_headers(omit=("x-trigger-deployment-id",)))
    assert_json_error(r, 400)
    r = s.request("GET", "/warm-start", poll_headers(deployment=""))
    assert_json_error(r, 400)

    m = assert_ledger(s.wait_parked(len(kinds)))
    assert m.parked_total == len(kinds)
    assert token_checks(m) == {"valid": 1, "invalid": len(BAD_KINDS) - 1, "legacy": 1,
                               "absent": 2}, m.text

    # Each poll is under its unverified deployment claim (or its bare id).
    # An unsecured JWT (empty signature segment) is not "three non-empty
    # base64url segments" (docs/protocol.md), so no claim is read from it: it
    # parks under its own text, like a bare id.
    inv, _ = waiters(s.port)
    got = {k["deployment"] for k in inv["keys"]}
    want = {DEP[k] for k in kinds if k != "alg_none_unsecured"} | {tokens["alg_none_unsecured"]}
    assert got == want, inv
    for k in kinds:
        target = tokens[k] if k == "alg_none_unsecured" else DEP[k]
        run = f"run_log_{k}"
        assert did_warm_start(dispatch_on(s.port, target, run_id=run)) is True, k
        assert read_payload(conns[k])["run"]["friendlyId"] == run, k
    m = assert_ledger(s.metrics())
    assert m.parked_now == 0 and m.settled("matched") == len(kinds)
    # checks are counted per poll, not per dispatch
    assert token_checks(m) == {"valid": 1, "invalid": len(BAD_KINDS) - 1, "legacy": 1,
                               "absent": 2}

    refused = [rec for rec in s.log_lines() if rec.get("msg") == "deployment token refused"]
    assert sorted(rec.get("reason") for rec in refused) == sorted(REASON[k] for k in BAD_KINDS)
    assert all(rec.get("enforced") is False for rec in refused), refused
    err = s.stderr()
    assert SECRET not in err
    assert tokens["valid"].split(".")[2] not in err  # no token signature in logs


def test_disabled_mode_verifies_nothing(start_server, tokens):
    s = start_server(env={"PILOTLIGHT_TOKEN_SECRET": SECRET})
    # a forged token still parks under its claim: nothing is verified
    w = s.park(deployment=tokens["bad_signature"], version=VER)
    s.park(deployment=DEP["legacy"], version=VER)
    m = s.wait_parked(2)
    assert token_checks(m) == {"valid": 0, "invalid": 0, "legacy": 0, "absent": 0}
    assert did_warm_start(dispatch_on(s.port, DEP["bad_signature"], run_id="run_dis")) is True
    assert read_payload(w)["run"]["friendlyId"] == "run_dis"


# --------------------------------------------------------------------------
# The secret's sources, and never printing it
# --------------------------------------------------------------------------

@pytest.mark.parametrize("content", [SECRET, SECRET + "\n"])
def test_secret_from_token_secret_file(start_server, tokens, tmp_path, content):
    f = tmp_path / "secret"
    f.write_text(content)
    s = start_server("--token-mode", "enforce", "--token-secret-file", str(f))
    w = s.park(deployment=tokens["valid"], version=VER)
    s.wait_parked(1)
    r = s.request("GET", "/warm-start", poll_headers(deployment=tokens["bad_signature"],
                                                     version=VER))
    assert_json_error(r, 401)
    assert did_warm_start(dispatch_on(s.port, DEP["valid"], run_id="run_file")) is True
    assert read_payload(w)["run"]["friendlyId"] == "run_file"
    assert SECRET not in s.stderr()


def test_secret_file_of_the_longest_secret_with_its_newline(tmp_path):
    """token_secret may be 511 bytes; its file may end in one newline."""
    secret = "s" * 511
    f = tmp_path / "secret"
    f.write_text(secret + "\n")
    rc, out, err = run_binary("--check-config", "--token-mode", "enforce",
                              "--token-secret-file", str(f))
    assert rc == 0, (out, err)


def test_secret_from_environment_variable(start_server, tokens):
    # PILOTLIGHT_TOKEN_SECRET is what enforce_server uses; a wrong one refuses
    s = start_server("--token-mode", "enforce", env={"PILOTLIGHT_TOKEN_SECRET": "other"})
    r = s.request("GET", "/warm-start", poll_headers(deployment=tokens["valid"], version=VER))
    assert_json_error(r, 401)
    s2 = enforce_server(start_server)
    s2.park(deployment=tokens["valid"], version=VER)
    s2.wait_parked(1)


@pytest.mark.parametrize("source", ["env", "flag", "flag=", "config", "file"])
def test_check_config_never_prints_secrets(tmp_path, source):
    args, env = ["--check-config", "--token-mode", "enforce"], {}
    if source == "env":
        env = {"PILOTLIGHT_TOKEN_SECRET": SECRET, "PILOTLIGHT_DISPATCH_TOKEN": DISPATCH_TOKEN}
    elif source == "flag":
        args += ["--token-secret", SECRET, "--dispatch-token", DISPATCH_TOKEN]
    elif source == "flag=":
        args += [f"--token-secret={SECRET}", f"--dispatch-token={DISPATCH_TOKEN}"]
    elif source == "config":
        conf = tmp_path / "pilotlight.conf"
        conf.write_text(f"token_secret = {SECRET}\ndispatch_token = {DISPATCH_TOKEN}\n")
        args += ["--config", str(conf)]
    else:
        sf = tmp_path / "secret"
        sf.write_text(SECRET + "\n")
        args += ["--token-secret-file", str(sf)]
        env = {"PILOTLIGHT_DISPATCH_TOKEN": DISPATCH_TOKEN}
    rc, out, err = run_binary(*args, env=env)
    assert rc == 0, (out, err)
    for secret in (SECRET, DISPATCH_TOKEN):
        assert secret not in out and secret not in err
    lines = dict(ln.split(" = ", 1) for ln in out.splitlines() if " = " in ln)
    assert lines.get("dispatch_token") == "(set)", out
    assert lines.get("token_mode") == "enforce", out
    if source == "file":
        assert lines.get("token_secret_file") == str(tmp_path / "secret"), out
    else:
        assert lines.get("token_secret") == "(set)", out


def test_help_never_prints_secrets():
    rc, out, err = run_binary("--help", env={"PILOTLIGHT_TOKEN_SECRET": SECRET,
                                             "PILOTLIGHT_DISPATCH_TOKEN": DISPATCH_TOKEN})
    assert rc == 0
    assert SECRET not in out + err and DISPATCH_TOKEN not in out + err


@pytest.mark.parametrize("mode", ["enforce", "log"])
@pytest.mark.parametrize("check", [True, False])
def test_token_mode_without_secret_refuses_to_start(mode, check):
    args = ["--token-mode", mode, "--listen", "127.0.0.1:0"]
    rc, out, err = run_binary(*(["--check-config"] if check else []), *args)
    assert rc not in (0, None), (out, err)
    assert "token_secret" in out + err, (out, err)
    assert "listening" not in err


def test_token_secret_file_missing_or_empty(tmp_path):
    missing = tmp_path / "nope"
    rc, out, err = run_binary("--check-config", "--token-mode", "enforce",
                              "--token-secret-file", str(missing))
    assert rc != 0 and str(missing) in out + err, (out, err)
    empty = tmp_path / "empty"
    empty.write_text("\n")
    rc, out, err = run_binary("--check-config", "--token-mode", "enforce",
                              "--token-secret-file", str(empty))
    assert rc != 0 and "token_secret" in out + err, (out, err)


# --------------------------------------------------------------------------
# dispatch_listen: the split
# --------------------------------------------------------------------------

def test_single_listener_serves_all(server):
    recs = [r for r in server.log_lines() if r.get("msg") == "listening"]
    assert len(recs) == 1 and recs[0].get("serves") == "all", recs


def test_split_listeners_serve_their_own_routes(start_split):
    s, dport = start_split()
    recs = [r for r in s.log_lines() if r.get("msg") == "listening"]
    assert [r.get("serves") for r in recs] == ["controllers", "dispatch"], recs
    assert dport != s.port
    cport = s.port

    # controllers' side
    r = get(cport, "/connect")
    assert r.status == 200 and set(r.json()) == {"connectionTimeoutMs", "keepaliveMs"}, r
    assert get(cport, "/healthz").status == 200
    assert get(cport, "/readyz").status == 200
    assert_json_error(dispatch_on(cport, "deployment_split"), 403)
    assert_json_error(get(cport, "/metrics"), 403)
    assert_json_error(get(cport, "/debug/waiters"), 403)
    assert_json_error(get(cport, "/nope"), 404)

    # dispatcher's side
    assert did_warm_start(dispatch_on(dport, "deployment_split")) is False
    assert get(dport, "/metrics").status == 200
    inv, _ = waiters(dport)
    assert inv["total_keys"] == 0
    assert get(dport, "/healthz").status == 200
    assert get(dport, "/readyz").status == 200
    assert_json_error(get(dport, "/connect"), 403)
    assert_json_error(get(dport, "/warm-start",
                          poll_headers(deployment="deployment_split")), 403)
    assert_json_error(get(dport, "/nope"), 404)

    m = assert_ledger(scrape(dport))
    assert m.parked_total == 0, "a poll on the dispatch side reached the engine"
    assert m.dispatched("miss") == 1, "a dispatch on the controllers' side reached the engine"

    # a poll parked on one side, matched from the other
    w = park_on(s, dport, "deployment_split")
    assert did_warm_start(dispatch_on(dport, "deployment_split", run_id="run_split")) is True
    assert read_payload(w)["run"]["friendlyId"] == "run_split"
    m = assert_ledger(scrape(dport))
    assert m.settled("matched") == 1 and m.dispatched("hit") == 1
    assert m.get("pilotlight_http_requests_total", route="debug", **{"class": "2xx"}) == 1
    assert m.get("pilotlight_http_requests_total", route="debug", **{"class": "4xx"}) == 1
    assert m.get("pilotlight_http_requests_total", route="metrics", **{"class": "4xx"}) == 1
    assert m.get("pilotlight_http_requests_total", route="dispatch", **{"class": "4xx"}) == 1


def test_split_with_dispatch_token(start_split):
    s, dport = start_split(env={"PILOTLIGHT_DISPATCH_TOKEN": DISPATCH_TOKEN})
    auth = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    # the controllers' side refuses dispatch outright, token or not
    assert_json_error(dispatch_on(s.port, "deployment_st", headers=auth), 403)
    assert_json_error(dispatch_on(s.port, "deployment_st"), 403)
    assert_json_error(get(s.port, "/debug/waiters", auth), 403)
    w = park_on(s, dport, "deployment_st")
    assert_json_error(dispatch_on(dport, "deployment_st"), 401)
    assert scrape(dport).parked_now == 1
    assert did_warm_start(dispatch_on(dport, "deployment_st", run_id="run_st", headers=auth))
    assert read_payload(w)["run"]["friendlyId"] == "run_st"
    assert DISPATCH_TOKEN not in s.stderr()


# --------------------------------------------------------------------------
# dispatch_token
# --------------------------------------------------------------------------

WRONG_AUTH = [
    None,
    f"Bearer wrong_{DISPATCH_TOKEN}",
    f"Bearer {DISPATCH_TOKEN[:-1]}",
    f"Bearer {DISPATCH_TOKEN}x",
    f"Basic {base64.b64encode(DISPATCH_TOKEN.encode()).decode()}",
    f"Token {DISPATCH_TOKEN}",
    DISPATCH_TOKEN,
    "Bearer",
    "Bearer ",
]


def test_dispatch_token_guards_dispatch(start_server):
    s = start_server("--dispatch-token", DISPATCH_TOKEN)
    w = s.park(deployment="deployment_dt")
    for auth in WRONG_AUTH:
        h = {} if auth is None else {"Authorization": auth}
        r = dispatch_on(s.port, "deployment_dt", headers=h)
        assert_json_error(r, 401)
        assert r.headers.get("www-authenticate", "").split()[0] == "Bearer", (auth, r)
    m = assert_ledger(s.metrics())  # /metrics needs no token
    assert m.parked_now == 1, "an unauthenticated dispatch took the poll"
    assert m.sum("pilotlight_dispatch_total") == 0
    assert m.get("pilotlight_http_requests_total", route="dispatch",
                 **{"class": "4xx"}) == len(WRONG_AUTH)
    ok = {"Authorization": f"Bearer {DISPATCH_TOKEN}"}
    assert did_warm_start(dispatch_on(s.port, "deployment_dt", run_id="run_dt", headers=ok))
    assert read_payload(w)["run"]["friendlyId"] == "run_dt"
    # the scheme is case-insensitive (RFC 9110 11.1)
    r = dispatch_on(s.port, "deployment_dt", headers={"Authorization": f"bearer {DISPATCH_TOKEN}"})
    assert did_warm_start(r) is False
    assert DISPATCH_TOKEN not in s.stderr()


def test_dispatch_token_guards_debug_waiters(start_server):
    s = start_server(env={"PILOTLIGHT_DISPATCH_TOKEN": DISPATCH_TOKEN})
    s.park(deployment="deployment_dw")
    for auth in WRONG_AUTH:
        h = {} if auth is None else {"Authorization": auth}
        r = get(s.port, "/debug/waiters", h)
        assert_json_error(r, 401)
        assert r.headers.get("www-authenticate", "").split()[0] == "Bearer", (auth, r)
        assert b"deployment_dw" not in r.body
    inv, _ = waiters(s.port, {"Authorization": f"Bearer {DISPATCH_TOKEN}"})
    assert inv["total_keys"] == 1 and inv["keys"][0]["deployment"] == "deployment_dw"
    # controllers need no token; neither do /metrics, /healthz, /connect
    for path in ("/metrics", "/healthz", "/readyz", "/connect"):
        assert s.get(path).status == 200, path
    m = s.metrics()
    assert m.get("pilotlight_http_requests_total", route="debug",
                 **{"class": "4xx"}) == len(WRONG_AUTH)
    assert m.get("pilotlight_http_requests_total", route="debug", **{"class": "2xx"}) == 1


# --------------------------------------------------------------------------
# GET /debug/waiters
# --------------------------------------------------------------------------

KEY_FIELDS = {"deployment", "version", "cpu", "memory", "parked", "oldest_wait_ms"}


def by_deployment(inv):
    assert set(inv) == {"keys", "total_keys", "parked", "truncated"}, inv
    for k in inv["keys"]:
        assert set(k) == KEY_FIELDS, k
        assert isinstance(k["oldest_wait_ms"], int) and k["oldest_wait_ms"] >= 0, k
        assert isinstance(k["parked"], int) and k["parked"] >= 1, k
    out = {k["deployment"]: k for k in inv["keys"]}
    assert len(out) == len(inv["keys"]), inv
    return out


def test_debug_waiters_lists_keys_without_payloads(server):
    a, b = "deployment_dbg_a", "deployment_dbg_b"
    c = 'deployment_q"uote\\back/slash'
    u = "deployment_ünï_☃"
    u_wire = u.encode("utf-8").decode("latin-1")  # header bytes are UTF-8
    t0 = time.monotonic()
    a1 = server.park(deployment=a, cpu=0.25, memory=0.5)
    time.sleep(0.3)
    t1 = time.monotonic()
    a2 = server.park(deployment=a, cpu=0.25, memory=0.5)
    server.park(deployment=a, cpu=0.25, memory=0.5)
    server.park(deployment=b, cpu=2, memory=4)
    server.park(deployment=c)
    server.park(deployment=c)
    server.park(deployment=u_wire)
    server.wait_parked(7)
    # a dispatch that misses leaves no trace of its payload either
    assert did_warm_start(dispatch_on(server.port, "deployment_dbg_nobody",
                                      run_id="run_PAYLOAD_MARK_miss")) is False

    inv, text = waiters(server.port)
    elapsed_a = (time.monotonic() - t0) * 1000
    keys = by_deployment(inv)
    assert inv["total_keys"] == 4 and inv["parked"] == 7 and inv["truncated"] is False, inv
    assert set(keys) == {a, b, c, u}, keys
    assert keys[a]["parked"] == 3 and keys[b]["parked"] == 1
    assert keys[c]["parked"] == 2 and keys[u]["parked"] == 1
    assert keys[a]["version"] == keys[c]["version"] == poll_headers()["x-trigger-deployment-version"]
    assert (keys[a]["cpu"], keys[a]["memory"]) == (0.25, 0.5)
    assert (keys[b]["cpu"], keys[b]["memory"]) == (2, 4)
    assert (keys[c]["cpu"], keys[c]["memory"]) == (EX_CPU, EX_MEMORY)
    assert 250 <= keys[a]["oldest_wait_ms"] <= elapsed_a + 50, keys[a]
    assert keys[b]["oldest_wait_ms"] < keys[a]["oldest_wait_ms"]
    assert '\\"' in text and "\\\\" in text, text  # the quote and backslash are escaped

    time.sleep(0.2)
    inv2, text2 = waiters(server.port)
    keys2 = by_deployment(inv2)
    for d in (a, b, c, u):
        grew = keys2[d]["oldest_wait_ms"] - keys[d]["oldest_wait_ms"]
        assert grew >= 150, (d, keys[d], keys2[d])

    # fifo: the oldest poll of <a> gets the run; <a>'s oldest wait is then a2's
    assert did_warm_start(dispatch_on(server.port, a, version=keys[a]["version"],
                                      run_id="run_PAYLOAD_MARK_hit")) is False  # cpu differs
    body = json.dumps({"dequeuedMessage": make_message(deployment=a, cpu=0.25, memory=0.5,
                                                       run_id="run_PAYLOAD_MARK_hit")})
    r = server.dispatch_raw(body)
    assert did_warm_start(r) is True
    assert read_payload(a1)["run"]["friendlyId"] == "run_PAYLOAD_MARK_hit"
    # the quoted/backslashed id round-trips: a dispatch for it matches
    r = server.dispatch_raw(json.dumps({"dequeuedMessage": make_message(
        deployment=c, run_id="run_PAYLOAD_MARK_c")}))
    assert did_warm_start(r) is True
    r = server.dispatch_raw(json.dumps({"dequeuedMessage": make_message(
        deployment=u, run_id="run_PAYLOAD_MARK_u")}))
    assert did_warm_start(r) is True

    inv3, text3 = waiters(server.port)
    keys3 = by_deployment(inv3)
    age_a2 = (time.monotonic() - t1) * 1000
    assert inv3["total_keys"] == 3 and inv3["parked"] == 4, inv3
    assert set(keys3) == {a, b, c}
    assert keys3[a]["parked"] == 2 and keys3[c]["parked"] == 1
    assert keys3[a]["oldest_wait_ms"] <= age_a2 + 50, (keys3[a], age_a2)
    assert keys3[a]["oldest_wait_ms"] < keys2[a]["oldest_wait_ms"], (keys2[a], keys3[a])

    for t in (text, text2, text3):
        for mark in ("PAYLOAD_MARK", "dequeuedMessage", "friendlyId", "controller_"):
            assert mark not in t, (mark, t)
    a2.close()


def test_debug_waiters_with_invalid_utf8_deployment_is_still_json(server):
    """Header values may carry obs-text bytes; the inventory must stay valid
    (UTF-8) JSON whatever a controller sent."""
    dep = "deployment_bad_\xff\xfe_utf8"  # latin-1 on the wire: bytes ff fe
    r_conn = Conn(server.port)
    server.conns.append(r_conn)
    r_conn.request("GET", "/warm-start", poll_headers(deployment=dep))
    # either the poll is refused (400) or it parks and is listed validly
    if r_conn.silent_for(0.3):
        inv, _ = waiters(server.port)
        assert inv["total_keys"] == 1 and inv["parked"] == 1
    else:
        assert_json_error(r_conn.read_response(), 400)


def test_debug_waiters_lists_at_most_1000_keys(server):
    n = 1001
    conns = []
    for i in range(n):
        c = Conn(server.port)
        c.request("GET", "/warm-start", poll_headers(deployment=f"deployment_many_{i}"))
        conns.append(c)
    server.conns.extend(conns)
    server.wait_parked(n, timeout=20)
    inv, text = waiters(server.port)
    keys = by_deployment(inv)
    assert len(keys) == 1000 and inv["total_keys"] == n and inv["parked"] == n, \
        {k: inv[k] for k in ("total_keys", "parked", "truncated")}
    assert inv["truncated"] is True
    assert all(k["parked"] == 1 for k in keys.values())
    assert set(keys) <= {f"deployment_many_{i}" for i in range(n)}
