"""Configuration: --check-config, bad values, precedence flag > env > file,
--help and --version."""

import os
import re
import time

import pytest

from conftest import UNDER_VALGRIND, run_binary


def shows(output, name, value):
    """True if <output> gives setting <name> (snake_case) the value <value>,
    written as `name = value`, `name: value`, `--name value` or JSON."""
    kebab = name.replace("_", "-")
    camel = re.sub(r"_(\w)", lambda m: m.group(1).upper(), name)
    pat = r"(?:%s|%s|%s)[\"']?\s*[:=]?\s*[\"']?%s\b" % (
        re.escape(name), re.escape(kebab), re.escape(camel), re.escape(str(value)))
    return re.search(pat, output) is not None


def test_check_config_prints_effective_configuration(tmp_path):
    rc, out, err = run_binary("--check-config", "--park-timeout-ms", "31234",
                              "--match-order=lifo", "--listen", "127.0.0.1:0")
    text = out + err
    assert rc == 0, text
    assert shows(text, "park_timeout_ms", 31234), text
    assert shows(text, "match_order", "lifo"), text
    # Defaults are part of the effective configuration too.
    assert shows(text, "max_waiters_per_key", 10000), text
    assert shows(text, "connection_timeout_ms", 30000), text
    assert shows(text, "max_body_bytes", 1048576), text


@pytest.mark.parametrize("args,setting", [
    (("--match-order", "sideways"), "match_order"),
    (("--max-waiters", "-1"), "max_waiters"),
    (("--listen", "nope"), "listen"),
    (("--listen", "127.0.0.1:99999"), "listen"),
    (("--park-timeout-ms", "abc"), "park_timeout_ms"),
    (("--max-body-bytes=12x",), "max_body_bytes"),
    (("--log-level", "loud"), "log_level"),
    (("--max-waiters-per-key", "18446744073709551616"), "max_waiters_per_key"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_value_exits_nonzero_naming_the_setting(args, setting):
    # --listen 127.0.0.1:0 first, so a wrongly accepted value would start a
    # server (and time out) instead of binding 8080.
    rc, out, err = run_binary("--listen", "127.0.0.1:0", *args)
    text = out + err
    assert rc != 0, f"{args} accepted: {text}"
    assert setting in text or setting.replace("_", "-") in text, text


def test_bad_value_in_check_config_exits_nonzero():
    rc, out, err = run_binary("--check-config", "--match-order", "sideways")
    assert rc != 0
    assert "match_order" in out + err or "match-order" in out + err


def test_flag_without_value_exits_nonzero():
    rc, out, err = run_binary("--listen", "127.0.0.1:0", "--park-timeout-ms")
    assert rc != 0
    assert "park" in out + err


def test_unknown_flag_exits_nonzero():
    rc, out, err = run_binary("--listen", "127.0.0.1:0", "--frobnicate", "3")
    assert rc != 0
    assert "frobnicate" in out + err


def test_bad_env_value_exits_nonzero_naming_it():
    rc, out, err = run_binary("--listen", "127.0.0.1:0",
                              env={"PILOTLIGHT_MATCH_ORDER": "sideways"})
    text = out + err
    assert rc != 0
    assert "match_order" in text.lower() or "match-order" in text.lower(), text


def test_bad_file_value_exits_nonzero_naming_it(tmp_path):
    cfg = tmp_path / "pilotlight.conf"
    cfg.write_text("match_order = sideways\n")
    rc, out, err = run_binary("--listen", "127.0.0.1:0", "--config", str(cfg))
    assert rc != 0
    assert "match_order" in out + err


def test_missing_config_file_exits_nonzero(tmp_path):
    rc, out, err = run_binary("--listen", "127.0.0.1:0", "--config",
                              str(tmp_path / "absent.conf"))
    assert rc != 0
    assert "absent.conf" in out + err


def _write_config(tmp_path):
    cfg = tmp_path / "pilotlight.conf"
    cfg.write_text("connection_timeout_ms = 1111\n"
                   "keepalive_ms = 2222\n"
                   "park_timeout_ms = 9999\n")
    return cfg


def test_precedence_flag_over_env_over_file(start_server, tmp_path):
    cfg = str(_write_config(tmp_path))
    # File alone.
    s = start_server("--config", cfg)
    assert s.get("/connect").json() == {"connectionTimeoutMs": 1111, "keepaliveMs": 2222}
    s.stop()
    # Env overrides file (the file named by PILOTLIGHT_CONFIG).
    s = start_server(env={"PILOTLIGHT_CONFIG": cfg,
                          "PILOTLIGHT_CONNECTION_TIMEOUT_MS": "4444"})
    assert s.get("/connect").json() == {"connectionTimeoutMs": 4444, "keepaliveMs": 2222}
    s.stop()
    # Flag overrides env, which overrides file.
    s = start_server("--config", cfg, "--connection-timeout-ms=5555",
                     env={"PILOTLIGHT_CONNECTION_TIMEOUT_MS": "4444",
                          "PILOTLIGHT_KEEPALIVE_MS": "6666"})
    assert s.get("/connect").json() == {"connectionTimeoutMs": 5555, "keepaliveMs": 6666}


def test_precedence_seen_by_check_config(tmp_path):
    cfg = str(_write_config(tmp_path))
    rc, out, err = run_binary("--check-config", "--config", cfg,
                              "--keepalive-ms", "7777",
                              env={"PILOTLIGHT_PARK_TIMEOUT_MS": "8888",
                                   "PILOTLIGHT_KEEPALIVE_MS": "9999"})
    text = out + err
    assert rc == 0, text
    assert shows(text, "connection_timeout_ms", 1111), text   # file
    assert shows(text, "park_timeout_ms", 8888), text         # env over file
    assert shows(text, "keepalive_ms", 7777), text            # flag over env


def test_park_timeout_from_env_takes_effect(start_server):
    s = start_server(env={"PILOTLIGHT_PARK_TIMEOUT_MS": "200",
                          "PILOTLIGHT_CONNECTION_TIMEOUT_MS": "150"})
    r = s.park().read_response(timeout=5)
    assert r.status == 204, r


def test_help_exits_zero():
    rc, out, err = run_binary("--help")
    assert rc == 0
    text = out + err
    for flag in ("--listen", "--park-timeout-ms", "--match-order", "--check-config"):
        assert flag in text, flag


def test_version_exits_zero():
    rc, out, err = run_binary("--version")
    assert rc == 0
    assert re.search(r"\d+\.\d+\.\d+", out + err), out + err


# -- what a configuration file may be ------------------------------------------

# The comment line whose tail a 1,023-byte line buffer once read as a setting.
LONG_LINE = "#" + "x" * 1022 + "connection_timeout_ms = 777\n"


def make_hostile(kind, p):
    """Makes <p> (a Path, absent) a config path that is no config file;
    returns what the error must say about it."""
    if kind == "fifo":
        os.mkfifo(p)  # nobody writes to it: reading it would wait forever
        return "a FIFO, not a regular file"
    if kind == "dev-zero":
        p.symlink_to("/dev/zero")  # endless: read to its end, never
        return "a character device, not a regular file"
    if kind == "directory":
        p.mkdir()
        return "a directory, not a regular file"
    if kind == "two-mib":
        p.write_text("# a comment\n" * (2 * 1024 * 1024 // 12 + 1))
        return "more than 1048576 bytes"
    assert kind == "long-line"
    p.write_text(LONG_LINE)
    return ":1: line longer than 1024 bytes"


def hostile_path(kind, tmp_path):
    """A config path that is not a config file: (path, what the error says)."""
    p = tmp_path / f"{kind}.conf"
    return str(p), make_hostile(kind, p)


HOSTILE = ["fifo", "dev-zero", "directory", "two-mib", "long-line"]
# Refused at once: within a second (under valgrind, whose start and exit
# alone take about that, within ten; what blocks would block for ever).
AT_ONCE = 10.0 if UNDER_VALGRIND else 1.0


@pytest.mark.parametrize("check", [False, True], ids=["start", "check-config"])
@pytest.mark.parametrize("kind", HOSTILE)
def test_config_path_that_is_no_file_is_refused_at_once(kind, check, tmp_path):
    path, says = hostile_path(kind, tmp_path)
    args = ["--check-config"] if check else ["--listen", "127.0.0.1:0"]
    t0 = time.monotonic()
    rc, out, err = run_binary(*args, "--config", path, timeout=AT_ONCE)
    assert rc == 2, (rc, out, err)
    assert path in err and says in err, err
    assert time.monotonic() - t0 < AT_ONCE
    # the same file named by the environment
    rc, out, err = run_binary(*args, env={"PILOTLIGHT_CONFIG": path}, timeout=AT_ONCE)
    assert rc == 2 and says in err, (rc, err)


@pytest.mark.parametrize("check", [False, True], ids=["start", "check-config"])
@pytest.mark.parametrize("name", ["token_secret_file", "token_secret_previous_file"])
def test_secret_file_that_is_a_fifo_is_refused_at_once(name, check, tmp_path):
    fifo = tmp_path / "secret"
    os.mkfifo(fifo)
    conf = tmp_path / "p.conf"
    conf.write_text(f"token_mode = enforce\ntoken_secret = s3cret\n{name} = {fifo}\n")
    args = ["--check-config"] if check else ["--listen", "127.0.0.1:0"]
    rc, out, err = run_binary(*args, "--config", str(conf), timeout=AT_ONCE)
    assert rc == 2, (rc, out, err)
    assert f"{name} {fifo}: a FIFO, not a regular file" in err, err


def test_config_through_a_symlink_is_read(tmp_path):
    """A Kubernetes ConfigMap's file is a symlink (to a symlink) to the data."""
    data = tmp_path / "..data"
    data.mkdir()
    (data / "pilotlight.conf").write_text("max_waiters = 4321\n")
    link = tmp_path / "pilotlight.conf"
    link.symlink_to(data / "pilotlight.conf")
    rc, out, err = run_binary("--check-config", "--config", str(link))
    assert rc == 0 and shows(out, "max_waiters", 4321), err


# -- settings that cannot work together ------------------------------------------

SENSELESS = [
    # (flags, what the refusal must say, and why)
    (("--park-timeout-ms", "30000"),
     "park_timeout_ms = 30000 is not above connection_timeout_ms = 30000", "backs off"),
    (("--park-timeout-ms", "1000", "--connection-timeout-ms", "2000"),
     "park_timeout_ms = 1000 is not above connection_timeout_ms = 2000", "backs off"),
    (("--connection-timeout-ms", "300000"), "connection_timeout_ms = 300000 is not below",
     "backs off"),
    (("--max-header-bytes", "512"), "max_header_bytes = 512 is below 1024", "431"),
    (("--max-body-bytes", "100"), "max_body_bytes = 100 is below 1024", "413"),
]


@pytest.mark.parametrize("check", [False, True], ids=["start", "check-config"])
@pytest.mark.parametrize("flags,says,why", SENSELESS,
                         ids=[" ".join(c[0]) for c in SENSELESS])
def test_settings_that_cannot_work_are_refused_saying_why(flags, says, why, check):
    args = ["--check-config"] if check else ["--listen", "127.0.0.1:0"]
    rc, out, err = run_binary(*args, *flags)
    assert rc == 2, (rc, out, err)
    assert says in err and why in err, err


def test_park_timeout_just_above_the_connection_timeout_is_taken():
    rc, out, err = run_binary("--check-config", "--connection-timeout-ms", "2000",
                              "--park-timeout-ms", "2001")
    assert rc == 0 and shows(out, "park_timeout_ms", 2001), err
