/* test_engine_oom.c -- the engine when an allocation fails: nothing
 * settled, nothing changed, whichever allocation it was. */
#include "engine_fixture.h"

/* ---- allocation failure ------------------------------------------------- */

typedef struct {
    pl_ledger ledger;
    size_t keys, on_deployment;
    size_t waiting[4];
    unsigned long callbacks;
} snapshot;

static snapshot snap(const pl_engine *e, const pl_key *probe[4])
{
    snapshot s;

    memset(&s, 0, sizeof(s));
    s.ledger = *pl_engine_ledger(e);
    s.keys = pl_engine_key_count(e);
    {
        pl_engine_near n;
        pl_engine_nearest(e, &KA, 64, &n);
        s.on_deployment = n.deployment_parked;
    }
    for (int i = 0; i < 4; i++)
        s.waiting[i] = probe[i] ? pl_engine_waiting(e, probe[i]) : 0;
    s.callbacks = total_callbacks;
    return s;
}

static int snap_equal(const snapshot *a, const snapshot *b)
{
    return memcmp(&a->ledger, &b->ledger, sizeof(a->ledger)) == 0 &&
           a->keys == b->keys && a->on_deployment == b->on_deployment &&
           a->callbacks == b->callbacks &&
           memcmp(a->waiting, b->waiting, sizeof(a->waiting)) == 0;
}

/* Parks <o>, first making each allocation the call makes fail in turn
 * (the nth alone, then the nth and all later ones), checking each failure
 * returns PL_ENOMEM and changes nothing. Returns how many allocations the
 * successful park made. */
static unsigned park_under_oom(pl_engine *e, const pl_key *k, const char *id,
                               owner_t *o, uint64_t now)
{
    const pl_key *probe[4] = {k, &KA, &KB, &KC};

    for (unsigned long n = 1; n < 64; n++) {
        for (int sticky = 0; sticky <= 1; sticky++) {
            snapshot before = snap(e, probe), after;
            pl_waiter *w = (pl_waiter *)o;
            int rc;

            pl_mem_fail_after(n, sticky);
            rc = park_n(e, k, id, strlen(id), o, now, &w);
            pl_mem_fail_after(0, 0);
            if (rc == 0) {
                /* failing every allocation from the nth on cannot succeed
                 * where failing the nth alone did not */
                CHECK_EQ(sticky, 0);
                o->w = w;
                return (unsigned)(n - 1);
            }
            after = snap(e, probe);
            CHECK_EQ(rc, PL_ENOMEM);
            CHECK(w == NULL);
            CHECK_EQ(o->calls, 0);
            if (!snap_equal(&before, &after)) {
                fprintf(stderr,
                        "  park(id=%s) failing allocation %lu%s changed "
                        "state: callbacks %lu->%lu, parked_now %llu->%llu, "
                        "replaced %llu->%llu, keys %zu->%zu\n",
                        id, n, sticky ? "+" : "", before.callbacks,
                        after.callbacks,
                        (unsigned long long)before.ledger.parked_now,
                        (unsigned long long)after.ledger.parked_now,
                        (unsigned long long)
                            before.ledger.settled[PL_OUTCOME_REPLACED],
                        (unsigned long long)
                            after.ledger.settled[PL_OUTCOME_REPLACED],
                        before.keys, after.keys);
                CHECK(snap_equal(&before, &after));
            }
        }
    }
    CHECK(!"park never succeeded");
    return 0;
}

static void test_oom_new(void)
{
    pl_engine_opts opts;

    memset(&opts, 0, sizeof(opts));
    opts.settle = settle_cb;
    pl_mem_fail_after(1, 0);
    CHECK(pl_engine_new(&opts) == NULL);
    pl_mem_fail_after(0, 0);
}

static void test_oom_park(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    static owner_t o[900];
    char dep[32], id[32];
    unsigned allocs, total = 0, baseline = 0;
    int payload = 1;

    /* The first park of a fresh engine allocates the waiter, the key entry
     * and both hash tables. */
    allocs = park_under_oom(e, &KA, "first", &o[0], 0);
    CHECK(allocs >= 4);
    /* Another waiter of the same key: the waiter alone. */
    CHECK_EQ(park_under_oom(e, &KA, "second", &o[1], 0), 1);
    /* A new key: the waiter and the entry. */
    CHECK_EQ(park_under_oom(e, &KB, "third", &o[2], 0), 2);

    /* Hundreds of ids over many keys, so that both hash tables grow
     * their bucket arrays while allocations fail. */
    for (int i = 3; i < 900; i++) {
        pl_key k;
        snprintf(dep, sizeof(dep), "dep-%d", i % 300);
        snprintf(id, sizeof(id), "controller-%d", i);
        k = key(dep, "v", 1, 1);
        baseline += 1 + (i < 303); /* dep-0..2 are new at i = 300..302 */
        total += park_under_oom(e, &k, id, &o[i], (uint64_t)i);
    }
    CHECK(total > baseline); /* some bucket expansions were covered */
    CHECK_EQ(pl_engine_key_count(e), 302);
    CHECK_EQ(pl_engine_ledger(e)->parked_now, 900);
    CHECK_EQ(pl_engine_ledger(e)->parked_total, 900);

    /* Matching needs no memory: with every allocation failing, deliver,
     * settle and drain still work. */
    pl_mem_fail_after(1, 1);
    CHECK_EQ(deliver(e, &KA, &payload, 1000, NULL), 1);
    CHECK_EQ(o[0].outcome, PL_OUTCOME_MATCHED);
    pl_engine_settle(e, o[1].w, PL_OUTCOME_DISCONNECT);
    CHECK_EQ(pl_engine_waiting(e, &KA), 0);
    {
        owner_t x = {0};
        CHECK_EQ(park(e, &KC, "x", &x, 1000), PL_ENOMEM);
        CHECK_EQ(x.calls, 0);
    }
    pl_engine_drain(e);
    pl_mem_fail_after(0, 0);
    for (int i = 0; i < 900; i++)
        CHECK_EQ(o[i].calls, 1);
    CHECK_EQ(pl_engine_key_count(e), 0);

    /* And parking works again. */
    owner_t y = {0};
    CHECK_EQ(park(e, &KC, "y", &y, 2000), 0);
    CHECK_EQ(deliver(e, &KC, &payload, 2001, NULL), 1);
    CHECK_EQ(y.outcome, PL_OUTCOME_MATCHED);
    pl_engine_free(e);
}

/* pl_engine_park() promises "PL_ENOMEM (nothing settled, nothing changed)"
 * also when the controller already has a parked poll. */
static void test_oom_park_replacing(void)
{
    pl_engine *e;
    owner_t a = {0}, b = {0}, c = {0}, d = {0}, f = {0};

    /* Same key, the controller's old poll is its only waiter. */
    e = engine(PL_ORDER_FIFO, 0, 0, 0);
    CHECK_EQ(park(e, &KA, "ctl", &a, 1), 0);
    park_under_oom(e, &KA, "ctl", &b, 2);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(b.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);
    pl_engine_free(e);
    CHECK_EQ(b.calls, 1);

    /* Another key. */
    e = engine(PL_ORDER_FIFO, 0, 0, 0);
    CHECK_EQ(park(e, &KA, "other", &c, 1), 0);
    CHECK_EQ(park(e, &KA, "ctl", &d, 1), 0);
    park_under_oom(e, &KB, "ctl", &f, 2);
    CHECK_EQ(d.calls, 1);
    CHECK_EQ(d.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(pl_engine_waiting(e, &KB), 1);
    pl_engine_free(e);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(f.calls, 1);
}

int main(void)
{
    RUN(test_oom_new);
    RUN(test_oom_park);
    RUN(test_oom_park_replacing);
    return unit_finish();
}
