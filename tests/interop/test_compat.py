"""Compatibility: pilotlight driven by Trigger.dev's real WarmStartClient (tests/compat)."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import threading

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
COMPAT = REPO / "tests" / "compat"
BIN = os.environ.get("PILOTLIGHT_BIN", str(REPO / "build" / "pilotlight"))
# Short enough that the "repoll" case sees the client abort and re-poll quickly.
CONNECTION_TIMEOUT_MS = 1500


def _ensure_node_modules():
    if (COMPAT / "node_modules" / "@trigger.dev" / "core" / "package.json").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install @trigger.dev/core for the compat test")
    proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=COMPAT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout}\n{proc.stderr}"


class Server:
    """The real binary on 127.0.0.1:<ephemeral>, stderr collected by a thread."""

    def __init__(self, *args):
        assert os.access(BIN, os.X_OK), f"pilotlight binary not found at {BIN} (build it or set PILOTLIGHT_BIN)"
        self.proc = subprocess.Popen([BIN, "--listen", "127.0.0.1:0", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.address = None
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._listening.wait(10):
            self.proc.kill()
            pytest.fail("no 'listening' log line within 10 s:\n" + self.stderr())

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if self.address is None:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("msg") == "listening":
                    self.address = rec["address"]
                    self._listening.set()
        self._listening.set()

    def stderr(self):
        return "".join(self.lines)

    def stop(self, timeout=15):
        """SIGTERM and wait; returns the exit code (kills and fails on timeout)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"server did not exit within {timeout} s of SIGTERM")
        self._reader.join(5)
        return code


def _run_client(node, port, cases=(), env=None):
    """Runs compat.mjs against 127.0.0.1:<port> (every case, or <cases>);
    returns the process and its last JSON line ({} without one)."""
    proc = subprocess.run([node, str(COMPAT / "compat.mjs"), f"http://127.0.0.1:{port}"]
                          + [a for c in cases for a in ("--case", c)],
                          capture_output=True, text=True, timeout=90,
                          env={**os.environ, **(env or {})})
    lines = proc.stdout.strip().splitlines()
    return proc, json.loads(lines[-1]) if lines else {}


def test_trigger_dev_warm_start_client():
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the compat test needs them")
    _ensure_node_modules()
    server = Server("--connection-timeout-ms", str(CONNECTION_TIMEOUT_MS),
                    "--keepalive-ms", "20000", "--log-level", "info")
    try:
        assert server.address, "listening line had no address:\n" + server.stderr()
        port = server.address.rsplit(":", 1)[1]
        proc, result = _run_client(node, port)
        detail = (f"result: {json.dumps(result, indent=1)}\nclient stderr (tail):\n{proc.stderr[-3000:]}"
                  f"\nserver stderr (tail):\n{server.stderr()[-3000:]}")
        assert proc.returncode == 0 and result.get("ok") is True, detail
        assert set(result["cases"]) == {"match", "dotted", "abort", "repoll"}, detail
        assert "skipped" not in result["cases"]["repoll"], detail
    finally:
        code = server.stop()
    log = server.stderr()
    assert code == 0, f"exit code {code}:\n{log[-3000:]}"
    assert "AddressSanitizer" not in log and "runtime error:" not in log, log[-5000:]


def test_trigger_dev_warm_start_client_through_haproxy(tmp_path):
    """The same client through deploy/haproxy/haproxy.cfg (one instance on
    all three server lines, so /metrics is that instance's): the proxy's
    routing, its abort propagation and its dotted-id rule. Not "repoll":
    through the proxy a timed-out poll's close and its successor race to the
    instance, so the old poll may end replaced instead of disconnected,
    which that case tells apart."""
    from test_haproxy import HAPROXY, WHY_SKIP, Proxy
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the compat test needs them")
    if HAPROXY is None:
        pytest.skip(WHY_SKIP)
    _ensure_node_modules()
    server = Server("--connection-timeout-ms", str(CONNECTION_TIMEOUT_MS),
                    "--keepalive-ms", "20000", "--log-level", "info")
    server.port = int(server.address.rsplit(":", 1)[1])
    proxy = Proxy([server] * 3, str(tmp_path))
    try:
        cases = ["match", "dotted", "abort"]
        proc, result = _run_client(node, proxy.port, cases)
        detail = (f"result: {json.dumps(result, indent=1)}\nclient stderr (tail):\n{proc.stderr[-3000:]}"
                  f"\nhaproxy log (tail):\n{proxy.log()[-3000:]}")
        assert proc.returncode == 0 and result.get("ok") is True, detail
        assert set(result["cases"]) == set(cases), detail
        dotted = result["cases"]["dotted"]["deploymentId"]
        assert any(key.startswith(dotted + " ") for key, _ in proxy.routing_keys()), detail
    finally:
        proxy.stop()
        code = server.stop()
    assert code == 0, server.stderr()[-3000:]


def test_trigger_dev_client_leaves_when_warm_starts_go_off(tmp_path):
    """warm_starts = off by SIGHUP, with the real client: its parked
    warmStart() comes back with no run (the run controller then exits),
    /connect answers 0 (so would every controller finishing a run), a
    dispatch is false; on again, a new controller gets its run."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the compat test needs them")
    _ensure_node_modules()
    conf = tmp_path / "pilotlight.conf"
    conf.write_text("warm_starts = on\n")
    server = Server("--config", str(conf), "--connection-timeout-ms", "20000",
                    "--keepalive-ms", "60000")
    try:
        port = server.address.rsplit(":", 1)[1]
        proc, result = _run_client(node, port, ["off"],
                                   env={"PL_COMPAT_CONF": str(conf),
                                        "PL_COMPAT_PID": str(server.proc.pid)})
        detail = (f"result: {json.dumps(result, indent=1)}\nclient stderr (tail):\n"
                  f"{proc.stderr[-3000:]}\nserver stderr (tail):\n{server.stderr()[-3000:]}")
        assert proc.returncode == 0 and result.get("ok") is True, detail
        off = result["cases"]["off"]
        print(f"warm_starts = off: the parked client had its answer {off['leftMs']} ms "
              "after SIGHUP")
        assert off["offConnect"] == {"connectionTimeoutMs": 0, "keepaliveMs": 0}, detail
    finally:
        code = server.stop()
    assert code == 0, server.stderr()[-3000:]


def test_no_true_for_a_run_the_client_is_about_to_abandon():
    """The real client aborts each poll at connectionTimeoutMs (1 s here,
    its own timer) and polls again; a run dispatched into the last
    milliseconds of a poll must not be answered true unless that client
    returns it. pilotlight passes over the polls too near their end."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        pytest.skip("node/npm are not installed: the compat test needs them")
    _ensure_node_modules()
    server = Server("--connection-timeout-ms", "1000", "--keepalive-ms", "120000")
    try:
        port = server.address.rsplit(":", 1)[1]
        proc, result = _run_client(node, port, ["expiring"])
        detail = (f"result: {json.dumps(result, indent=1)}\nclient stderr (tail):\n"
                  f"{proc.stderr[-3000:]}\nserver stderr (tail):\n{server.stderr()[-3000:]}")
        assert proc.returncode == 0 and result.get("ok") is True, detail
        exp = result["cases"]["expiring"]
        print(f"expiring: {exp}")
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        passed = next(float(ln.split()[1]) for ln in text.splitlines()
                      if ln.startswith("pilotlight_expiring_passed_total "))
        # the window was hit: some polls were passed over, and some runs
        # still went through (offered early enough)
        assert passed > 0 and exp["trueAnswers"] > 0, (passed, detail)
    finally:
        code = server.stop()
    assert code == 0, server.stderr()[-3000:]
