"""A drain in a key ring of two (ring_peers on loopback): on SIGTERM the
instance leaves the ring before anything else. Its parked poll is answered
307 to the other instance at once (outcome moved), it counts no members
while its drain delay runs (so a count over instances leaves it out, as
the ring alerts expect), and the other drops it at its next check."""

from conftest import HOST, free_port, park


def test_draining_instance_moves_its_polls_and_counts_no_members(start_server):
    ports = [free_port(), free_port()]
    names = [f"{HOST}:{p}" for p in ports]
    peers = ",".join(names)
    a, b = (start_server("--listen", n, "--ring-peers", peers, "--ring-self", n,
                         "--drain-delay-ms", "2000") for n in names)
    for s in (a, b):
        s.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 2, what="a ring of two")

    # A poll for a key a owns, parked on a (keys b owns are redirected).
    for i in range(64):
        c = park(a.port, wait=False, deployment=f"deployment_leave{i}")
        m = a.wait_metrics(lambda m: m.parked_now == 1 or
                           m.get("pilotlight_ring_redirects_total", route="poll") > i,
                           what="the poll parked or redirected")
        if m.parked_now == 1:
            break
        r = c.read_response()
        c.close()
        assert r.status == 307 and r.headers["location"].startswith(f"http://{names[1]}/"), r
    else:
        raise AssertionError("b owns 64 keys in a row")

    a.sigterm()
    r = c.read_response(timeout=5)
    c.close()
    assert r.status == 307, r
    assert r.headers["location"] == f"http://{names[1]}/warm-start?pl_hop=1"
    m = a.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 0, what="a to leave")
    assert m.settled("moved") == 1 and m.parked_now == 0
    b.wait_metrics(lambda m: m.get("pilotlight_ring_members") == 1, what="b to drop a")
    assert a.wait_exit() == 0
