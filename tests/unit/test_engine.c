/* test_engine.c -- the matching engine alone: park, match, settle, caps,
 * expiry, allocation failure, and a randomized check against a model. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/wait.h>

#include "pilotlight/engine.h"
#include "pilotlight/key.h"
#include "pilotlight/mem.h"
#include "unit.h"

/* ---- owners: what the settle callback sees ---------------------------- */

typedef struct {
    int calls;          /* how many times the callback ran for us */
    pl_outcome outcome; /* the last outcome it gave */
    const void *arg;
    int refuse;         /* answer MATCHED with "client gone" */
    int pending;        /* answer MATCHED with "written, to be confirmed" */
    int gone;           /* answer REPLACED with "had hung up already" */
    pl_waiter *w;       /* from pl_engine_park() */
    /* used by the model test */
    int key, id;
    uint64_t parked_at;
    unsigned tag;       /* as set with pl_engine_set_tag() */
    int held;           /* held for a hand-over */
} owner_t;

/* Every callback, in order, since the last log_reset(). */
#define LOG_MAX 8192
static struct {
    owner_t *owner;
    pl_outcome outcome;
} settle_log[LOG_MAX];
static size_t log_len;
static unsigned long total_callbacks;
static unsigned long double_settles;

static void log_reset(void)
{
    log_len = 0;
}

static int settle_cb(void *owner, pl_outcome outcome, const void *arg)
{
    owner_t *o = owner;

    if (o->calls > 0)
        double_settles++;
    o->calls++;
    o->outcome = outcome;
    o->arg = arg;
    total_callbacks++;
    if (log_len < LOG_MAX) {
        settle_log[log_len].owner = o;
        settle_log[log_len].outcome = outcome;
        log_len++;
    }
    if (outcome == PL_OUTCOME_MATCHED && o->pending)
        return PL_SETTLE_PENDING;
    if (outcome == PL_OUTCOME_REPLACED && o->gone)
        return -EPIPE;
    return outcome == PL_OUTCOME_MATCHED && o->refuse ? -EPIPE : 0;
}

/* ---- helpers ------------------------------------------------------------ */

/* pl_engine_deliver() with no vet; *waited is set only when a waiter took
 * the payload. */
static int deliver(pl_engine *e, const pl_key *k, const void *payload, uint64_t now,
                   uint64_t *waited)
{
    pl_delivery d = {.payload = payload};
    int rc = pl_engine_deliver(e, k, now, &d);

    if (waited != NULL && (rc == PL_DELIVERED || rc == PL_DELIVERY_PENDING))
        *waited = d.waited_ms;
    return rc;
}

static pl_engine *engine(pl_order order, uint32_t max, uint32_t per_key,
                         uint64_t timeout)
{
    pl_engine_opts opts;
    pl_engine *e;

    memset(&opts, 0, sizeof(opts));
    opts.order = order;
    opts.max_waiters = max;
    opts.max_waiters_per_key = per_key;
    opts.park_timeout_ms = timeout;
    opts.settle = settle_cb;
    e = pl_engine_new(&opts);
    CHECK(e != NULL);
    return e;
}

static pl_key key(const char *dep, const char *ver, double cpu, double mem)
{
    pl_key k = {dep, strlen(dep), ver, strlen(ver), cpu, mem};
    return k;
}

static int park(pl_engine *e, const pl_key *k, const char *id, owner_t *o,
                uint64_t now)
{
    return pl_engine_park(e, k, id, strlen(id), o, now, &o->w);
}

static int ledger_balanced(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total;
}

static void check_ledger(const pl_engine *e, uint64_t total, uint64_t now_n,
                         const uint64_t settled[PL_OUTCOME__COUNT])
{
    const pl_ledger *l = pl_engine_ledger(e);

    CHECK_EQ(l->parked_total, total);
    CHECK_EQ(l->parked_now, now_n);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        CHECK_EQ(l->settled[i], settled[i]);
    CHECK(ledger_balanced(l));
}

static const pl_key KA = {"dep-a", 5, "v1", 2, 1, 1024};
static const pl_key KB = {"dep-a", 5, "v1", 2, 1, 2048};
static const pl_key KC = {"dep-c", 5, "v1", 2, 2, 4096};

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
    CHECK_EQ(pl_engine_park(e, &KB, "c1x", 2, &d, 6, &d.w), 0);
    CHECK_EQ(c.calls, 1);
    CHECK_EQ(c.outcome, PL_OUTCOME_REPLACED);
    CHECK_EQ(pl_engine_park(e, &KB, "c1", 1, &f, 7, &f.w), 0);
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

/* The caller's mark on a key: kept from a park or a delivery at a found
 * spot while the key has waiters, per key, and forgotten with the last. */
static void test_key_mark(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0};
    pl_engine_spot spot;
    pl_delivery d = {0};
    int payload = 1;
    pl_key bad = key("", "v1", 1, 1024);

    CHECK_EQ(pl_engine_find(e, &bad, &spot), PL_EINVAL);
    CHECK_EQ(pl_engine_park_at(e, &spot, &bad, "a", 1, &a, 1, &a.w), PL_EINVAL);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry == NULL && spot.mark == 0);
    spot.mark = 7;
    CHECK_EQ(pl_engine_park_at(e, &spot, &KA, "a", 1, &a, 1, &a.w), 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry != NULL && spot.mark == 7);
    CHECK_EQ(pl_engine_find(e, &KB, &spot), 0); /* another key: its own */
    CHECK(spot.entry == NULL && spot.mark == 0);
    CHECK_EQ(park(e, &KB, "c", &c, 2), 0);      /* pl_engine_park leaves it 0 */
    CHECK_EQ(pl_engine_find(e, &KB, &spot), 0);
    CHECK_EQ(spot.mark, 0);

    /* A park at a found spot and a delivery from one leave theirs. */
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    spot.mark = 8;
    CHECK_EQ(pl_engine_park_at(e, &spot, &KA, "b", 1, &b, 3, &b.w), 0);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK_EQ(spot.mark, 8);
    spot.mark = 9;
    d.payload = &payload;
    CHECK_EQ(pl_engine_deliver_at(e, &spot, 4, &d), PL_DELIVERED);
    CHECK(d.owner == &a && a.outcome == PL_OUTCOME_MATCHED);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK_EQ(spot.mark, 9);

    /* The last waiter takes the mark with it. */
    spot.mark = 10;
    CHECK_EQ(pl_engine_deliver_at(e, &spot, 5, &d), PL_DELIVERED);
    CHECK(d.owner == &b);
    CHECK_EQ(pl_engine_find(e, &KA, &spot), 0);
    CHECK(spot.entry == NULL && spot.mark == 0);
    CHECK_EQ(pl_engine_deliver_at(e, &spot, 6, &d), 0);
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

/* ---- allocation failure ------------------------------------------------- */

typedef struct {
    pl_ledger ledger;
    size_t keys;
    size_t waiting[4];
    unsigned long callbacks;
} snapshot;

static snapshot snap(const pl_engine *e, const pl_key *probe[4])
{
    snapshot s;

    memset(&s, 0, sizeof(s));
    s.ledger = *pl_engine_ledger(e);
    s.keys = pl_engine_key_count(e);
    for (int i = 0; i < 4; i++)
        s.waiting[i] = probe[i] ? pl_engine_waiting(e, probe[i]) : 0;
    s.callbacks = total_callbacks;
    return s;
}

static int snap_equal(const snapshot *a, const snapshot *b)
{
    return memcmp(&a->ledger, &b->ledger, sizeof(a->ledger)) == 0 &&
           a->keys == b->keys && a->callbacks == b->callbacks &&
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
            rc = pl_engine_park(e, k, id, strlen(id), o, now, &w);
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

/* ---- randomized model test ---------------------------------------------- */

#define M_KEYS 6
#define M_IDS 10
#define M_WANT (M_IDS * M_KEYS + 2) /* settlements one step can cause */
#define M_STEPS 4000

/* Each model key, written two ways that must mean the same key. */
static const struct {
    const char *dep, *ver, *cpu[2], *mem[2];
} mkeys[M_KEYS] = {
    {"dep-a", "v1", {"1", "1.0"}, {"512", "5.12e2"}},
    {"dep-a", "v1", {"2", "2e0"}, {"512", "512.00"}},
    {"dep-a", "v2", {"1", "10e-1"}, {"512", "512"}},
    {"dep-b", "v1", {"0.5", "5e-1"}, {"1024", "1024.0"}},
    {"ab", "c", {"1", "1"}, {"1", "1"}},
    {"a", "bc", {"1", "1"}, {"1", "1"}},
};

/* Builds model key <i> in caller-provided fresh buffers, so that only
 * content can make two keys equal. */
static pl_key mkey(int i, unsigned variant, char dep[32], char ver[32])
{
    pl_key k;
    const char *cpu = mkeys[i].cpu[variant & 1];
    const char *mem = mkeys[i].mem[(variant >> 1) & 1];

    snprintf(dep, 32, "%s", mkeys[i].dep);
    snprintf(ver, 32, "%s", mkeys[i].ver);
    k = key(dep, ver, 0, 0);
    CHECK_EQ(pl_key_parse_number(cpu, strlen(cpu), &k.cpu), 0);
    CHECK_EQ(pl_key_parse_number(mem, strlen(mem), &k.memory), 0);
    return k;
}

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    /* xorshift64*: fixed sequence for a seed on every platform. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 33) % n;
}

typedef struct {
    pl_order order;
    uint32_t max, per_key;
    uint64_t timeout;
    /* per-key queues, oldest first; ids are unique among the live waiters
     * of one deployment, so no queue holds more than M_IDS (and all of
     * them together at most M_IDS per deployment: M_WANT bounds both) */
    owner_t *q[M_KEYS][M_IDS];
    size_t n[M_KEYS];
    uint64_t total, settled[PL_OUTCOME__COUNT];
    /* the callbacks the current step should cause */
    struct {
        owner_t *owner;
        pl_outcome outcome;
    } want[M_WANT];
    size_t nwant;
} model;

static owner_t m_owners[M_STEPS];
static uint64_t m_seen[PL_OUTCOME__COUNT]; /* over all runs */

static void m_remove(model *m, int k, size_t pos, pl_outcome outcome)
{
    owner_t *o = m->q[k][pos];

    memmove(&m->q[k][pos], &m->q[k][pos + 1],
            (m->n[k] - pos - 1) * sizeof(m->q[k][0]));
    m->n[k]--;
    m->settled[outcome]++;
    m->want[m->nwant].owner = o;
    m->want[m->nwant].outcome = outcome;
    m->nwant++;
}

static size_t m_live(const model *m)
{
    size_t sum = 0;

    for (int k = 0; k < M_KEYS; k++)
        sum += m->n[k];
    return sum;
}

/* The model's pl_engine_park(). Returns the expected return code. */
static int m_park(model *m, owner_t *o)
{
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k]; i++)
            if (m->q[k][i]->id == o->id && !m->q[k][i]->held &&
                strcmp(mkeys[k].dep, mkeys[o->key].dep) == 0) {
                m_remove(m, k, i, PL_OUTCOME_REPLACED);
                k = M_KEYS;
                break;
            }
    m->total++;
    if ((m->max && m_live(m) >= m->max) ||
        (m->per_key && m->n[o->key] >= m->per_key)) {
        m->settled[PL_OUTCOME_REJECTED]++;
        m->want[m->nwant].owner = o;
        m->want[m->nwant].outcome = PL_OUTCOME_REJECTED;
        m->nwant++;
        return PL_EREJECTED;
    }
    m->q[o->key][m->n[o->key]++] = o;
    return 0;
}

/* The model's pl_engine_deliver(): returns the owner that takes it. */
static owner_t *m_deliver(model *m, int k)
{
    for (;;) {
        size_t pos, i;
        owner_t *o;

        for (i = 0; i < m->n[k] && m->q[k][m->order == PL_ORDER_FIFO ? i : m->n[k] - 1 - i]->held;
             i++)
            ;
        if (i == m->n[k])
            break;
        pos = m->order == PL_ORDER_FIFO ? i : m->n[k] - 1 - i;
        o = m->q[k][pos];

        if (o->refuse) {
            /* offered MATCHED, refused: counted as a disconnect */
            m_remove(m, k, pos, PL_OUTCOME_MATCHED);
            m->settled[PL_OUTCOME_MATCHED]--;
            m->settled[PL_OUTCOME_DISCONNECT]++;
            continue;
        }
        m_remove(m, k, pos, PL_OUTCOME_MATCHED);
        return o;
    }
    return NULL;
}

static size_t m_expire(model *m, uint64_t now)
{
    size_t n = 0;

    if (m->timeout == 0)
        return 0;
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k];)
            if (m->q[k][i]->parked_at + m->timeout <= now && !m->q[k][i]->held) {
                m_remove(m, k, i, PL_OUTCOME_TIMEOUT);
                n++;
            } else {
                i++;
            }
    return n;
}

static void m_drain(model *m)
{
    for (int k = 0; k < M_KEYS; k++)
        while (m->n[k] > 0)
            m_remove(m, k, 0, PL_OUTCOME_SHUTDOWN);
}

/* The newest live waiter not held: of key <k>, or of any key (k < 0). */
static int m_newest(const model *m, int k, int *kk, size_t *pos)
{
    const owner_t *best = NULL;

    for (int j = k < 0 ? 0 : k; j < (k < 0 ? M_KEYS : k + 1); j++)
        for (size_t i = 0; i < m->n[j]; i++)
            if (!m->q[j][i]->held && (best == NULL || m->q[j][i] > best)) {
                best = m->q[j][i]; /* owners are taken in park order */
                *kk = j;
                *pos = i;
            }
    return best != NULL;
}

/* The model's pl_engine_enforce_caps(). */
static void m_enforce_caps(model *m)
{
    int kk = 0;
    size_t pos = 0;

    for (int k = 0; k < M_KEYS && m->per_key > 0; k++)
        while (m->n[k] > m->per_key && m_newest(m, k, &kk, &pos))
            m_remove(m, kk, pos, PL_OUTCOME_REJECTED);
    while (m->max > 0 && m_live(m) > m->max && m_newest(m, -1, &kk, &pos))
        m_remove(m, kk, pos, PL_OUTCOME_REJECTED);
}

/* The revoke step's rule: tag <bad> goes, the others move on by one; the
 * reason is the owner itself for odd tags, none for even ones. */
static unsigned m_bad_tag;
static int judge_tag(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    owner_t *o = info->owner;

    (void)arg;
    CHECK_EQ(*tag, o->tag);
    CHECK(!info->held);
    if (*tag == m_bad_tag) {
        *why = *tag & 1 ? (const void *)o : NULL;
        return 1;
    }
    *tag = (*tag + 1) % 4;
    return 0;
}

static void m_revoke(model *m, pl_outcome outcome)
{
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k];) {
            owner_t *o = m->q[k][i];
            if (!o->held && o->tag == m_bad_tag) {
                m_remove(m, k, i, outcome);
                continue;
            }
            if (!o->held)
                o->tag = (o->tag + 1) % 4;
            i++;
        }
}

static int by_owner(const void *a, const void *b)
{
    const owner_t *x = *(owner_t *const *)a, *y = *(owner_t *const *)b;
    return x < y ? -1 : x > y;
}

/* Checks the callbacks since log_reset() are exactly the model's
 * expected settlements (in any order), then the engine's counters. */
static void m_check(const model *m, const pl_engine *e, const void *payload,
                    unsigned variant)
{
    owner_t *got[LOG_MAX], *want[M_WANT];
    char dep[32], ver[32];
    size_t live = 0, keys = 0;
    uint64_t oldest = UINT64_MAX, dl = 0;

    CHECK_EQ(log_len, m->nwant);
    for (size_t i = 0; i < log_len && i < m->nwant; i++) {
        got[i] = settle_log[i].owner;
        want[i] = m->want[i].owner;
    }
    if (log_len == m->nwant) {
        qsort(got, log_len, sizeof(got[0]), by_owner);
        qsort(want, log_len, sizeof(want[0]), by_owner);
        for (size_t i = 0; i < log_len; i++)
            CHECK(got[i] == want[i]);
        for (size_t i = 0; i < m->nwant; i++) {
            const owner_t *o = m->want[i].owner;
            pl_outcome w = m->want[i].outcome;
            CHECK_EQ(o->calls, 1);
            CHECK_EQ(o->outcome, w);
            if (w == PL_OUTCOME_MATCHED)
                CHECK(o->arg == payload);
            else if (w == PL_OUTCOME_REJECTED)
                CHECK(o->arg != NULL && *(const char *)o->arg != '\0');
            else if (w == PL_OUTCOME_REVOKED || w == PL_OUTCOME_MOVED)
                CHECK(o->arg == (o->tag & 1 ? (const void *)o : NULL));
            else
                CHECK(o->arg == NULL);
        }
    }
    CHECK_EQ(double_settles, 0);

    for (int k = 0; k < M_KEYS; k++) {
        pl_key key_k = mkey(k, variant + (unsigned)k, dep, ver);
        CHECK_EQ(pl_engine_waiting(e, &key_k), m->n[k]);
        live += m->n[k];
        keys += m->n[k] > 0;
        for (size_t i = 0; i < m->n[k]; i++) {
            CHECK_EQ(m->q[k][i]->calls, 0);
            if (!m->q[k][i]->held && m->q[k][i]->parked_at < oldest)
                oldest = m->q[k][i]->parked_at;
        }
    }
    CHECK_EQ(pl_engine_key_count(e), keys);

    const pl_ledger *l = pl_engine_ledger(e);
    CHECK_EQ(l->parked_now, live);
    CHECK_EQ(l->parked_total, m->total);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        CHECK_EQ(l->settled[i], m->settled[i]);
    CHECK(ledger_balanced(l));

    if (m->timeout && oldest != UINT64_MAX) {
        CHECK_EQ(pl_engine_next_deadline(e, &dl), 0);
        CHECK_EQ(dl, oldest + m->timeout);
    } else {
        CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    }
}

static const char *op_names[] = {"park", "deliver", "disconnect", "expire",
                                 "drain", "revoke", "caps", "hold"};

/* Returns 0 when the run matched the model throughout. */
static int model_run(uint64_t seed, pl_order order, uint32_t max,
                     uint32_t per_key, uint64_t timeout)
{
    static model m;
    pl_engine *e = engine(order, max, per_key, timeout);
    uint64_t now = 1000;
    size_t nowners = 0;
    int payload[1];
    unsigned long fail0 = unit_failures;
    int step;

    memset(&m, 0, sizeof(m));
    memset(m_owners, 0, sizeof(m_owners));
    m.order = order;
    m.max = max;
    m.per_key = per_key;
    m.timeout = timeout;
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    double_settles = 0;

    for (step = 0; step < M_STEPS; step++) {
        uint32_t r = rnd(1000);
        int op = r < 430 ? 0 : r < 680 ? 1 : r < 780 ? 2 : r < 940 ? 3 : r < 945 ? 4
                 : r < 960 ? 5 : r < 970 ? 6 : 7;
        unsigned variant = rnd(4);
        char dep[32], ver[32];
        const void *offered = NULL;

        now += rnd(15);
        log_reset();
        m.nwant = 0;
        if (op == 0) {
            owner_t *o = &m_owners[nowners++];
            pl_key k;
            int want_rc, rc;

            o->key = (int)rnd(M_KEYS);
            o->id = (int)rnd(M_IDS);
            o->refuse = rnd(5) == 0;
            o->parked_at = now;
            o->tag = rnd(4);
            /* A held waiter is never replaced, so a poll of its id would
             * park beside it; which of two the next one replaces is then
             * the index's business: the model parks none such. */
            for (int kk = 0; kk < M_KEYS; kk++)
                for (size_t i = 0; i < m.n[kk]; i++)
                    if (m.q[kk][i]->held && m.q[kk][i]->id == o->id &&
                        strcmp(mkeys[kk].dep, mkeys[o->key].dep) == 0)
                        o->id = -1;
            if (o->id < 0) {
                memset(o, 0, sizeof(*o));
                nowners--;
                m_check(&m, e, NULL, variant);
                continue;
            }
            k = mkey(o->key, variant, dep, ver);
            char id[16];
            snprintf(id, sizeof(id), "ctl-%d", o->id);
            want_rc = m_park(&m, o);
            rc = park(e, &k, id, o, now);
            CHECK_EQ(rc, want_rc);
            CHECK((rc == 0) == (o->w != NULL));
            if (rc == 0)
                pl_engine_set_tag(o->w, o->tag);
        } else if (op == 1) {
            int ki = (int)rnd(M_KEYS);
            pl_key k = mkey(ki, variant, dep, ver);
            owner_t *want = m_deliver(&m, ki);
            uint64_t waited = 424242;
            int rc = deliver(e, &k, payload, now, &waited);

            offered = payload;
            CHECK_EQ(rc, want != NULL);
            if (want != NULL && rc == 1)
                CHECK_EQ(waited, now - want->parked_at);
            else
                CHECK_EQ(waited, 424242);
        } else if (op == 2) {
            size_t live = m_live(&m);
            if (live > 0) {
                size_t pick = rnd((uint32_t)live);
                for (int k = 0; k < M_KEYS; k++) {
                    if (pick < m.n[k]) {
                        owner_t *o = m.q[k][pick];
                        /* a client leaving, or (an upgrade) its socket
                         * handed to a new process: the same exit */
                        pl_outcome oc = variant & 1 ? PL_OUTCOME_HANDED_OVER
                                                    : PL_OUTCOME_DISCONNECT;
                        m_remove(&m, k, pick, oc);
                        pl_engine_settle(e, o->w, oc);
                        break;
                    }
                    pick -= m.n[k];
                }
            }
        } else if (op == 3) {
            now += rnd(40);
            CHECK_EQ(pl_engine_expire(e, now), m_expire(&m, now));
        } else if (op == 4) {
            m_drain(&m);
            pl_engine_drain(e);
        } else if (op == 5) {
            /* a reload's judge, or the ring's */
            pl_outcome oc = rnd(2) ? PL_OUTCOME_REVOKED : PL_OUTCOME_MOVED;
            size_t n;
            m_bad_tag = rnd(4);
            n = pl_engine_settle_if(e, oc, judge_tag, NULL); /* judged on the tags before */
            m_revoke(&m, oc);
            CHECK_EQ(n, m.nwant);
        } else if (op == 6) {
            static const uint32_t maxes[] = {0, 2, 5, 9, 30};
            pl_engine_opts opts = {order, maxes[rnd(5)], maxes[rnd(4)], timeout, settle_cb};
            m.max = opts.max_waiters;
            m.per_key = opts.max_waiters_per_key;
            pl_engine_set_opts(e, &opts);
            m_enforce_caps(&m);
            CHECK_EQ(pl_engine_enforce_caps(e), m.nwant);
        } else {
            size_t live = m_live(&m), pick = live ? rnd((uint32_t)live) : 0;
            int release = rnd(3) == 0;
            for (int k = 0; k < M_KEYS; k++)
                for (size_t i = 0; i < m.n[k]; i++, pick--) {
                    owner_t *o = m.q[k][i];
                    if (release ? o->held : pick == 0) {
                        o->held = !release;
                        pl_engine_hold(e, o->w, !release);
                    }
                }
        }
        m_check(&m, e, offered, variant);
        if (unit_failures != fail0) {
            fprintf(stderr,
                    "  model: seed=%llu order=%s max=%u per_key=%u "
                    "timeout=%llu: diverged at step %d (%s)\n",
                    (unsigned long long)seed,
                    order == PL_ORDER_FIFO ? "fifo" : "lifo", max, per_key,
                    (unsigned long long)timeout, step, op_names[op]);
            break;
        }
    }

    /* Freeing settles the rest; then every owner was settled once. */
    log_reset();
    m.nwant = 0;
    m_drain(&m);
    pl_engine_free(e);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        m_seen[i] += m.settled[i];
    if (unit_failures == fail0) {
        CHECK_EQ(log_len, m.nwant);
        for (size_t i = 0; i < nowners; i++)
            CHECK_EQ(m_owners[i].calls, 1);
        CHECK_EQ(double_settles, 0);
    }
    return unit_failures != fail0;
}

static void test_model(void)
{
    static const uint64_t seeds[] = {1, 2, 3, 20240611};
    static const uint32_t caps[][2] = {{0, 0}, {7, 3}};
    static const uint64_t timeouts[] = {0, 60};

    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++)
        for (int order = 0; order < 2; order++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 2; t++)
                    model_run(seeds[s], (pl_order)order, caps[c][0],
                              caps[c][1], timeouts[t]);
    /* The random steps reached every outcome, refusals included, but the
     * one a pending delivery alone ends in (test_pending_delivery_aborted). */
    for (int i = 0; i < PL_OUTCOME__COUNT; i++) {
        if (i == PL_OUTCOME_ABORTED)
            continue;
        if (m_seen[i] < 100)
            fprintf(stderr, "  model: only %llu %s\n",
                    (unsigned long long)m_seen[i],
                    pl_outcome_name((pl_outcome)i));
        CHECK(m_seen[i] >= 100);
    }
}

/* A delivery left pending stays counted as parked, out of every queue,
 * until pl_engine_confirm() says how it ended. */
static void test_pending_delivery(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a, b;
    pl_waiter *wa, *wb;
    int payload = 7;
    uint64_t waited = 0, due;
    const pl_ledger *l = pl_engine_ledger(e);

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.pending = b.pending = 1;
    CHECK_EQ(pl_engine_park(e, &KA, "a", 1, &a, 10, &wa), 0);
    CHECK_EQ(pl_engine_park(e, &KA, "b", 1, &b, 20, &wb), 0);
    CHECK_EQ(deliver(e, &KA, &payload, 50, &waited), PL_DELIVERY_PENDING);
    CHECK_EQ(waited, 40);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(l->parked_now, 2);             /* a is pending, b parked */
    CHECK_EQ(pl_engine_waiting(e, &KA), 1); /* but only b can be matched */
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 120);                     /* a left the time list */
    CHECK_EQ(pl_engine_expire(e, 115), 0);  /* nor can a time out */
    CHECK_EQ(a.calls, 1);
    pl_engine_confirm(e, wa, PL_OUTCOME_DISCONNECT); /* not acknowledged */
    CHECK_EQ(l->settled[PL_OUTCOME_DISCONNECT], 1);
    CHECK_EQ(l->parked_now, 1);
    CHECK_EQ(deliver(e, &KA, &payload, 60, &waited), PL_DELIVERY_PENDING);
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_confirm(e, wb, PL_OUTCOME_MATCHED);
    CHECK_EQ(l->settled[PL_OUTCOME_MATCHED], 1);
    CHECK_EQ(l->parked_now, 0);
    CHECK_EQ(l->parked_total, 2);
    CHECK_EQ(b.calls, 1);
    pl_engine_free(e);
}

/* Runs <fn> in a child; 1 when it was stopped by an invariant (SIGABRT). */
static int aborts(void (*fn)(void))
{
    int status = 0;
    pid_t pid = fork();

    if (pid == 0) {
        fclose(stderr); /* the invariant's report is expected */
        fn();
        _exit(0);
    }
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void settle_a_pending_waiter(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {.pending = 1};
    int payload = 1;

    park(e, &KA, "a", &a, 10);
    deliver(e, &KA, &payload, 20, NULL);
    pl_engine_settle(e, a.w, PL_OUTCOME_DISCONNECT); /* it is no longer parked */
}

static void confirm_a_parked_waiter(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {0};

    park(e, &KA, "a", &a, 10);
    pl_engine_confirm(e, a.w, PL_OUTCOME_MATCHED); /* nothing was delivered */
}

/* Exactly-once holds in release builds too: settling a waiter whose
 * delivery awaits confirmation, or confirming one still parked, would
 * answer a controller twice, and stops the process instead. */
static void test_invariants_stop_a_second_answer(void)
{
    CHECK(aborts(settle_a_pending_waiter));
    CHECK(aborts(confirm_a_parked_waiter));
}

/* The vet: skipped waiters stay parked and are offered, in order, only
 * when no other took the payload; a stop offers it to nobody. */
typedef struct {
    owner_t *skip[4];
    int stop_at;   /* stop when asked for the n-th time (1-based); 0: never */
    int asked;
} vet_t;

static int vet_cb(void *owner, void *arg)
{
    vet_t *v = arg;

    v->asked++;
    if (v->stop_at != 0 && v->asked == v->stop_at)
        return PL_VET_STOP;
    for (int i = 0; i < 4; i++)
        if (v->skip[i] == owner)
            return PL_VET_SKIP;
    return PL_VET_OFFER;
}

static void test_vet_skips_then_offers_the_skipped(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0};
    int payload = 3;
    vet_t v = {{&a, &b}, 0, 0};
    pl_delivery d = {.payload = &payload, .vet = vet_cb, .vet_arg = &v};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 3), 0);
    /* a and b are passed over: c, the third in line, takes it */
    CHECK_EQ(pl_engine_deliver(e, &KA, 10, &d), PL_DELIVERED);
    CHECK_EQ(c.calls, 1);
    CHECK(d.owner == &c);
    CHECK_EQ(d.waited_ms, 7);
    CHECK_EQ(a.calls + b.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* only suspects left: the second round offers them in order */
    v.asked = 0;
    CHECK_EQ(pl_engine_deliver(e, &KA, 11, &d), PL_DELIVERED);
    CHECK(d.owner == &a);
    CHECK_EQ(b.calls, 0);
    /* a refusing suspect is settled and the next one offered */
    b.refuse = 1;
    CHECK_EQ(pl_engine_deliver(e, &KA, 12, &d), 0);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(pl_engine_ledger(e)->settled[PL_OUTCOME_DISCONNECT], 1);
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_free(e);
}

static void test_vet_stop_offers_to_nobody(void)
{
    pl_engine *e = engine(PL_ORDER_LIFO, 0, 0, 0);
    owner_t a = {0}, b = {0};
    int payload = 4;
    vet_t v = {{NULL}, 1, 0};
    pl_delivery d = {.payload = &payload, .vet = vet_cb, .vet_arg = &v};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    CHECK_EQ(pl_engine_deliver(e, &KA, 10, &d), PL_DELIVERY_STOPPED);
    CHECK_EQ(a.calls + b.calls, 0);
    CHECK(d.owner == NULL);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* lifo: the newest first, then back to the oldest */
    v.stop_at = 0;
    v.skip[0] = &b;
    CHECK_EQ(pl_engine_deliver(e, &KA, 11, &d), PL_DELIVERED);
    CHECK(d.owner == &a);
    pl_engine_free(e);
}

static void collect_owner(void *owner, void *arg)
{
    owner_t **out = arg;

    while (*out != NULL)
        out++;
    *out = owner;
}

static void test_each_in_key_in_match_order(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0}, x = {0};
    owner_t *seen[5] = {NULL};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KB, "x", &x, 2), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 3), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 4), 0);
    CHECK_EQ(pl_engine_each_in_key(e, &KA, 2, collect_owner, seen), 2);
    CHECK(seen[0] == &a && seen[1] == &b && seen[2] == NULL);
    memset(seen, 0, sizeof(seen));
    CHECK_EQ(pl_engine_each_in_key(e, &KC, 8, collect_owner, seen), 0);
    pl_engine_free(e);
    e = engine(PL_ORDER_LIFO, 0, 0, 0);
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    memset(seen, 0, sizeof(seen));
    CHECK_EQ(pl_engine_each_in_key(e, &KA, 8, collect_owner, seen), 2);
    CHECK(seen[0] == &b && seen[1] == &a);
    pl_engine_free(e);
}

/* A pending delivery the broker gave up on ends as aborted: counted apart
 * from a client's disconnect, and the ledger still adds up. */
static void test_pending_delivery_aborted(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0};
    int payload = 5;
    pl_delivery d = {.payload = &payload};
    const pl_ledger *l = pl_engine_ledger(e);

    a.pending = 1;
    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(pl_engine_deliver(e, &KA, 2, &d), PL_DELIVERY_PENDING);
    CHECK(d.waiter == a.w && d.owner == &a);
    pl_engine_confirm(e, d.waiter, PL_OUTCOME_ABORTED);
    CHECK_EQ(l->settled[PL_OUTCOME_ABORTED], 1);
    CHECK_EQ(l->settled[PL_OUTCOME_DISCONNECT], 0);
    CHECK_EQ(l->parked_now, 0);
    CHECK_STR(pl_outcome_name(PL_OUTCOME_ABORTED), "aborted");
    pl_engine_free(e);
}

/* ---- binary upgrade: hand-over between two engines; live options -------- */

typedef struct {
    pl_waiter_info info[16];
    char ids[16][16];
    char deps[16][16];
    size_t n;
} collected;

static void collect(const pl_waiter_info *info, void *arg)
{
    collected *c = arg;

    if (c->n >= 16)
        return;
    c->info[c->n] = *info;
    snprintf(c->ids[c->n], 16, "%s", info->id);
    snprintf(c->deps[c->n], 16, "%.*s", (int)info->key.deployment_len, info->key.deployment);
    c->n++;
}

static int balanced_with_adopted(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total + l->adopted;
}

static void test_hand_over_between_engines(void)
{
    pl_engine *old = engine(PL_ORDER_FIFO, 0, 0, 100), *neu = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a[5] = {{0}}, b[5] = {{0}};
    const pl_key *keys[5] = {&KA, &KB, &KA, &KC, &KA};
    char id[32];
    collected c = {.n = 0};
    int payload = 7;

    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "ctl-%d", i);
        CHECK_EQ(park(old, keys[i], id, &a[i], 10 + (uint64_t)i), 0);
    }
    CHECK_EQ(pl_engine_each_waiter(old, collect, &c), 5);
    for (size_t i = 0; i < c.n; i++) {
        pl_key k = c.info[i].key;
        snprintf(id, sizeof(id), "ctl-%zu", i);
        CHECK_STR(c.ids[i], id); /* oldest first */
        CHECK(c.info[i].owner == &a[i] && c.info[i].w == a[i].w);
        CHECK_EQ(c.info[i].parked_at, 10 + i);
        k.deployment = c.deps[i];
        CHECK_EQ(pl_engine_adopt(neu, &k, c.ids[i], strlen(c.ids[i]), &b[i],
                                 c.info[i].parked_at, &b[i].w), 0);
    }
    /* the same controller id cannot be adopted twice */
    owner_t dup = {0};
    CHECK_EQ(pl_engine_adopt(neu, &KA, "ctl-0", 5, &dup, 50, &dup.w), PL_EEXIST);
    CHECK(dup.w == NULL && dup.calls == 0);
    for (int i = 0; i < 5; i++)
        pl_engine_settle(old, a[i].w, PL_OUTCOME_HANDED_OVER);
    const pl_ledger *lo = pl_engine_ledger(old), *ln = pl_engine_ledger(neu);
    CHECK_EQ(lo->parked_total, 5);
    CHECK_EQ(lo->parked_now, 0);
    CHECK_EQ(lo->settled[PL_OUTCOME_HANDED_OVER], 5);
    CHECK(balanced_with_adopted(lo));
    CHECK_EQ(ln->parked_total, 0);
    CHECK_EQ(ln->adopted, 5);
    CHECK_EQ(ln->parked_now, 5);
    CHECK(balanced_with_adopted(ln));
    for (int i = 0; i < 5; i++)
        CHECK(a[i].calls == 1 && a[i].outcome == PL_OUTCOME_HANDED_OVER);
    CHECK_EQ(pl_engine_waiting(neu, &KA), 3);
    CHECK_EQ(pl_engine_key_count(neu), 3);
    /* the queue order came along: fifo still gives the oldest */
    CHECK_EQ(deliver(neu, &KA, &payload, 20, NULL), PL_DELIVERED);
    CHECK(b[0].calls == 1 && b[0].outcome == PL_OUTCOME_MATCHED);
    /* and the deadlines: parked at 11..14, timeout 100 */
    uint64_t due = 0;
    CHECK_EQ(pl_engine_next_deadline(neu, &due), 0);
    CHECK_EQ(due, 111);
    CHECK_EQ(pl_engine_expire(neu, 111), 1);
    CHECK(b[1].outcome == PL_OUTCOME_TIMEOUT);
    /* a parked_at older than the newest waiter's keeps the list sorted */
    owner_t late = {0};
    CHECK_EQ(pl_engine_adopt(neu, &KC, "ctl-late", 8, &late, 1, &late.w), 0);
    pl_engine_free(neu); /* settles the rest as shutdown */
    CHECK(late.calls == 1 && late.outcome == PL_OUTCOME_SHUTDOWN);
    CHECK_EQ(pl_engine_adopt(old, &(pl_key){"", 0, "v", 1, 1, 1}, "x", 1, &late, 1, &late.w),
             PL_EINVAL);
    pl_engine_free(old);
}

/* Adoption keys on the controller id and deployment, as parking does. */
static void test_adopt_is_per_tenant(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t v = {0}, a = {0}, v2 = {0}, v3 = {0};

    CHECK_EQ(pl_engine_adopt(e, &KA, "ctl", 3, &v, 1, &v.w), 0);
    CHECK_EQ(pl_engine_adopt(e, &KC, "ctl", 3, &a, 2, &a.w), 0);    /* dep-c */
    CHECK_EQ(pl_engine_adopt(e, &KB, "ctl", 3, &v2, 3, &v2.w), PL_EEXIST); /* dep-a */
    CHECK(v2.w == NULL && v2.calls == 0);
    /* the controller's next poll replaces its own adopted waiter only */
    CHECK_EQ(park(e, &KA, "ctl", &v3, 4), 0);
    CHECK(v.calls == 1 && v.outcome == PL_OUTCOME_REPLACED);
    CHECK_EQ(a.calls, 0);
    pl_engine_free(e);
    CHECK(a.calls == 1 && v3.calls == 1);
}

static void test_set_opts_applies_from_the_next_park(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 3, 0);
    owner_t o[4] = {{0}};
    pl_engine_opts opts = {PL_ORDER_LIFO, 0, 1, 0, settle_cb};
    int payload = 1;

    CHECK_EQ(park(e, &KA, "a", &o[0], 1), 0);
    CHECK_EQ(park(e, &KA, "b", &o[1], 2), 0);
    pl_engine_set_opts(e, &opts);
    CHECK(o[0].calls == 0 && o[1].calls == 0); /* a lower cap closes nothing */
    CHECK_EQ(park(e, &KA, "c", &o[2], 3), PL_EREJECTED);
    CHECK_EQ(o[2].outcome, PL_OUTCOME_REJECTED);
    CHECK_EQ(deliver(e, &KA, &payload, 4, NULL), PL_DELIVERED);
    CHECK(o[1].calls == 1 && o[0].calls == 0); /* lifo now: the newest */
    pl_engine_free(e);
}

/* A waiter held for a hand-over: the other process holds its socket, so
 * nothing here may answer it until the verdict; released, it is as before. */
static void test_hold_for_a_hand_over(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {0}, b = {0}, a2 = {0}, c = {0}, d = {0};
    int payload = 3;
    uint64_t due = 0;

    CHECK_EQ(park(e, &KA, "a", &a, 10), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 20), 0);
    pl_engine_hold(e, a.w, 1);
    pl_engine_hold(e, a.w, 1); /* twice is once */
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 120); /* b's: a's waits */
    CHECK_EQ(pl_engine_expire(e, 115), 0);
    CHECK_EQ(a.calls, 0);
    /* fifo skips the held oldest; a newer poll of its id parks beside it */
    CHECK_EQ(deliver(e, &KA, &payload, 30, NULL), PL_DELIVERED);
    CHECK(b.calls == 1 && b.outcome == PL_OUTCOME_MATCHED && a.calls == 0);
    CHECK_EQ(deliver(e, &KA, &payload, 31, NULL), 0); /* only a: held */
    CHECK_EQ(park(e, &KA, "a", &a2, 40), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* no cap and no judge ends it */
    pl_engine_set_opts(e, &(pl_engine_opts){PL_ORDER_LIFO, 1, 1, 100, settle_cb});
    CHECK_EQ(pl_engine_enforce_caps(e), 1);
    CHECK(a2.calls == 1 && a2.outcome == PL_OUTCOME_REJECTED && a.calls == 0);
    CHECK_EQ(pl_engine_settle_if(e, PL_OUTCOME_REVOKED, judge_tag, NULL), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &due), -ENOENT);
    /* released: its deadline (passed) and its place come back */
    pl_engine_hold(e, a.w, 0);
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 110);
    CHECK_EQ(pl_engine_expire(e, 200), 1);
    CHECK(a.calls == 1 && a.outcome == PL_OUTCOME_TIMEOUT);
    /* lifo skips a held newest; a drain ends held waiters too */
    CHECK_EQ(park(e, &KC, "c", &c, 300), 0);
    CHECK_EQ(park(e, &KC, "d", &d, 301), PL_EREJECTED); /* max_waiters 1 */
    pl_engine_hold(e, c.w, 1);
    CHECK_EQ(deliver(e, &KC, &payload, 302, NULL), 0);
    pl_engine_drain(e);
    CHECK(c.calls == 1 && c.outcome == PL_OUTCOME_SHUTDOWN);
    CHECK(ledger_balanced(pl_engine_ledger(e)));
    pl_engine_free(e);
}

/* A lower cap applied to what is parked: the newest go, per key first. */
static void test_enforce_caps_takes_the_newest(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t o[6] = {{0}};
    const pl_key *keys[6] = {&KA, &KA, &KA, &KB, &KC, &KC};
    char id[8];

    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof(id), "c%d", i);
        CHECK_EQ(park(e, keys[i], id, &o[i], (uint64_t)i), 0);
    }
    CHECK_EQ(pl_engine_enforce_caps(e), 0); /* no cap: nothing */
    pl_engine_set_opts(e, &(pl_engine_opts){PL_ORDER_FIFO, 3, 2, 0, settle_cb});
    CHECK_EQ(pl_engine_enforce_caps(e), 3);
    /* KA over its cap of 2: its newest (o[2]); then 5 > 3 in all: o[5], o[4] */
    for (int i = 0; i < 6; i++)
        CHECK_EQ(o[i].calls, i == 2 || i >= 4);
    CHECK(o[2].outcome == PL_OUTCOME_REJECTED && o[4].outcome == PL_OUTCOME_REJECTED);
    CHECK_STR(o[2].arg, "too many parked polls for this deployment and machine");
    CHECK_STR(o[5].arg, "too many parked polls on this server");
    CHECK_EQ(pl_engine_ledger(e)->parked_now, 3);
    CHECK(ledger_balanced(pl_engine_ledger(e)));
    pl_engine_free(e);
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
    RUN(test_pending_delivery);
    RUN(test_vet_skips_then_offers_the_skipped);
    RUN(test_vet_stop_offers_to_nobody);
    RUN(test_each_in_key_in_match_order);
    RUN(test_pending_delivery_aborted);
    RUN(test_invariants_stop_a_second_answer);
    RUN(test_expire_and_deadline);
    RUN(test_drain);
    RUN(test_free_settles_remaining);
    RUN(test_keys_numbers_as_numbers);
    RUN(test_keys_split_differs);
    RUN(test_oom_new);
    RUN(test_oom_park);
    RUN(test_oom_park_replacing);
    RUN(test_outcome_names);
    RUN(test_model);
    RUN(test_hand_over_between_engines);
    RUN(test_adopt_is_per_tenant);
    RUN(test_set_opts_applies_from_the_next_park);
    RUN(test_hold_for_a_hand_over);
    RUN(test_enforce_caps_takes_the_newest);
    return unit_finish();
}
