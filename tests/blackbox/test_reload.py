"""Change without a restart: signals that always mean the same thing, a live
reload on SIGHUP (caps, log level, timeouts, tokens) that closes no parked
poll, and token-secret rotation with a previous secret."""

import json
import os
import signal
import socket
import threading
import time

import pytest

from conftest import (HOST, Conn, EX_VERSION, assert_ledger, get, key_of, make_message,
                      poll_headers, request)
from test_scale import open_polls


def write_conf(path, **settings):
    path.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))


def logged(s, msg, **fields):
    return [r for r in s.log_lines() if r.get("msg") == msg
            and all(r.get(k) == v for k, v in fields.items())]


def wait_logged(s, msg, timeout=20.0, **fields):
    deadline = time.monotonic() + timeout
    while not logged(s, msg, **fields):
        assert time.monotonic() < deadline, f"no {msg!r} log line; stderr:\n{s.stderr()[-3000:]}"
        time.sleep(0.02)
    return logged(s, msg, **fields)


def hup(s, msg="reloaded"):
    """SIGHUP, then waits for the reload's verdict (<msg>) to be logged."""
    before = len(logged(s, msg))
    s.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while len(logged(s, msg)) <= before:
        assert time.monotonic() < deadline, f"no {msg!r} after SIGHUP:\n{s.stderr()[-3000:]}"
        time.sleep(0.02)


def dispatch_body(k, run_id):
    d, v, cpu, mem = key_of(k)
    return json.dumps({"dequeuedMessage": make_message(d, v, cpu, mem, run_id)})


# -- signals ------------------------------------------------------------------

def test_second_sigterm_during_drain_delay_closes_listener_and_exits(start_server):
    s = start_server("--drain-delay-ms", "5000")
    p = s.park()
    s.sigterm()
    wait_logged(s, "draining")
    assert get(s.port, "/readyz").status == 503  # inside the delay: still listening
    t0 = time.monotonic()
    s.sigterm()
    rc = s.wait_exit(timeout=5)
    took = time.monotonic() - t0
    assert rc == 0
    assert took < 1.0, f"second SIGTERM: exit took {took:.2f}s"
    assert p.wait_closed(timeout=1) == b""
    with pytest.raises(OSError):
        socket.create_connection((HOST, s.port), timeout=1).close()
    assert logged(s, "second signal: closing now")


def test_sigint_after_sigterm_is_a_second_signal_too(start_server):
    s = start_server("--drain-delay-ms", "5000")
    s.sigterm()
    wait_logged(s, "draining")
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGINT)
    assert s.wait_exit(timeout=5) == 0
    assert time.monotonic() - t0 < 1.0


def test_sighup_and_sigusr2_during_drain_are_ignored(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=100)
    s = start_server("--config", str(conf), "--drain-delay-ms", "1500")
    p = s.park()
    s.sigterm()
    wait_logged(s, "draining")
    write_conf(conf, max_waiters=7)
    s.proc.send_signal(signal.SIGHUP)
    s.proc.send_signal(signal.SIGUSR2)
    wait_logged(s, "signal ignored", signal="SIGHUP", why="draining")
    wait_logged(s, "signal ignored", signal="SIGUSR2", why="draining")
    assert not logged(s, "reloaded")
    assert p.wait_closed(timeout=8) == b""  # the drain goes on as before
    assert s.wait_exit() == 0


# -- reload -------------------------------------------------------------------

N_KEYS, PER_KEY = 100, 50


def test_reload_under_load_closes_nothing_and_takes_effect(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=20000, log_level="info")
    s = start_server("--config", str(conf))
    headers = [poll_headers(*key_of(k)[:1], version=key_of(k)[1], cpu=key_of(k)[2],
                            memory=key_of(k)[3]) for k in range(N_KEYS) for _ in range(PER_KEY)]
    socks = open_polls(s.port, headers)
    try:
        s.wait_parked(N_KEYS * PER_KEY, timeout=30)
        assert s.metrics().get("pilotlight_config_max_waiters") == 20000
        results, stop = [], threading.Event()

        def stream():
            c, i = Conn(s.port), 0
            try:
                while not stop.is_set() and i < N_KEYS * 2:
                    c.request("POST", "/warm-start", {"Content-Type": "application/json"},
                              dispatch_body(i % N_KEYS, f"run_reload_{i}"))
                    r = c.read_response()
                    results.append((r.status, r.json().get("didWarmStart")))
                    i += 1
            finally:
                c.close()

        t = threading.Thread(target=stream)
        t.start()
        while len(results) < 20:
            time.sleep(0.005)
        write_conf(conf, max_waiters=12345, log_level="debug")
        hup(s)
        t.join(timeout=60)
        stop.set()
        assert results and all(r == (200, True) for r in results), \
            [r for r in results if r != (200, True)][:5]
        n = len(results)
        m = s.metrics()
        assert m.get("pilotlight_config_max_waiters") == 12345
        assert m.get("pilotlight_config_reloads_total", result="ok") == 1
        assert m.settled("matched") == n
        assert m.parked_now == N_KEYS * PER_KEY - n
        for outcome in ("disconnect", "shutdown", "timeout", "replaced", "rejected"):
            assert m.settled(outcome) == 0, outcome
        assert logged(s, "setting changed", name="max_waiters", value="12345")
        assert logged(s, "setting changed", name="log_level", value="debug")
        # debug is on now: a bad request is logged at debug
        request(s.port, "GET", "/warm-start", poll_headers(omit=["x-trigger-machine-cpu"]))
        Conn(s.port).send(b"NOT HTTP\r\n\r\n")
        wait_logged(s, "bad request")
        # the polls not matched are still open and unanswered
        assert_ledger(s.port)
    finally:
        for sk in socks:
            sk.close()
    s.wait_parked(0, timeout=20)


def test_reload_new_cap_applies_to_new_parks(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters_per_key=5)
    s = start_server("--config", str(conf))
    polls = [s.park() for _ in range(2)]
    write_conf(conf, max_waiters_per_key=2, connection_timeout_ms=12345)
    hup(s)
    r = s.conn()
    r.request("GET", "/warm-start", poll_headers())
    assert r.read_response().status == 503  # two parked, the cap is two now
    assert all(p.silent_for(0.05) for p in polls)  # within the cap: nothing closed
    assert s.get("/connect").json()["connectionTimeoutMs"] == 12345


def test_reload_that_lowers_a_cap_answers_the_polls_over_it(start_server, tmp_path):
    """What a cap in force would have refused is refused now, as a new poll
    would be: 503, newest first, per key and then in all."""
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=100, max_waiters_per_key=5)
    s = start_server("--config", str(conf))
    a = [s.park(deployment="deployment_cap_a") for _ in range(4)]
    b = [s.park(deployment="deployment_cap_b") for _ in range(2)]
    write_conf(conf, max_waiters=4, max_waiters_per_key=3)
    hup(s)
    # a: 4 > 3, its newest goes; then 5 > 4 in all: b's newest
    for p, why in ((a[3], "deployment and machine"), (b[1], "on this server")):
        r = p.read_response(timeout=5)
        assert r.status == 503 and why in r.json()["error"], r
    assert all(p.silent_for(0.05) for p in a[:3] + b[:1])
    m = assert_ledger(s.metrics())
    assert m.settled("rejected") == 2 and m.parked_now == 4
    assert logged(s, "reload: parked polls refused under the new settings",
                  revoked=0, rejected=2)
    # the rest are served as before
    assert s.dispatch(make_message(deployment="deployment_cap_a")) is True
    assert json.loads(a[0].read_response().body)["deployment"]["friendlyId"] == \
        "deployment_cap_a"


def test_broken_config_on_reload_changes_nothing(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=300)
    s = start_server("--config", str(conf))
    p = s.park()
    conf.write_text("max_waiters = many\n")
    hup(s, "reload failed: configuration unchanged")
    rec = logged(s, "reload failed: configuration unchanged")[-1]
    assert "max_waiters" in rec["error"]
    conf.unlink()
    hup(s, "reload failed: configuration unchanged")
    m = s.metrics()
    assert m.get("pilotlight_config_max_waiters") == 300
    assert m.get("pilotlight_config_reloads_total", result="error") == 2
    assert m.get("pilotlight_config_reloads_total", result="ok") == 0
    assert p.silent_for(0.05)
    assert s.dispatch() is True
    assert json.loads(p.read_response().body)["run"]


def test_reload_keeps_listen_addresses(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=10)
    s = start_server("--config", str(conf))
    write_conf(conf, max_waiters=11, dispatch_listen="127.0.0.1:1")
    hup(s)
    assert logged(s, "listen addresses cannot change live: kept (restart or upgrade "
                     "to change them)")
    assert s.metrics().get("pilotlight_config_max_waiters") == 11
    assert s.get("/healthz").status == 200


def test_reload_keeps_flags_and_environment_as_at_start(start_server, tmp_path):
    conf = tmp_path / "p.conf"
    write_conf(conf, max_waiters=10, max_waiters_per_key=10)
    s = start_server("--config", str(conf), "--max-waiters", "40",
                     env={"PILOTLIGHT_MAX_WAITERS_PER_KEY": "30"})
    write_conf(conf, max_waiters=11, max_waiters_per_key=11, max_connections=999)
    hup(s)
    m = s.metrics()
    assert m.get("pilotlight_config_max_waiters") == 40  # the flag still wins
    assert m.get("pilotlight_config_max_waiters_per_key") == 30  # so does the env
    assert m.get("pilotlight_config_max_connections") == 999


# -- secret rotation ----------------------------------------------------------

OLD, NEW = "tr_wdt_rotation_old_41c2", "tr_wdt_rotation_new_97e0"


def test_rotation_previous_secret_verifies_until_dropped(start_server, tmp_path):
    from test_identity import mint_many
    tok_old, tok_new = mint_many([
        {"secret": OLD, "deployment": "deployment_rot_old", "version": EX_VERSION},
        {"secret": NEW, "deployment": "deployment_rot_new", "version": EX_VERSION},
    ])
    conf = tmp_path / "p.conf"
    prev = tmp_path / "prev.secret"
    prev.write_text(OLD + "\n")
    write_conf(conf, token_mode="enforce", token_secret=OLD)
    s = start_server("--config", str(conf))

    def poll_status(tok, dep):
        """"parked", or the status the poll was answered with."""
        def checked(m):
            return m.sum("pilotlight_token_checks_total")
        before = s.metrics()
        c = s.conn()
        c.request("GET", "/warm-start", poll_headers(deployment=tok))
        m = s.wait_metrics(lambda m: checked(m) > checked(before), timeout=20)
        if m.parked_total > before.parked_total:
            assert c.silent_for(0.05)
            c.close()
            return "parked"
        return c.read_response().status

    assert poll_status(tok_old, "deployment_rot_old") == "parked"
    assert poll_status(tok_new, "deployment_rot_new") == 401
    # the rotation: the new secret current, the old one previous
    write_conf(conf, token_mode="enforce", token_secret=NEW,
               token_secret_previous_file=str(prev))
    hup(s)
    assert poll_status(tok_old, "deployment_rot_old") == "parked"
    assert poll_status(tok_new, "deployment_rot_new") == "parked"
    m = s.metrics()
    assert m.get("pilotlight_token_secret_valid_total", secret="previous") == 1
    assert m.get("pilotlight_token_secret_valid_total", secret="current") == 2
    assert m.get("pilotlight_token_checks_total", result="valid") == 3
    # the rotation is over: the old secret is gone, its (cached) token too
    write_conf(conf, token_mode="enforce", token_secret=NEW)
    hup(s)
    assert poll_status(tok_old, "deployment_rot_old") == 401
    assert poll_status(tok_new, "deployment_rot_new") == "parked"
    s.wait_parked(0)


def test_rotation_previous_secret_from_environment(start_server, tmp_path):
    from test_identity import mint_many
    (tok_old,) = mint_many([{"secret": OLD, "deployment": "deployment_rot_env",
                             "version": EX_VERSION}])
    s = start_server(env={"PILOTLIGHT_TOKEN_MODE": "enforce",
                          "PILOTLIGHT_TOKEN_SECRET": NEW,
                          "PILOTLIGHT_TOKEN_SECRET_PREVIOUS": OLD})
    c = s.conn()
    c.request("GET", "/warm-start", poll_headers(deployment=tok_old))
    assert c.silent_for(0.3)
    s.wait_metrics(lambda m: m.get("pilotlight_token_secret_valid_total",
                                   secret="previous") == 1)


# -- a reload that tightens the token rules -----------------------------------

def poll_status(s, dep, timeout=0.3):
    """Parks a poll with x-trigger-deployment-id <dep>: its connection, once
    the engine or a refusal has it."""
    before = s.metrics()
    c = s.conn()
    c.request("GET", "/warm-start", poll_headers(deployment=dep))
    s.wait_metrics(lambda m: m.parked_total > before.parked_total or
                   m.sum("pilotlight_http_requests_total", route="park") >
                   before.sum("pilotlight_http_requests_total", route="park"), timeout=20)
    return c


def test_reload_to_enforce_refuses_the_polls_a_new_one_would_not_pass(start_server, tmp_path):
    """log -> enforce: a bare id and an invalid token parked under log get
    401, as they would now; a valid token stays parked and is served."""
    from test_identity import mint_many
    good, forged = mint_many([
        {"secret": NEW, "deployment": "deployment_tight_ok", "version": EX_VERSION},
        {"secret": "not-" + NEW, "deployment": "deployment_tight_forged",
         "version": EX_VERSION},
    ])
    conf = tmp_path / "p.conf"
    write_conf(conf, token_mode="log", token_secret=NEW)
    s = start_server("--config", str(conf))
    bare = poll_status(s, "deployment_tight_bare")
    bad = poll_status(s, forged)
    ok = poll_status(s, good)
    s.wait_parked(3)
    write_conf(conf, token_mode="enforce", token_secret=NEW)
    hup(s)
    r = bare.read_response(timeout=5)
    assert r.status == 401 and r.json()["error"] == "a signed deployment token is required"
    r = bad.read_response(timeout=5)
    assert r.status == 401 and r.json()["error"] == "invalid deployment token"
    assert ok.silent_for(0.1)
    m = assert_ledger(s.metrics())
    assert m.settled("revoked") == 2 and m.parked_now == 1
    assert logged(s, "reload: parked polls refused under the new settings",
                  revoked=2, rejected=0)
    # a new poll is judged the same way
    assert poll_status(s, "deployment_tight_bare").read_response().status == 401
    assert s.dispatch(make_message(deployment="deployment_tight_ok")) is True
    assert json.loads(ok.read_response().body)["deployment"]["friendlyId"] == \
        "deployment_tight_ok"


def test_reload_from_disabled_asks_unverified_tokens_again(start_server, tmp_path):
    """disabled -> enforce: a bare id gets 401; a token read but never
    verified here is closed unanswered (a controller then polls again and
    is judged), rather than refused on a guess."""
    from test_identity import mint_many
    (good,) = mint_many([{"secret": NEW, "deployment": "deployment_unv",
                          "version": EX_VERSION}])
    conf = tmp_path / "p.conf"
    write_conf(conf, token_mode="disabled")
    s = start_server("--config", str(conf))
    bare = poll_status(s, "deployment_unv_bare")
    unverified = poll_status(s, good)
    s.wait_parked(2)
    write_conf(conf, token_mode="enforce", token_secret=NEW)
    hup(s)
    assert bare.read_response(timeout=5).status == 401
    assert unverified.wait_closed(timeout=5) == b""
    m = assert_ledger(s.metrics())
    assert m.settled("revoked") == 2 and m.parked_now == 0
    # polled again, the same token parks
    again = poll_status(s, good)
    assert again.silent_for(0.1)
    assert s.metrics().parked_now == 1


def test_reload_that_drops_a_secret_refuses_the_polls_it_signed(start_server, tmp_path):
    from test_identity import mint_many
    tok_old, tok_new = mint_many([
        {"secret": OLD, "deployment": "deployment_drop_old", "version": EX_VERSION},
        {"secret": NEW, "deployment": "deployment_drop_new", "version": EX_VERSION},
    ])
    conf = tmp_path / "p.conf"
    write_conf(conf, token_mode="enforce", token_secret=OLD)
    s = start_server("--config", str(conf))
    p_old = poll_status(s, tok_old)
    # the rotation: both verify, nothing parked is refused
    write_conf(conf, token_mode="enforce", token_secret=NEW, token_secret_previous=OLD)
    hup(s)
    p_new = poll_status(s, tok_new)
    s.wait_parked(2)
    assert p_old.silent_for(0.1) and p_new.silent_for(0.05)
    # the old secret dropped: what it signed would get 401 now, and does
    write_conf(conf, token_mode="enforce", token_secret=NEW)
    hup(s)
    r = p_old.read_response(timeout=5)
    assert r.status == 401 and r.json()["error"] == "invalid deployment token"
    assert p_new.silent_for(0.1)
    m = assert_ledger(s.metrics())
    assert m.settled("revoked") == 1 and m.parked_now == 1
    assert s.dispatch(make_message(deployment="deployment_drop_new")) is True
    assert p_new.read_response().status == 200


# -- a reload to a file that is no file -----------------------------------------

@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "two-mib", "long-line",
                                  "secret-fifo", "senseless"])
def test_reload_to_what_is_no_config_fails_counted_changing_nothing(start_server, tmp_path,
                                                                   kind):
    from test_config import make_hostile
    conf, secret = tmp_path / "p.conf", tmp_path / "secret"
    secret.write_text("s3cret\n")
    write_conf(conf, max_waiters=300, connection_timeout_ms=4321, token_mode="log",
               token_secret_file=secret)
    s = start_server("--config", str(conf))
    p = s.park()
    if kind == "secret-fifo":
        secret.unlink()
        os.mkfifo(secret)
        names, says = f"token_secret_file {secret}", "a FIFO, not a regular file"
    elif kind == "senseless":
        write_conf(conf, max_waiters=7, connection_timeout_ms=4321, park_timeout_ms=4000)
        names, says = "park_timeout_ms = 4000", "is not above connection_timeout_ms = 4321"
    else:
        conf.unlink()
        names, says = str(conf), make_hostile(kind, conf)
    hup(s, "reload failed: configuration unchanged")
    err = logged(s, "reload failed: configuration unchanged")[-1]["error"]
    assert names in err and says in err, err
    # the loop went on: nothing waited for the file
    assert get(s.port, "/healthz").status == 200
    m = s.metrics()
    assert m.get("pilotlight_config_reloads_total", result="error") == 1
    assert m.get("pilotlight_config_reloads_total", result="ok") == 0
    assert m.get("pilotlight_config_max_waiters") == 300
    assert s.get("/connect").json()["connectionTimeoutMs"] == 4321
    # token_mode is still log (a default would be disabled): a poll is checked
    q = s.park(deployment="deployment_after_reload")
    s.wait_metrics(lambda m: m.get("pilotlight_token_checks_total", result="legacy") == 2)
    assert p.silent_for(0.05) and q.silent_for(0.05)
    assert s.dispatch() is True
    assert json.loads(p.read_response().body)["run"]
