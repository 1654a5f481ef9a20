"""Scale-out without a proxy: the key ring changing under load, behind a
Kubernetes-style L4 Service (tests/harness/ring_lab.py).

Three pilotlight instances, a virtual IP DNATed at random to the ready ones
(nftables, a readiness probe every 200 ms), 300 controllers over 100 keys
parked through it (60 of them Trigger.dev's real WarmStartClient,
tests/compat/controllers.mjs; the others ring_lab's model of it), 60
dispatches/s through it under delivery = confirm. Two sequences:

- ring_peers: a 4th instance joins the documented way, started with the
  new list while the others get it and a SIGHUP one after another, the
  last STAGGER_S after the first; one of the four is drained (SIGTERM,
  drain_delay_ms 2000 as the deployment files set it); it starts again
  (every list names it: a join by a list made in advance); one of the four
  is SIGKILLed. Each window 5 s after its change has reached every
  instance.
- ring_dns (ring_resolve_ms 5000): a 4th starts under the name, which the
  DNS lists for every instance from then on (each instance's own
  /etc/hosts, all changed at once); each looks it up at its own moment,
  up to ring_resolve_ms apart, or when a check shows it a view other than
  its own.

After a join, a drain or a return: a few misses at most (false or no
answer: the run starts cold); by DNS, none later than a second after the
first instance counted the change; by lists reloaded one after another,
none later than a second after an instance took the change. Throughout, no
poll or dispatch redirected more than twice while views disagree (the
clients follow 20 redirects and fail at the 21st, as fetch does), no run
received twice, no `true` for a run nobody received and no `false` for one
received.

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
the same sequences (and views that disagree for good) repeatedly and
prints what each event cost, and why, and with --stagger DNS caches that
expire at different moments.

Skipped, saying why, without root, iproute2, nftables (deploy/install-deps.sh
--test installs them) or node with tests/compat's node_modules.
"""
import pytest

import impair
import ring_lab
from conftest import BIN

# "A few" per event: at most 1 % of what HAProxy lost on a join; what a
# window before any event misses (none in every run measured) is not
# subtracted.
MISSES_MAX = 3
# Each miss of a join by DNS, after the first instance that counted the
# change (the newcomer itself: the others look the name up again as soon
# as its checks show them another view; they took it 0.5-1.0 s after it). Of a join, a drain or a return by lists reloaded
# one after another over STAGGER_S, after the latest instance that had taken
# the change before it: each reload is a moment where a dispatch in flight
# may miss (one the newcomer sends on to a key's old owner as that one
# moves the key's polls: cause stale_hop).
LATE_MAX_S = 1.0
# A SIGKILL: what the back-off of the cut controllers and the Service's
# probe period cost on top (measured 1-9 per kill), and the back-off's
# second plus a redirect.
KILL_MISSES_MAX = 12
KILL_RECOVERY_MAX_S = 1.5
NODE_KEYS = range(20)  # 60 controllers: the real client on 20 of the 100 keys
# A change of the list reaches the instances over this long: reloads done
# one after another (as DNS caches that expire at different moments would,
# loadtest/ring-scale --stagger). A DNS answer changes for all at once.
STAGGER_S = ring_lab.STAGGER_S


def run(request, sequence, events, stagger_s):
    why = ring_lab.why_unavailable() or impair.ensure_node_modules()
    if why:
        pytest.skip(why)
    out = ring_lab.run_sequence(BIN, sequence=sequence, events=events, keys=100, per_key=3,
                                node_keys=NODE_KEYS, rate=60.0, baseline_s=3.0, window_s=5.0,
                                stagger_s=stagger_s)
    impair.show(request, f"key ring under load ({sequence}):\n" + ring_lab.describe(out))
    return out


@pytest.fixture(scope="module")
def by_list(request):
    return run(request, "list", ("add", "drain", "readd", "kill"), STAGGER_S)


@pytest.fixture(scope="module")
def by_dns(request):
    return run(request, "dns", ("add",), 0.0)


@pytest.fixture(params=["list", "dns"])
def sequence(request):
    return request.getfixturevalue(f"by_{request.param}")


def test_fleet_and_dispatches_as_the_figures_are_about(sequence):
    """The set-up is the one the figures are about: every dispatch of the
    quiet window found its poll, and the real client took part."""
    b, a = sequence["baseline"], sequence["all"]
    assert b["dispatches"] >= 100 and b["misses"] == 0, ring_lab.describe(sequence)
    # 60/s over the baseline's 3 s and a 5 s window at least
    assert a["dispatches"] >= 400, ring_lab.describe(sequence)
    assert sequence["owner_model"][1] == 0, "ring_lab's owner() disagrees with the redirects"
    assert not sequence["sanitizer_reports"], "\n".join(sequence["sanitizer_reports"])


def test_no_run_twice_and_no_true_for_a_lost_run(sequence):
    a = sequence["all"]
    broken = {k: a[k] for k in ("duplicates", "true_unreceived", "false_received")}
    broken["stray"] = sequence["stray"]
    assert broken == dict.fromkeys(broken, 0), ring_lab.describe(sequence)


def test_no_request_redirected_more_than_twice_in_a_change(sequence):
    """The hop rule: whatever the views, a poll or a dispatch is redirected
    at most twice (counting the redirect it came into the change with), so
    no client reaches fetch's limit."""
    text = ring_lab.describe(sequence)
    for f in [sequence["baseline"], *sequence["events"]]:
        most = f["redirects_most"]
        assert max(most.values()) <= 2, f"{f.get('name', 'baseline')}: {most} {f['over_2']}\n{text}"
        assert f["redirect_limit"] == 0, text


@pytest.mark.parametrize("seq,event", [("list", "add"), ("list", "drain"), ("list", "readd"),
                                       ("list", "kill"), ("dns", "add")])
def test_an_event_costs_a_few_misses_for_under_a_second(request, seq, event):
    out = request.getfixturevalue(f"by_{seq}")
    f = next(e for e in out["events"] if e["name"] == event)
    text = ring_lab.describe(out)
    # The event happened as intended: every instance counted it, and the
    # ring moved keys.
    assert f["dispatches"] >= 200, text
    assert f["all_seen_s"] is not None, f"{event}: not every instance counted it\n{text}"
    if event != "kill":
        assert f["ring_total"]["moved"] > 0 and f["ring_total"]["redirects_dispatch"] > 0, text
    if event == "kill":
        assert f["misses"] <= KILL_MISSES_MAX, f"kill: {f['misses']} misses ({f['causes']})\n{text}"
        assert f["recovery_s"] <= KILL_RECOVERY_MAX_S, \
            f"kill: last miss {f['recovery_s']:.2f} s after it ({f['causes']})\n{text}"
        return
    assert f["misses"] <= MISSES_MAX, f"{seq} {event}: {f['misses']} misses ({f['causes']})\n{text}"
    if seq == "dns":  # the others look again as soon as they hear of it
        assert f["misses"] == 0 or f["late_s"] <= LATE_MAX_S, \
            f"dns {event}: a miss {f['late_s']:.2f} s after the first instance counted the " \
            f"change ({f['causes']})\n{text}"
        return
    assert f["misses"] == 0 or f["after_change_s"] <= LATE_MAX_S, \
        f"{seq} {event}: a miss {f['after_change_s']:.2f} s after the last instance that had " \
        f"counted the change by then ({f['causes']})\n{text}"
