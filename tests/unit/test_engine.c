/* test_engine.c -- the matching engine alone, its basic behaviour: park,
 * match, settle, replace, order, caps, expiry, drain, keys by value. The
 * other engine tests: test_engine_delivery.c (pending deliveries, vetting),
 * test_engine_oom.c (allocation failure), test_engine_handover.c (hand-over
 * between engines, live options, holds) and test_engine_model.c (a random
 * walk checked against a model). */
#include "engine_fixture.h"

/* ---- basic behaviour ---------------------------------------------------- */

static void test_park_and_match(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0};
    int payload = 42;
    uint64_t waited = 777;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(park(e, &KA, "c1", &a, 1000), 0);
    CHECK(a.w != NULL);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);
    CHECK_EQ(pl_engine_waiting(e, &KB), 0);
    CHECK_EQ(pl_engine_key_count(e), 1);
    check_ledger(e, 1, 1, settled);

    CHECK_EQ(deliver(e, &KA, &payload, 1250, &waited), 1);
    CHECK_EQ(waited, 250);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_MATCHED);
    CHECK(a.arg == &payload);
    CHECK_EQ(pl_engine_waiting(e, &KA), 0);
    CHECK_EQ(pl_engine_key_count(e), 0);
    settled[PL_OUTCOME_MATCHED] = 1;
    check_ledger(e, 1, 0, settled);

    /* Delivered once: a second dispatch finds nobody. */
    CHECK_EQ(deliver(e, &KA, &payload, 1300, NULL), 0);
    pl_engine_free(e);
    CHECK_EQ(a.calls, 1);
}

/* A dispatch nobody takes is not kept for a later poll. */
static void test_deliver_empty_queues_nothing(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0};
    int payload = 1;
    uint64_t waited = 777;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(deliver(e, &KA, &payload, 10, &waited), 0);
    CHECK_EQ(waited, 777);
    CHECK_EQ(pl_engine_key_count(e), 0);
    check_ledger(e, 0, 0, settled);

    /* A waiter of another key is not offered it either. */
    CHECK_EQ(park(e, &KB, "b", &b, 10), 0);
    CHECK_EQ(deliver(e, &KA, &payload, 11, &waited), 0);
    CHECK_EQ(b.calls, 0);

    CHECK_EQ(park(e, &KA, "a", &a, 20), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);
    check_ledger(e, 2, 2, settled);
    pl_engine_free(e);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_SHUTDOWN);
    CHECK_EQ(b.calls, 1);
}

static void test_settle_disconnect(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0};
    int payload = 1;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    pl_engine_settle(e, a.w, PL_OUTCOME_DISCONNECT);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_DISCONNECT);
    CHECK(a.arg == NULL);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);
    settled[PL_OUTCOME_DISCONNECT] = 1;
    check_ledger(e, 2, 1, settled);

    /* The disconnected one is gone: the next dispatch reaches b. */
    CHECK_EQ(deliver(e, &KA, &payload, 3, NULL), 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(a.calls, 1);

    /* The id of a settled waiter is free again: parking it replaces none. */
    owner_t a2 = {0};
    CHECK_EQ(park(e, &KA, "a", &a2, 4), 0);
    CHECK_EQ(pl_engine_ledger(e)->settled[PL_OUTCOME_REPLACED], 0);
    pl_engine_free(e);
    CHECK_EQ(a2.calls, 1);
}

static void test_replace_same_controller(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0}, other = {0};
    int payload = 1;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(park(e, &KA, "c1", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "c2", &other, 2), 0);
    CHECK_EQ(park(e, &KA, "c1", &b, 3), 0);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_REPLACED);
    CHECK(a.arg == NULL);
    CHECK_EQ(b.calls, 0);
    CHECK(b.w != NULL);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    settled[PL_OUTCOME_REPLACED] = 1;
    check_ledger(e, 3, 2, settled);

    /* The new poll went to the back of the queue. */
    CHECK_EQ(deliver(e, &KA, &payload, 4, NULL), 1);
    CHECK_EQ(other.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(b.calls, 0);

    /* Same controller, another key: the old key's entry goes away. */
    CHECK_EQ(park(e, &KB, "c1", &c, 5), 0);
    CHECK_EQ(b.calls, 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(pl_engine_waiting(e, &KA), 0);
    CHECK_EQ(pl_engine_waiting(e, &KB), 1);
    CHECK_EQ(pl_engine_key_count(e), 1);

    /* The id is <id_len> bytes: the first 2 bytes of "c1x" are c's id "c1",
     * while "c" (1 byte of "c1") is another controller. */
    owner_t d = {0}, f = {0};
    CHECK_EQ(park_n(e, &KB, "c1x", 2, &d, 6, &d.w), 0);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(c.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(park_n(e, &KB, "c1", 1, &f, 7, &f.w), 0);
    CHECK_EQ(d.calls, 0);

    /* A replaced poll whose client had hung up already counts as a
     * disconnect; the new poll parks all the same. */
    owner_t g = {0};
    d.gone = 1;
    memset(settled, 0, sizeof(settled));
    settled[PL_OUTCOME_REPLACED] = 3;
    settled[PL_OUTCOME_MATCHED] = 1;
    settled[PL_OUTCOME_DISCONNECT] = 1;
    CHECK_EQ(park(e, &KB, "c1", &g, 8), 0);
    CHECK_EQ(d.calls, 1);
    CHECK_EQ(d.outcome, PL_OUTCOME_REPLACED);
    CHECK(g.w != NULL);
    CHECK_EQ(pl_engine_waiting(e, &KB), 2);
    check_ledger(e, 7, 2, settled);
    pl_engine_free(e);
    CHECK_EQ(f.calls, 1);
    CHECK_EQ(g.calls, 1);
}

/* A controller id is replaced only within its deployment: another tenant
 * reusing it parks beside it and ends nothing: a poll may replace only its
 * own tenant's. */
static void test_replace_same_tenant_only(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t v = {0}, a = {0}, a2 = {0}, v2 = {0}, v3 = {0};
    int payload = 1;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(park(e, &KA, "ctl", &v, 1), 0);  /* tenant dep-a */
    CHECK_EQ(park(e, &KC, "ctl", &a, 2), 0);  /* tenant dep-c, same id */
    CHECK_EQ(v.calls, 0);
    CHECK_EQ(a.calls, 0);
    check_ledger(e, 2, 2, settled);
    /* each tenant's own re-poll replaces only its own */
    CHECK_EQ(park(e, &KC, "ctl", &a2, 3), 0);
    CHECK_EQ(a.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(v.calls, 0);
    CHECK_EQ(deliver(e, &KA, &payload, 4, NULL), 1);
    CHECK_EQ(v.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(a2.calls, 0);
    /* the same deployment under another version or machine still replaces */
    CHECK_EQ(park(e, &KA, "ctl", &v2, 5), 0);
    CHECK_EQ(park(e, &KB, "ctl", &v3, 6), 0);
    CHECK_EQ(v2.calls, 1);
    CHECK_EQ(v2.outcome, PL_OUTCOME_REPLACED);
    settled[PL_OUTCOME_REPLACED] = 2;
    settled[PL_OUTCOME_MATCHED] = 1;
    check_ledger(e, 5, 2, settled);
    pl_engine_free(e);
    CHECK_EQ(a2.calls, 1);
    CHECK_EQ(v3.calls, 1);
}

/* Many tenants share one controller id and the index grows and shrinks
 * around them: each re-poll still replaces exactly its own tenant's poll. */
static void test_replace_same_tenant_many(void)
{
    enum { N = 600 };
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    static owner_t first[N], second[N];
    static char deps[N][16];
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    for (int i = 0; i < N; i++) {
        snprintf(deps[i], sizeof(deps[i]), "tenant-%d", i);
        pl_key k = key(deps[i], "v1", 1, 1024);
        CHECK_EQ(park(e, &k, "shared", &first[i], (uint64_t)i), 0);
    }
    for (int i = N - 1; i >= 0; i--) {
        pl_key k = key(deps[i], "v2", 2, 2048); /* same tenant, another key */
        CHECK_EQ(park(e, &k, "shared", &second[i], (uint64_t)(N + i)), 0);
        CHECK_EQ(first[i].calls, 1);
        CHECK_EQ(first[i].outcome, PL_OUTCOME_REPLACED);
        if (i > 0)
            CHECK_EQ(first[i - 1].calls, 0);
    }
    settled[PL_OUTCOME_REPLACED] = N;
    check_ledger(e, 2 * N, N, settled);
    for (int i = 0; i < N; i++)
        CHECK_EQ(second[i].calls, 0);
    pl_engine_free(e);
    for (int i = 0; i < N; i++)
        CHECK_EQ(second[i].calls, 1);
}

/* Replacing frees the old waiter's place before the caps are checked. */
static void test_replace_at_cap(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 2, 1, 0);
    owner_t a = {0}, b = {0}, c = {0}, d = {0};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KB, "b", &b, 1), 0);
    /* Both caps are full, yet the controller's new poll takes its old
     * poll's place. */
    CHECK_EQ(park(e, &KA, "a", &c, 2), 0);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);

    /* Moving to a full key: the old poll is still replaced (the controller
     * gave up on it), then the new one is over the per-key cap. */
    CHECK_EQ(park(e, &KA, "b", &d, 3), PL_EREJECTED);
    CHECK_EQ(b.calls, 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(d.calls, 1);
    CHECK_EQ(d.outcome, PL_OUTCOME_REJECTED);
    CHECK_EQ(pl_engine_key_count(e), 1);
    pl_engine_free(e);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(c.outcome, PL_OUTCOME_SHUTDOWN);
}

static void check_order(pl_order order)
{
    pl_engine *e = engine(order, 0, 0, 0);
    owner_t o[5] = {{0}};
    char id[16];
    int payload = 7;

    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "w%d", i);
        CHECK_EQ(park(e, &KA, id, &o[i], (uint64_t)i), 0);
    }
    log_reset();
    for (int i = 0; i < 5; i++)
        CHECK_EQ(deliver(e, &KA, &payload, 100, NULL), 1);
    CHECK_EQ(log_len, 5);
    for (int i = 0; i < 5 && i < (int)log_len; i++) {
        int want = order == PL_ORDER_FIFO ? i : 4 - i;
        CHECK(settle_log[i].owner == &o[want]);
        CHECK_EQ(settle_log[i].outcome, PL_OUTCOME_MATCHED);
    }
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_free(e);
}

static void test_fifo_order(void)
{
    check_order(PL_ORDER_FIFO);
}

static void test_lifo_order(void)
{
    check_order(PL_ORDER_LIFO);
}

/* Order is per key: waiters of other keys in between do not matter. */
static void test_order_is_per_key(void)
{
    pl_engine *e = engine(PL_ORDER_LIFO, 0, 0, 0);
    owner_t a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0};
    int payload = 7;

    CHECK_EQ(park(e, &KA, "a1", &a1, 1), 0);
    CHECK_EQ(park(e, &KB, "b1", &b1, 2), 0);
    CHECK_EQ(park(e, &KA, "a2", &a2, 3), 0);
    CHECK_EQ(park(e, &KB, "b2", &b2, 4), 0);
    CHECK_EQ(deliver(e, &KA, &payload, 5, NULL), 1);
    CHECK_EQ(a2.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(b2.calls, 0);
    pl_engine_free(e);
}

static void test_caps_reject(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 3, 2, 0);
    owner_t a1 = {0}, a2 = {0}, a3 = {0}, b1 = {0}, c1 = {0}, c2 = {0};
    int payload = 1;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};
    pl_waiter *sentinel = (pl_waiter *)&payload;

    CHECK_EQ(park(e, &KA, "a1", &a1, 1), 0);
    CHECK_EQ(park(e, &KA, "a2", &a2, 1), 0);

    /* Per-key cap. */
    a3.w = sentinel;
    CHECK_EQ(park(e, &KA, "a3", &a3, 1), PL_EREJECTED);
    CHECK(a3.w == NULL);
    CHECK_EQ(a3.calls, 1);
    CHECK_EQ(a3.outcome, PL_OUTCOME_REJECTED);
    CHECK(a3.arg != NULL && ((const char *)a3.arg)[0] != '\0');
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);

    /* Global cap: KC has no waiter, but the server is full. */
    CHECK_EQ(park(e, &KB, "b1", &b1, 1), 0);
    CHECK_EQ(park(e, &KC, "c1", &c1, 1), PL_EREJECTED);
    CHECK_EQ(c1.calls, 1);
    CHECK_EQ(c1.outcome, PL_OUTCOME_REJECTED);
    CHECK(c1.arg != NULL && ((const char *)c1.arg)[0] != '\0');
    CHECK(c1.w == NULL);
    CHECK_EQ(pl_engine_waiting(e, &KC), 0);
    CHECK_EQ(pl_engine_key_count(e), 2); /* no entry left for KC */
    settled[PL_OUTCOME_REJECTED] = 2;
    check_ledger(e, 5, 3, settled);

    /* A rejected poll holds no place and no id: after room is made, the
     * same controller parks without replacing anything. */
    CHECK_EQ(deliver(e, &KA, &payload, 2, NULL), 1);
    CHECK_EQ(park(e, &KC, "c1", &c2, 3), 0);
    CHECK_EQ(pl_engine_ledger(e)->settled[PL_OUTCOME_REPLACED], 0);
    CHECK_EQ(c1.calls, 1);
    pl_engine_free(e);
    CHECK_EQ(a1.calls + a2.calls + a3.calls + b1.calls + c1.calls + c2.calls,
             6);
}

static void test_key_entry_freed(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    char dep[32], id[32];
    int payload = 1;

    /* Thousands of distinct keys, each used once: none may linger. */
    for (int i = 0; i < 3000; i++) {
        owner_t o = {0};
        pl_key k;

        snprintf(dep, sizeof(dep), "dep-%d", i);
        snprintf(id, sizeof(id), "ctl-%d", i % 17);
        k = key(dep, "v", (i % 4) * 0.25, 512);
        CHECK_EQ(park(e, &k, id, &o, (uint64_t)i), 0);
        CHECK_EQ(pl_engine_key_count(e), 1);
        switch (i % 3) {
        case 0:
            CHECK_EQ(deliver(e, &k, &payload, (uint64_t)i, NULL),
                     1);
            break;
        case 1:
            pl_engine_settle(e, o.w, PL_OUTCOME_DISCONNECT);
            break;
        default:
            pl_engine_drain(e);
            break;
        }
        CHECK_EQ(o.calls, 1);
        CHECK_EQ(pl_engine_key_count(e), 0);
        CHECK_EQ(pl_engine_waiting(e, &k), 0);
    }
    CHECK_EQ(pl_engine_ledger(e)->parked_now, 0);
    pl_engine_free(e);
}

/* The callers' mark and note on a key: kept from a park or a delivery at
 * a found spot while the key has waiters, per key, each apart from the
 * other, and forgotten with the last. */
static void test_key_mark(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0};
    pl_engine_spot spot;
    pl_delivery d = {0};
    int payload = 1;
    pl_key bad = key("", "v1", 1, 1024);

    CHECK_EQ(pl_engine_find(e, &bad, &spot), PL_EINVAL);
    CHECK_EQ(pl_engine_park(e, &spot, "a", 1, &a, 1, &a.w), PL_EINVAL);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry == NULL && spot.mark == 0 && spot.note == 0);
    spot.mark = 7;
    spot.note = 70;
    CHECK_EQ(pl_engine_park(e, &spot, "a", 1, &a, 1, &a.w), 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry != NULL && spot.mark == 7 && spot.note == 70);
    CHECK_EQ(pl_engine_find(e, &KB, &spot), 0); /* another key: its own */
    CHECK(spot.entry == NULL && spot.mark == 0 && spot.note == 0);
    CHECK_EQ(park(e, &KB, "c", &c, 2), 0);      /* pl_engine_park leaves it 0 */
    CHECK_EQ(pl_engine_find(e, &KB, &spot), 0);
    CHECK_EQ(spot.mark, 0);

    /* A park at a found spot and a delivery from one leave theirs. */
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    spot.mark = 8;
    CHECK_EQ(pl_engine_park(e, &spot, "b", 1, &b, 3, &b.w), 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK_EQ(spot.mark, 8);
    CHECK_EQ(spot.note, 70);
    spot.mark = 9;
    spot.note = 90;
    d.payload = &payload;
    CHECK_EQ(pl_engine_deliver(e, &spot, 4, &d), PL_DELIVERED);
    CHECK(d.owner == &a && a.outcome == PL_OUTCOME_MATCHED);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.mark == 9 && spot.note == 90);

    /* The last waiter takes the mark with it. */
    spot.mark = 10;
    CHECK_EQ(pl_engine_deliver(e, &spot, 5, &d), PL_DELIVERED);
    CHECK(d.owner == &b);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry == NULL && spot.mark == 0 && spot.note == 0);
    CHECK_EQ(pl_engine_deliver(e, &spot, 6, &d), 0);
    CHECK_EQ(pl_engine_key_count(e), 1);
    pl_engine_free(e);
    CHECK_EQ(c.outcome, PL_OUTCOME_SHUTDOWN);
}

static void test_deliver_skips_refusing(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0};
    int payload = 1;
    uint64_t waited = 0;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    a.refuse = 1;
    CHECK_EQ(park(e, &KA, "a", &a, 10), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 20), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 30), 0);
    CHECK_EQ(deliver(e, &KA, &payload, 50, &waited), 1);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_MATCHED); /* what it was offered */
    CHECK_EQ(b.calls, 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK(b.arg == &payload);
    CHECK_EQ(waited, 30); /* b's wait, not a's */
    CHECK_EQ(c.calls, 0);
    settled[PL_OUTCOME_MATCHED] = 1;
    settled[PL_OUTCOME_DISCONNECT] = 1; /* a's refusal */
    check_ledger(e, 3, 1, settled);

    /* Everyone refuses: 0, all recorded as disconnects, key gone. */
    owner_t d = {0};
    c.refuse = 1;
    d.refuse = 1;
    CHECK_EQ(park(e, &KA, "d", &d, 40), 0);
    waited = 777;
    CHECK_EQ(deliver(e, &KA, &payload, 60, &waited), 0);
    CHECK_EQ(waited, 777);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(d.calls, 1);
    CHECK_EQ(pl_engine_key_count(e), 0);
    settled[PL_OUTCOME_DISCONNECT] = 3;
    check_ledger(e, 4, 0, settled);
    pl_engine_free(e);
}

static void test_expire_and_deadline(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {0}, b = {0}, c = {0};
    uint64_t dl = 0;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    CHECK_EQ(park(e, &KA, "a", &a, 1000), 0);
    CHECK_EQ(park(e, &KB, "b", &b, 1050), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 1070), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), 0);
    CHECK_EQ(dl, 1100);

    CHECK_EQ(pl_engine_expire(e, 1099), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_expire(e, 1100), 1);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_TIMEOUT);
    CHECK(a.arg == NULL);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), 0);
    CHECK_EQ(dl, 1150);

    /* Replacing restarts the clock for that controller. */
    owner_t b2 = {0};
    CHECK_EQ(park(e, &KB, "b", &b2, 1140), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), 0);
    CHECK_EQ(dl, 1170);

    CHECK_EQ(pl_engine_expire(e, 1239), 1); /* c */
    CHECK_EQ(c.outcome, PL_OUTCOME_TIMEOUT);
    CHECK_EQ(b2.calls, 0);
    CHECK_EQ(pl_engine_expire(e, 100000), 1);
    CHECK_EQ(b2.outcome, PL_OUTCOME_TIMEOUT);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    CHECK_EQ(pl_engine_key_count(e), 0);
    settled[PL_OUTCOME_TIMEOUT] = 3;
    settled[PL_OUTCOME_REPLACED] = 1;
    check_ledger(e, 4, 0, settled);
    pl_engine_free(e);

    /* park_timeout 0: nothing ever times out. */
    e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t d = {0};
    CHECK_EQ(park(e, &KA, "d", &d, 0), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    CHECK_EQ(pl_engine_expire(e, UINT64_MAX / 2), 0);
    CHECK_EQ(d.calls, 0);
    pl_engine_free(e);
    CHECK_EQ(d.outcome, PL_OUTCOME_SHUTDOWN);
}

static void test_drain(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 50);
    owner_t o[4] = {{0}};
    int payload = 1;
    uint64_t dl;
    uint64_t settled[PL_OUTCOME__COUNT] = {0};

    CHECK_EQ(park(e, &KA, "0", &o[0], 1), 0);
    CHECK_EQ(park(e, &KB, "1", &o[1], 2), 0);
    CHECK_EQ(park(e, &KA, "2", &o[2], 3), 0);
    pl_engine_drain(e);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(o[i].calls, 1);
        CHECK_EQ(o[i].outcome, PL_OUTCOME_SHUTDOWN);
        CHECK(o[i].arg == NULL);
    }
    CHECK_EQ(pl_engine_key_count(e), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    settled[PL_OUTCOME_SHUTDOWN] = 3;
    check_ledger(e, 3, 0, settled);

    /* Still usable. */
    CHECK_EQ(park(e, &KA, "0", &o[3], 4), 0);
    CHECK_EQ(pl_engine_ledger(e)->settled[PL_OUTCOME_REPLACED], 0);
    CHECK_EQ(deliver(e, &KA, &payload, 5, NULL), 1);
    CHECK_EQ(o[3].outcome, PL_OUTCOME_MATCHED);
    pl_engine_free(e);
    CHECK_EQ(o[3].calls, 1);
}

static void test_free_settles_remaining(void)
{
    pl_engine *e = engine(PL_ORDER_LIFO, 0, 0, 0);
    owner_t o[3] = {{0}};

    CHECK_EQ(park(e, &KA, "0", &o[0], 1), 0);
    CHECK_EQ(park(e, &KB, "1", &o[1], 2), 0);
    CHECK_EQ(park(e, &KC, "2", &o[2], 3), 0);
    pl_engine_free(e);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(o[i].calls, 1);
        CHECK_EQ(o[i].outcome, PL_OUTCOME_SHUTDOWN);
    }
    pl_engine_free(NULL);
}

/* ---- keys: numbers as numbers, strings by content ----------------------- */

static double num(const char *s)
{
    double v = -12345;

    CHECK_EQ(pl_key_parse_number(s, strlen(s), &v), 0);
    return v;
}

static void test_keys_numbers_as_numbers(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    char dep1[] = "deploy", dep2[] = "deploy";
    pl_key k1 = key(dep1, "v1", num("1"), num("512"));
    pl_key k1b = key(dep2, "v1", num("1.0"), num("512.0"));
    pl_key h1 = key("deploy", "v1", num("0.5"), num("512"));
    pl_key h2 = key("deploy", "v1", num("5e-1"), num("512"));
    pl_key q = key("deploy", "v1", num("0.25"), num("512"));
    owner_t a = {0}, b = {0};
    int payload = 1;

    CHECK_EQ(park(e, &k1, "a", &a, 1), 0);
    CHECK_EQ(pl_engine_waiting(e, &k1b), 1);
    CHECK_EQ(deliver(e, &k1b, &payload, 2, NULL), 1);
    CHECK_EQ(a.outcome, PL_OUTCOME_MATCHED);

    CHECK_EQ(park(e, &h1, "b", &b, 3), 0);
    CHECK_EQ(pl_engine_waiting(e, &h2), 1);
    CHECK_EQ(pl_engine_waiting(e, &q), 0);
    CHECK_EQ(deliver(e, &q, &payload, 4, NULL), 0);
    CHECK_EQ(b.calls, 0);
    CHECK_EQ(deliver(e, &h2, &payload, 4, NULL), 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_free(e);
}

static void test_keys_split_differs(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_key k1 = key("ab", "c", 1, 1);
    pl_key k2 = key("a", "bc", 1, 1);
    owner_t a = {0}, b = {0};
    int payload = 1;

    CHECK_EQ(park(e, &k1, "a", &a, 1), 0);
    CHECK_EQ(pl_engine_waiting(e, &k2), 0);
    CHECK_EQ(deliver(e, &k2, &payload, 2, NULL), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(park(e, &k2, "b", &b, 3), 0);
    CHECK_EQ(pl_engine_key_count(e), 2);
    CHECK_EQ(deliver(e, &k2, &payload, 4, NULL), 1);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(a.calls, 0);
    pl_engine_free(e);
}

/* ---- names and sizes ---------------------------------------------------- */

static void test_outcome_names(void)
{
    CHECK_STR(pl_outcome_name(PL_OUTCOME_MATCHED), "matched");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_TIMEOUT), "timeout");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_DISCONNECT), "disconnect");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_REPLACED), "replaced");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_SHUTDOWN), "shutdown");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_REJECTED), "rejected");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_HANDED_OVER), "handed_over");
    CHECK_STR(pl_outcome_name(PL_OUTCOME_REVOKED), "revoked");
    CHECK_STR(pl_outcome_name(PL_OUTCOME__COUNT), "unknown");
    CHECK(pl_engine_waiter_size(40) >= 40);
    /* short ids share the waiter pool's size; a long one costs more */
    CHECK(pl_engine_waiter_size(1) == pl_engine_waiter_size(40));
    CHECK(pl_engine_waiter_size(200) > 200);
    CHECK(pl_engine_waiter_size(200) > pl_engine_waiter_size(40));
}

int main(void)
{
    RUN(test_park_and_match);
    RUN(test_deliver_empty_queues_nothing);
    RUN(test_settle_disconnect);
    RUN(test_replace_same_controller);
    RUN(test_replace_same_tenant_only);
    RUN(test_replace_same_tenant_many);
    RUN(test_replace_at_cap);
    RUN(test_fifo_order);
    RUN(test_lifo_order);
    RUN(test_order_is_per_key);
    RUN(test_caps_reject);
    RUN(test_key_entry_freed);
    RUN(test_key_mark);
    RUN(test_deliver_skips_refusing);
    RUN(test_expire_and_deadline);
    RUN(test_drain);
    RUN(test_free_settles_remaining);
    RUN(test_keys_numbers_as_numbers);
    RUN(test_keys_split_differs);
    RUN(test_outcome_names);
    return unit_finish();
}
