"""Deployment tokens minted by the real `jose` (as Trigger.dev mints them) and
forgeries of them, checked against pilotlight's verifier.

tests/token/mint.mjs writes the vectors (with jose's own verdict on each);
the unit-test binary `test_token --vectors FILE` (next to the server binary
under test, in <builddir>/tests/) runs pl_token_verify() over them.
"""

import json
import os
import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOKEN_DIR = REPO / "tests" / "token"
BIN = pathlib.Path(os.environ.get("PILOTLIGHT_BIN", str(REPO / "build" / "pilotlight")))
DRIVER = BIN.parent / "tests" / "test_token"


def _ensure_jose():
    if (TOKEN_DIR / "node_modules" / "jose" / "package.json").exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install jose for the token vectors")
    proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=TOKEN_DIR,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"npm ci failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.fixture(scope="module")
def vectors(tmp_path_factory):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: cannot mint token vectors")
    _ensure_jose()
    out = tmp_path_factory.mktemp("token") / "vectors.json"
    proc = subprocess.run([node, "mint.mjs", str(out)], cwd=TOKEN_DIR,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"mint.mjs failed:\n{proc.stdout}\n{proc.stderr}"
    with open(out, encoding="utf-8") as f:
        data = json.load(f)
    data["path"] = out
    return data


def test_verifier_agrees_with_every_vector(vectors):
    assert DRIVER.is_file() and os.access(DRIVER, os.X_OK), \
        f"{DRIVER} not found: build pilotlight (ninja -C <builddir>) first"
    proc = subprocess.run([str(DRIVER), "--vectors", str(vectors["path"])],
                          capture_output=True, text=True, timeout=60)
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert proc.returncode == 0 and not failures, proc.stdout + proc.stderr
    assert f"{len(vectors['vectors'])} vectors, 0 failed" in proc.stdout
    for mark in ("AddressSanitizer", "runtime error:", "LeakSanitizer"):
        assert mark not in proc.stderr, proc.stderr
    names = {v["name"] for v in vectors["vectors"]}
    for required in ("trigger-minted", "alg-none-unsecured", "alg-hs512", "crit",
                     "duplicate-header-key", "duplicate-payload-key", "too-long",
                     "legacy-bare-id", "absent"):
        assert required in names


def test_never_more_lenient_than_trigger_dev(vectors):
    """Whatever pilotlight accepts, jose + Trigger.dev's claims schema accept;
    where pilotlight refuses what they accept, the vector says why."""
    for v in vectors["vectors"]:
        if v["expect"] == "valid":
            assert v["jose"] == "valid", v["name"]
        elif v["expect"] == "invalid":
            if v["jose"] == "valid":
                assert v.get("stricter"), f"{v['name']}: jose accepts it, pilotlight refuses it, no reason given"
            else:
                assert not v.get("stricter"), f"{v['name']}: marked stricter, but jose refuses it too"


def test_minted_exactly_as_trigger_dev(vectors):
    """With tests/compat installed, Trigger.dev's own mint gives the same bytes."""
    if vectors["trigger_core"] == "unavailable":
        pytest.skip("@trigger.dev/core not installed in tests/compat")
    assert vectors["trigger_core"] == "identical"
