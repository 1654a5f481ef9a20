"""The match key: numbers compare as numbers, JWT-shaped deployment ids
park under their `deployment` claim, and the match order."""

import base64
import json
import select

import pytest

from conftest import make_message, read_payload


def message_text(cpu_text, memory_text, run_id="run_numbers"):
    """The dispatch body as JSON text, with cpu and memory written by hand."""
    m = make_message(cpu="@CPU@", memory="@MEM@", run_id=run_id)
    text = json.dumps({"dequeuedMessage": m})
    return text.replace('"@CPU@"', cpu_text).replace('"@MEM@"', memory_text)


def test_header_numbers_match_json_numbers_written_differently(server):
    w = server.park(cpu="1", memory="0.5")
    r = server.dispatch_raw(message_text("1.0", "5e-1"))
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    got = read_payload(w)
    assert got["run"]["machine"]["cpu"] == 1 and got["run"]["machine"]["memory"] == 0.5
    assert got["run"]["friendlyId"] == "run_numbers"


@pytest.mark.parametrize("cpu_hdr,mem_hdr,cpu_json,mem_json", [
    ("0.25", "0.25", "0.25", "0.25"),
    ("1", "1", "1", "1"),
    ("2", "4", "2.00", "4e0"),
    ("4", "8", "4", "0.8e1"),
    ("0.5", "1", "5E-1", "1.0"),
    ("1.0", "0.50", "1", "0.5"),
])
def test_numbers_match(server, cpu_hdr, mem_hdr, cpu_json, mem_json):
    w = server.park(cpu=cpu_hdr, memory=mem_hdr)
    r = server.dispatch_raw(message_text(cpu_json, mem_json))
    assert r.status == 200 and r.json() == {"didWarmStart": True}, r
    read_payload(w)


@pytest.mark.parametrize("cpu_hdr,mem_hdr,cpu_json,mem_json", [
    ("2", "0.5", "1", "0.5"),
    ("0.5", "0.5", "0.25", "0.5"),
    ("1", "0.5", "1.5", "0.5"),
    ("1", "1", "1", "0.5"),
])
def test_different_numbers_do_not_match(server, cpu_hdr, mem_hdr, cpu_json, mem_json):
    w = server.park(cpu=cpu_hdr, memory=mem_hdr)
    r = server.dispatch_raw(message_text(cpu_json, mem_json))
    assert r.status == 200 and r.json() == {"didWarmStart": False}, r
    assert w.silent_for(0.05)
    assert server.metrics().parked_now == 1


def test_version_and_deployment_compare_exactly(server):
    w = server.park(deployment="deployment_Case", version="1.10")
    assert server.dispatch(make_message(deployment="deployment_case", version="1.10")) is False
    assert server.dispatch(make_message(deployment="deployment_Case", version="1.1")) is False
    assert server.dispatch(make_message(deployment="deployment_Case", version="1.10")) is True
    read_payload(w)


# -- deployment tokens -----------------------------------------------------------

def b64url(obj):
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def deployment_token(deployment):
    header = {"alg": "HS256", "typ": "JWT"}
    claims = {
        "ver": 1,
        "deployment": deployment,
        "deployment_version": "20261130.1",
        "environment_id": "env_123",
        "environment_type": "PRODUCTION",
        "org_id": "org_123",
        "project_id": "proj_123",
        "iss": "https://id.trigger.dev",
        "aud": "https://api.trigger.dev",
        "exp": 4102444800,
    }
    # Unsigned here: the signature segment is just non-empty base64url.
    return f"{b64url(header)}.{b64url(claims)}.c2lnbmF0dXJlLW5vdC1jaGVja2Vk"


def test_jwt_shaped_deployment_header_parks_under_its_claim(server):
    token = deployment_token("deployment_x")
    w = server.park(deployment=token)
    # Not under the raw header value...
    assert server.dispatch(make_message(deployment=token)) is False
    # ...but under the deployment claim.
    msg = make_message(deployment="deployment_x", run_id="run_token")
    assert server.dispatch(msg) is True
    assert read_payload(w) == msg


def test_jwt_and_legacy_id_share_a_key(server):
    a = server.park(deployment=deployment_token("deployment_y"))
    b = server.park(deployment="deployment_y")
    m = server.wait_parked(2)
    assert m.keys_now == 1
    assert server.dispatch(make_message(deployment="deployment_y")) is True
    assert server.dispatch(make_message(deployment="deployment_y")) is True
    read_payload(a)
    read_payload(b)


# -- match order -----------------------------------------------------------------

def _park_three(s):
    return [s.park(controller_id=f"controller_{n}") for n in ("old", "mid", "new")]


def _who_got_it(polls, run_id):
    """Indexes of the polls that were answered (each must carry <run_id>)."""
    select.select([p.sock for p in polls], [], [], 3.0)  # the first answer
    got = []
    for i, p in enumerate(polls):
        if not p.silent_for(0.05):
            assert read_payload(p)["run"]["friendlyId"] == run_id
            got.append(i)
    return got


def test_fifo_is_default_and_gives_oldest_first(server):
    polls = _park_three(server)
    assert server.dispatch(make_message(run_id="run_1")) is True
    assert _who_got_it(polls, "run_1") == [0]
    assert server.dispatch(make_message(run_id="run_2")) is True
    assert _who_got_it(polls[1:], "run_2") == [0]


def test_lifo_gives_newest_first(start_server):
    s = start_server("--match-order", "lifo")
    polls = _park_three(s)
    assert s.dispatch(make_message(run_id="run_1")) is True
    assert _who_got_it(polls, "run_1") == [2]
    assert s.dispatch(make_message(run_id="run_2")) is True
    assert _who_got_it(polls[:2], "run_2") == [1]
