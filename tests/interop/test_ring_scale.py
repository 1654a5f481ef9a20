"""Scale-out without a proxy: the key ring changing under load, behind a
Kubernetes-style L4 Service (tests/ring_lab.py).

Three pilotlight instances with --ring-peers naming four addresses, a
virtual IP DNATed at random to the ready ones (nftables, a readiness probe
every 200 ms), 300 controllers over 100 keys parked through it (60 of them
Trigger.dev's real WarmStartClient, tests/compat/controllers.mjs; the others
ring_lab's model of it), 60 dispatches/s through it under delivery =
confirm. Then, 5 s apart: a 4th instance starts; one of the four is drained
(SIGTERM, drain_delay_ms 2000 as the deployment files set it); it starts
again; one of the four is SIGKILLed. After a join, a drain or a return: a
few misses at most (false or no answer: the run starts cold), none after
the first second; throughout, no run received twice and no `true` for a
run nobody received.

The bound on misses: HAProxy with key affinity lost 57-97 dispatches when a
4th instance joined (402 at the default poll lifetime), 11-15 on a drain,
0-1 on a SIGKILL, in the same set-up. The ring is to lose at most 1 % of
the first, "a few": MISSES_MAX per event. A SIGKILL costs more, for
reasons outside the ring, which the test tells apart: the killed
instance's controllers see their polls cut and wait out their client's
back-off (0 or 1 s for a first error) before polling again, and the
Service sends new connections to the dead instance until its readiness
probe fails. Misses of the ring's own making (a redirect to the dead
instance, a stale view) stay within MISSES_MAX. loadtest/ring-scale runs
the same sequence repeatedly and prints what each event cost, and why.

Skipped, saying why, without root, iproute2, nftables (deploy/install-deps.sh
--test installs them) or node with tests/compat's node_modules.
"""
import pytest

import impair
import ring_lab
from conftest import BIN

# "A few" per event, as the acceptance puts it; what a window before any
# event misses (none in every run measured) is not subtracted.
MISSES_MAX = 3
RECOVERY_MAX_S = 1.0
# A SIGKILL: what the back-off of the cut controllers and the Service's
# probe period cost on top (measured 1-9 per kill), and the back-off's
# second plus a redirect.
KILL_MISSES_MAX = 12
KILL_RECOVERY_MAX_S = 1.5
# Causes (ring_lab.CAUSES) that are the ring's own doing.
RING_CAUSES = ("early", "in_flight", "stale_hop", "stale_307", "backoff_refused_307")
NODE_KEYS = range(20)  # 60 controllers: the real client on 20 of the 100 keys


@pytest.fixture(scope="module")
def sequence(request):
    why = ring_lab.why_unavailable() or impair.ensure_node_modules()
    if why:
        pytest.skip(why)
    out = ring_lab.run_sequence(BIN, keys=100, per_key=3, node_keys=NODE_KEYS, rate=60.0,
                                baseline_s=3.0, window_s=5.0)
    impair.show(request, "key ring under load:\n" + ring_lab.describe(out))
    return out


def test_fleet_and_dispatches_as_the_acceptance_sets_them(sequence):
    """The set-up is the one the figures are about: every dispatch of the
    quiet window found its poll, and the real client took part."""
    b, a = sequence["baseline"], sequence["all"]
    assert b["dispatches"] >= 100 and b["misses"] == 0, ring_lab.describe(sequence)
    assert a["dispatches"] >= 1000, ring_lab.describe(sequence)
    assert sequence["owner_model"][1] == 0, "ring_lab's owner() disagrees with the redirects"
    assert not sequence["sanitizer_reports"], "\n".join(sequence["sanitizer_reports"])


def test_no_run_twice_and_no_true_for_a_lost_run(sequence):
    a = sequence["all"]
    broken = {k: a[k] for k in ("duplicates", "true_unreceived", "false_received")}
    broken["stray"] = sequence["stray"]
    assert broken == dict.fromkeys(broken, 0), ring_lab.describe(sequence)


@pytest.mark.parametrize("event", ["add", "drain", "readd", "kill"])
def test_an_event_costs_a_few_misses_for_under_a_second(sequence, event):
    f = next(e for e in sequence["events"] if e["name"] == event)
    text = ring_lab.describe(sequence)
    # The event happened as intended: the ring saw it and moved keys.
    assert f["dispatches"] >= 200, text
    if event in ("add", "readd", "drain"):
        assert f["ring_total"]["moved"] > 0 and f["ring_total"]["redirects_dispatch"] > 0, text
    ours = sum(n for cause, n in f["causes"].items() if cause in RING_CAUSES)
    most, recovery = (KILL_MISSES_MAX, KILL_RECOVERY_MAX_S) if event == "kill" else \
        (MISSES_MAX, RECOVERY_MAX_S)
    assert ours <= MISSES_MAX, f"{event}: {ours} misses of the ring's making ({f['causes']})\n{text}"
    assert f["misses"] <= most, f"{event}: {f['misses']} misses ({f['causes']})\n{text}"
    assert f["recovery_s"] <= recovery, f"{event}: last miss {f['recovery_s']:.2f} s " \
                                        f"after it ({f['causes']})\n{text}"
