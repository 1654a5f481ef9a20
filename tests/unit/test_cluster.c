/* test_cluster.c -- where a request for a key is served in a ring: the
 * owner serves it, anyone else redirects it once, a redirected request is
 * not sent on (but by an instance that left), and a redirected dispatch
 * carries a signature that holds for its body alone. */
#include <stdio.h>
#include <string.h>

#include "pilotlight/cluster.h"
#include "pilotlight/hash.h"
#include "unit.h"

#define KEYS 2000

static pl_key key_n(int i, char *buf, size_t cap)
{
    pl_key k = {buf, (size_t)snprintf(buf, cap, "deployment_%d", i), "v1", 2, 1, 1};
    return k;
}

/* A ring of <n> members "10.0.0.<i>:8080" as member <self> sees it. */
static void ring_of(pl_cluster *cl, int n, int self)
{
    char name[32];

    pl_cluster_init(cl, 1000);
    cl->on = 1;
    for (int i = 1; i <= n; i++) {
        int len = snprintf(name, sizeof(name), "10.0.0.%d:8080", i);
        CHECK_EQ(pl_ring_add(&cl->ring, name, (size_t)len), 0);
    }
    cl->self = self;
}

static void test_no_ring_serves_everything(void)
{
    pl_cluster cl;
    char buf[32];
    pl_key k = key_n(1, buf, sizeof(buf));
    int foreign = 7;

    pl_cluster_init(&cl, 1000);
    CHECK_EQ(pl_cluster_route(&cl, &k, 0, &foreign), -1);
    CHECK_EQ(foreign, 0);
    CHECK(pl_cluster_owns(&cl, &k));
}

/* Every instance agrees: the owner serves, the others redirect to it. */
static void test_owner_serves_others_redirect(void)
{
    pl_cluster views[3];
    int owned[3] = {0, 0, 0};

    for (int i = 0; i < 3; i++)
        ring_of(&views[i], 3, i);
    for (int i = 0; i < KEYS; i++) {
        char buf[32];
        pl_key k = key_n(i, buf, sizeof(buf));
        size_t owner = pl_cluster_owner(&views[0], &k);
        for (int v = 0; v < 3; v++) {
            int foreign, to = pl_cluster_route(&views[v], &k, 0, &foreign);
            CHECK_EQ(foreign, 0);
            CHECK_EQ(to, (size_t)v == owner ? -1 : (int)owner);
            CHECK_EQ(pl_cluster_owns(&views[v], &k), (size_t)v == owner);
        }
        owned[owner]++;
    }
    for (int v = 0; v < 3; v++)
        CHECK(owned[v] > KEYS / 3 - KEYS / 10 && owned[v] < KEYS / 3 + KEYS / 10);
}

/* Views that disagree: a request redirected once is served where it lands
 * (counted foreign), never sent on; an instance that left sends it on once
 * more; twice redirected is served anywhere. */
static void test_hops(void)
{
    pl_cluster member, left, alone;
    char buf[32];
    int foreign, i;
    pl_key k;

    ring_of(&member, 3, 0);
    ring_of(&left, 3, -1);
    for (i = 0;; i++) { /* a key member 0 does not own */
        k = key_n(i, buf, sizeof(buf));
        if (pl_cluster_owner(&member, &k) != 0)
            break;
    }
    CHECK(pl_cluster_route(&member, &k, 0, &foreign) > 0 && !foreign);
    CHECK_EQ(pl_cluster_route(&member, &k, 1, &foreign), -1);
    CHECK_EQ(foreign, 1);
    CHECK(pl_cluster_route(&left, &k, 1, &foreign) >= 0 && !foreign);
    CHECK_EQ(pl_cluster_route(&left, &k, 2, &foreign), -1);
    CHECK_EQ(foreign, 1);
    CHECK(!pl_cluster_owns(&left, &k));
    /* the last instance, left: nobody to send it to */
    ring_of(&alone, 0, -1);
    CHECK_EQ(pl_cluster_route(&alone, &k, 0, &foreign), -1);
    CHECK_EQ(foreign, 0);
}

/* A dispatch that found nobody: sent on only where a poll may be while
 * views disagree, never past the hop bound. */
static void test_after_miss(void)
{
    pl_cluster four, three, alone;
    int checked = 0;

    ring_of(&four, 4, 3); /* 10.0.0.4 has just joined */
    ring_of(&three, 3, 0);
    ring_of(&alone, 1, 0);
    for (int i = 0; i < KEYS; i++) {
        char buf[32];
        pl_key k = key_n(i, buf, sizeof(buf));
        size_t owner = pl_cluster_owner(&four, &k);
        int before = (int)pl_cluster_owner(&three, &k); /* the ring without the newcomer */

        if (owner == 3) { /* the newcomer's key: the others held its polls */
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 0, 0, 1), before);
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 1, 0, 1), before);
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 2, 0, 1), -1);
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 0, 0, 0), -1); /* long since */
            checked++;
        } else { /* served here only as redirected: its owner here */
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 1, 1, 0), (int)owner);
            CHECK_EQ(pl_cluster_after_miss(&four, &k, 2, 1, 0), -1);
        }
        CHECK_EQ(pl_cluster_after_miss(&alone, &k, 0, 0, 1), -1);
    }
    CHECK(checked > 0);
}

/* The one decision, as the request path asks it: redirect, serve, or
 * serve and send a miss on; a new view each time the ring is set. A
 * newcomer sends the misses of its own keys to their owner before it until
 * the views agree, and a grace after. */
static void test_decide(void)
{
    pl_cluster cl, three;
    pl_ring ring;
    pl_hop none = {0}, once = {0};
    pl_cluster_verdict v;
    char name[32], buf[32];
    int served = 0, redirected = 0;

    once.hops = 1;
    once.marked = 1;
    pl_cluster_init(&cl, 1000);
    CHECK_EQ(cl.view, 0);
    pl_ring_init(&ring);
    for (int i = 1; i <= 4; i++) {
        int len = snprintf(name, sizeof(name), "10.0.0.%d:8080", i);
        CHECK_EQ(pl_ring_add(&ring, name, (size_t)len), 0);
    }
    pl_cluster_set(&cl, &ring, 3, 0, 5000); /* joins at 5000; the others disagree */
    CHECK(cl.on && cl.view == 1 && cl.digest == pl_ring_digest(&ring) && !cl.agreed);
    ring_of(&three, 3, 0);
    for (int i = 0; i < KEYS; i++) {
        pl_key k = key_n(i, buf, sizeof(buf));
        size_t owner = pl_cluster_owner(&cl, &k);
        int before = (int)pl_cluster_owner(&three, &k);

        pl_cluster_decide(&cl, &k, &none, 5500, &v);
        if (owner == 3) {
            /* its own key while the views disagree, however long: a miss
             * goes to the member that owned it before */
            CHECK(v.to == -1 && !v.foreign && v.after_miss == before);
            pl_cluster_decide(&cl, &k, &none, 600000, &v);
            CHECK(v.to == -1 && v.after_miss == before);
            served++;
        } else {
            CHECK(v.to == (int)owner && v.after_miss == -1);
            /* redirected here already: served, counted foreign, and a miss
             * goes to the owner as this view has it */
            pl_cluster_decide(&cl, &k, &once, 9000, &v);
            CHECK(v.to == -1 && v.foreign && v.after_miss == (int)owner);
            redirected++;
        }
    }
    CHECK(served > 0 && redirected > 0);
    /* the views agree at 700000: a newcomer for the grace (1000) more */
    pl_cluster_set(&cl, &ring, 3, 1, 700000);
    CHECK(cl.view == 2 && cl.agreed);
    for (int i = 0, checked = 0; i < KEYS && checked < 5; i++) {
        pl_key k = key_n(i, buf, sizeof(buf));
        if (pl_cluster_owner(&cl, &k) != 3)
            continue;
        pl_cluster_decide(&cl, &k, &none, 700999, &v);
        CHECK(v.after_miss == (int)pl_cluster_owner(&three, &k));
        pl_cluster_decide(&cl, &k, &none, 701000, &v);
        CHECK(v.after_miss == -1);
        checked++;
    }
    /* left: owns nothing; what it got once is sent on once more */
    pl_cluster_set(&cl, &ring, -1, 1, 800000);
    pl_key k = key_n(0, buf, sizeof(buf));
    pl_cluster_decide(&cl, &k, &once, 800000, &v);
    CHECK(v.to == (int)pl_cluster_owner(&cl, &k));
}

static void test_read_hop(void)
{
    static const char *bad[] = {
        "pl_hop=", "pl_hop=3", "pl_hop=x", "pl_hop=-1", "pl_exp=", "pl_exp=12a",
        "pl_exp=123456789012345678901", "pl_sig=abc", "pl_hop=1&pl_sig=" /* empty */,
        "pl_nonce=abc", "pl_nonce=0123456789abcdef0123456789abcdeF",
    };
    pl_hop h;
    const char *q = "a=1&pl_hop=2&pl_exp=1700000000&pl_sig="
                    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff&b";

    CHECK_EQ(pl_cluster_read_hop(NULL, 0, &h), 0);
    CHECK_EQ(h.hops, 0);
    CHECK(h.sig == NULL && !h.marked && !h.malformed);
    CHECK_EQ(pl_cluster_read_hop(q, strlen(q), &h), 0);
    CHECK(h.marked && !h.malformed);
    CHECK_EQ(h.hops, 2);
    CHECK_EQ(h.exp, 1700000000);
    CHECK(h.sig != NULL && strncmp(h.sig, "0011", 4) == 0);
    CHECK_EQ(pl_cluster_read_hop("pl_hopx=1&x", 11, &h), 0); /* not ours */
    CHECK(h.hops == 0 && !h.marked);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = pl_cluster_read_hop(bad[i], strlen(bad[i]), &h);
        if (rc != -EINVAL)
            fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
        CHECK_EQ(rc, -EINVAL);
        CHECK(h.hops == 0 && h.marked && h.malformed);
    }
}

/* The Location line, read back as the owner reads its query; the
 * signature holds for what it names only: the body, the path, the hop, the
 * member it sends to, its nonce, a short while. */
static void test_location_and_signature(void)
{
    static const char nonce[] = "0123456789abcdef0123456789abcdef";
    const char *body = "{\"dequeuedMessage\":{}}", *q, *self = "10.0.0.7:8080";
    char loc[PL_CLUSTER_LOCATION_MAX];
    size_t blen = strlen(body);
    uint64_t t = 1700000000;
    pl_hop h, kept;
    int n;

    n = pl_cluster_location(loc, self, 0, "/warm-start", 0, NULL, NULL, NULL, 0, 0);
    CHECK_STR(loc, "Location: http://10.0.0.7:8080/warm-start?pl_hop=1\r\n");
    CHECK_EQ(n, (int)strlen(loc));
    pl_cluster_location(loc, "[fd00::7]:8080", 9090, "/warm-start", 1, "", nonce, body, blen, 0);
    CHECK_STR(loc, "Location: http://[fd00::7]:9090/warm-start?pl_hop=2\r\n");
    n = pl_cluster_location(loc, self, 0, "/warm-start", 0, "secret", nonce, body, blen, t);
    CHECK(n > 0 && n < PL_CLUSTER_LOCATION_MAX);
    q = strchr(loc, '?') + 1;
    CHECK_EQ(pl_cluster_read_hop(q, strlen(q) - 2, &h), 0);
    CHECK(h.hops == 1 && h.nonce != NULL && memcmp(h.nonce, nonce, 32) == 0);
    CHECK_EQ(h.exp, t + PL_CLUSTER_SIG_TTL_S);
    CHECK(pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    /* the clocks may be PL_CLUSTER_SKEW_S apart either way */
    CHECK(pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen,
                                t + PL_CLUSTER_SIG_TTL_S + PL_CLUSTER_SKEW_S));
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen,
                                 t + PL_CLUSTER_SIG_TTL_S + PL_CLUSTER_SKEW_S + 1));
    CHECK(pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen,
                                t - PL_CLUSTER_SKEW_S));
    /* another secret, body, path or member; another hop; not signed */
    CHECK(!pl_cluster_hop_signed(&h, "secreT", self, "/warm-start", body, blen, t));
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen - 1, t));
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/connect", body, blen, t));
    CHECK(!pl_cluster_hop_signed(&h, "secret", "10.0.0.8:8080", "/warm-start", body, blen, t));
    CHECK(!pl_cluster_hop_signed(&h, "", self, "/warm-start", body, blen, t));
    kept = h;
    h.hops = 2;
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    h = kept;
    h.exp += 1; /* an expiry changed in the URL */
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    h = kept;
    h.nonce = "1123456789abcdef0123456789abcdef";
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    h.nonce = NULL;
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    h = kept;
    h.sig = NULL;
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
    /* one made to last beyond the TTL is refused, even when signed */
    pl_cluster_location(loc, self, 0, "/warm-start", 0, "secret", nonce, body, blen, t + 100);
    q = strchr(loc, '?') + 1;
    CHECK_EQ(pl_cluster_read_hop(q, strlen(q) - 2, &h), 0);
    CHECK(!pl_cluster_hop_signed(&h, "secret", self, "/warm-start", body, blen, t));
}

/* A nonce is taken once while its signature could hold, and the set
 * stays bounded: full of live nonces, it refuses; they expire and it
 * takes new ones again. */
static void test_replay(void)
{
    pl_cluster_replay rp = {0};
    char nonces[3][33];
    pl_hop h = {0};
    uint64_t t = 1700000000;
    int refused = 0;

    h.exp = t + PL_CLUSTER_SIG_TTL_S;
    snprintf(nonces[0], 33, "%032x", 1);
    snprintf(nonces[1], 33, "%032x", 2);
    h.nonce = nonces[0];
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, t), 0);
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, t + 5), -EALREADY);
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, h.exp + PL_CLUSTER_SKEW_S), -EALREADY);
    h.nonce = nonces[1];
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, t), 0);
    /* past the expiry and the skew, a nonce may come again (its signature
     * no longer holds by then: pl_cluster_hop_signed refuses it first) */
    h.nonce = nonces[0];
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, h.exp + PL_CLUSTER_SKEW_S + 1), 0);
    /* a flood of live nonces: taken until the probes find no room */
    for (unsigned i = 0; i < 2 * PL_CLUSTER_REPLAY_MAX; i++) {
        snprintf(nonces[2], 33, "%032x", i + 100);
        h.nonce = nonces[2];
        int rc = pl_cluster_replay_take(&rp, &h, t);
        CHECK(rc == 0 || rc == -ENOSPC);
        refused += rc == -ENOSPC;
    }
    CHECK(refused > 0 && refused < 2 * PL_CLUSTER_REPLAY_MAX);
    /* ... and once they have expired, new ones are taken */
    snprintf(nonces[2], 33, "%032x", 7);
    h.nonce = nonces[2];
    CHECK_EQ(pl_cluster_replay_take(&rp, &h, h.exp + PL_CLUSTER_SKEW_S + 1), 0);
    pl_cluster_replay_free(&rp);
}

int main(void)
{
    pl_hash_init();
    RUN(test_no_ring_serves_everything);
    RUN(test_owner_serves_others_redirect);
    RUN(test_hops);
    RUN(test_after_miss);
    RUN(test_decide);
    RUN(test_read_hop);
    RUN(test_location_and_signature);
    RUN(test_replay);
    return unit_finish();
}
