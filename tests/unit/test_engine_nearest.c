/* test_engine_nearest.c -- the engine's index of keys by deployment, which
 * tells a dispatch that found nobody what is parked nearest to its key
 * (pl_engine_nearest): kept as keys gain their first waiter and lose their
 * last, and read only then. The random walk of test_engine_model.c checks
 * its counts at every step too. */
#include "engine_fixture.h"

static pl_engine_near near_of(const pl_engine *e, const pl_key *k)
{
    pl_engine_near n;

    pl_engine_nearest(e, k, 64, &n);
    return n;
}

static int key_is(const pl_key *k, const char *dep, const char *ver, double cpu, double mem)
{
    return k->deployment_len == strlen(dep) && memcmp(k->deployment, dep, k->deployment_len) == 0 &&
           k->version_len == strlen(ver) && memcmp(k->version, ver, k->version_len) == 0 &&
           k->cpu == cpu && k->memory == mem;
}

static void test_nothing_parked(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_engine_near n = near_of(e, &KA);

    CHECK_EQ(n.deployment_keys, 0);
    CHECK_EQ(n.deployment_parked, 0);
    CHECK_EQ(n.found, 0);
    pl_engine_free(e);
}

static void test_nearest_by_machine_then_version(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_key a_v1_small = key("dep-a", "v1", 1, 1024), a_v1_big = key("dep-a", "v1", 2, 2048);
    pl_key a_v2 = key("dep-a", "v2", 1, 1024), b_v1 = key("dep-b", "v1", 1, 1024);
    pl_key want;
    owner_t o[8];
    pl_engine_near n;

    memset(o, 0, sizeof(o));
    CHECK_EQ(park(e, &a_v1_small, "c0", &o[0], 1), 0);
    CHECK_EQ(park(e, &a_v1_small, "c1", &o[1], 2), 0);
    CHECK_EQ(park(e, &a_v1_big, "c2", &o[2], 3), 0);
    CHECK_EQ(park(e, &a_v2, "c3", &o[3], 4), 0);
    CHECK_EQ(park(e, &a_v2, "c4", &o[4], 5), 0);
    CHECK_EQ(park(e, &a_v2, "c5", &o[5], 6), 0);
    CHECK_EQ(park(e, &b_v1, "c6", &o[6], 7), 0);

    /* Same deployment and version, another machine: the machine with the
     * most waiters is nearest. */
    want = key("dep-a", "v1", 4, 4096);
    n = near_of(e, &want);
    CHECK_EQ(n.deployment_keys, 3);
    CHECK_EQ(n.deployment_parked, 6);
    CHECK_EQ(n.version_parked, 3);
    CHECK_EQ(n.key_parked, 0);
    CHECK_EQ(n.found, 1);
    CHECK(key_is(&n.nearest.key, "dep-a", "v1", 1, 1024));
    CHECK_EQ(n.nearest.parked, 2);
    CHECK_EQ(n.nearest.oldest_parked_at, 1);
    CHECK_EQ(n.nearest_version_parked, 3);

    /* Another version: the version of the key with the most waiters,
     * though v1 has as many in all. */
    want = key("dep-a", "v3", 1, 1024);
    n = near_of(e, &want);
    CHECK_EQ(n.version_parked, 0);
    CHECK_EQ(n.found, 1);
    CHECK(key_is(&n.nearest.key, "dep-a", "v2", 1, 1024));
    CHECK_EQ(n.nearest.parked, 3);
    CHECK_EQ(n.nearest_version_parked, 3);

    /* The key itself is counted, never its own neighbour. */
    n = near_of(e, &a_v1_small);
    CHECK_EQ(n.key_parked, 2);
    CHECK_EQ(n.version_parked, 3);
    CHECK(key_is(&n.nearest.key, "dep-a", "v1", 2, 2048));

    /* Another deployment, even one whose name begins as this one's. */
    want = key("dep-", "v1", 1, 1024);
    n = near_of(e, &want);
    CHECK_EQ(n.deployment_parked, 0);
    CHECK_EQ(n.found, 0);
    n = near_of(e, &b_v1);
    CHECK_EQ(n.key_parked, 1);
    CHECK_EQ(n.found, 0); /* its only key is its own */

    /* At most <max> keys are looked at. */
    want = key("dep-a", "v9", 1, 1);
    pl_engine_nearest(e, &want, 1, &n);
    CHECK_EQ(n.deployment_keys, 1);
    pl_engine_free(e);
}

/* The index follows keys as they gain their first waiter and lose their
 * last, whatever ends them. */
static void test_index_follows_keys(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_key a1 = key("dep-a", "v1", 1, 1), a2 = key("dep-a", "v2", 1, 1);
    pl_key b = key("dep-b", "v1", 1, 1);
    owner_t o[6];
    int payload = 7;
    pl_engine_near n;

    memset(o, 0, sizeof(o));
    CHECK_EQ(park(e, &a1, "x0", &o[0], 1), 0);
    CHECK_EQ(park(e, &a2, "x1", &o[1], 2), 0);
    CHECK_EQ(park(e, &b, "x2", &o[2], 3), 0);
    CHECK_EQ(near_of(e, &a1).deployment_parked, 2);

    /* a match empties a1's key: dep-a keeps a2 */
    CHECK_EQ(deliver(e, &a1, &payload, 4, NULL), PL_DELIVERED);
    n = near_of(e, &a1);
    CHECK_EQ(n.deployment_keys, 1);
    CHECK_EQ(n.key_parked, 0);
    CHECK(n.found && key_is(&n.nearest.key, "dep-a", "v2", 1, 1));

    /* a disconnect empties dep-a altogether */
    pl_engine_settle(e, o[1].w, PL_OUTCOME_DISCONNECT);
    n = near_of(e, &a1);
    CHECK_EQ(n.deployment_parked, 0);
    CHECK_EQ(near_of(e, &b).key_parked, 1);
    CHECK_EQ(n.found, 0);

    /* and parks bring it back */
    CHECK_EQ(park(e, &a2, "x3", &o[3], 5), 0);
    CHECK_EQ(park(e, &a2, "x4", &o[4], 6), 0);
    n = near_of(e, &a1);
    CHECK_EQ(n.deployment_parked, 2);
    CHECK_EQ(n.nearest_version_parked, 2);

    pl_engine_drain(e);
    CHECK_EQ(near_of(e, &a1).deployment_parked, 0);
    CHECK_EQ(near_of(e, &b).deployment_parked, 0);
    pl_engine_free(e);
}

/* Many deployments share the index's buckets: each is told apart. */
static void test_many_deployments(void)
{
    enum { N = 3000 };
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    static owner_t o[N];
    static char deps[N][16];
    pl_key k[N];
    int ok = 1;

    memset(o, 0, sizeof(o));
    for (int i = 0; i < N; i++) {
        snprintf(deps[i], sizeof(deps[i]), "dep-%d", i);
        k[i] = key(deps[i], i % 2 ? "v1" : "v2", 1 + i % 3, 1);
        CHECK_EQ(park(e, &k[i], "c", &o[i], (uint64_t)i), 0);
    }
    for (int i = 0; i < N; i++) {
        pl_key other = key(deps[i], "v9", 1, 1);
        pl_engine_near n = near_of(e, &other);
        ok &= n.deployment_keys == 1 && n.deployment_parked == 1 && n.found &&
              n.nearest.key.deployment_len == strlen(deps[i]) &&
              memcmp(n.nearest.key.deployment, deps[i], strlen(deps[i])) == 0;
    }
    CHECK(ok);
    for (int i = 0; i < N; i += 2)
        pl_engine_settle(e, o[i].w, PL_OUTCOME_DISCONNECT);
    ok = 1;
    for (int i = 0; i < N; i++)
        ok &= near_of(e, &k[i]).deployment_parked == (size_t)(i % 2);
    CHECK(ok);
    pl_engine_free(e);
}

int main(void)
{
    RUN(test_nothing_parked);
    RUN(test_nearest_by_machine_then_version);
    RUN(test_index_follows_keys);
    RUN(test_many_deployments);
    return unit_finish();
}
