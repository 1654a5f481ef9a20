/* engine_fixture.h -- what the engine's unit tests share: owners that
 * record what the settle callback told them, and small helpers. */
#ifndef PILOTLIGHT_ENGINE_FIXTURE_H
#define PILOTLIGHT_ENGINE_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static inline void log_reset(void)
{
    log_len = 0;
}

static inline int settle_cb(void *owner, pl_outcome outcome, const void *arg)
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

/* pl_engine_find() then pl_engine_park(): the engine's one way to park,
 * for a key looked up just before. */
static inline int park_n(pl_engine *e, const pl_key *k, const char *id, size_t id_len,
                         void *o, uint64_t now, pl_waiter **w)
{
    pl_engine_spot spot;

    pl_engine_find(e, k, &spot);
    return pl_engine_park(e, &spot, id, id_len, o, now, w);
}

/* pl_engine_find() then pl_engine_deliver(). */
static inline int deliver_d(pl_engine *e, const pl_key *k, uint64_t now, pl_delivery *d)
{
    pl_engine_spot spot;

    pl_engine_find(e, k, &spot);
    return pl_engine_deliver(e, &spot, now, d);
}

/* pl_engine_deliver() with no vet; *waited is set only when a waiter took
 * the payload. */
static inline int deliver(pl_engine *e, const pl_key *k, const void *payload, uint64_t now,
                          uint64_t *waited)
{
    pl_delivery d = {.payload = payload};
    int rc = deliver_d(e, k, now, &d);

    if (waited != NULL && (rc == PL_DELIVERED || rc == PL_DELIVERY_PENDING))
        *waited = d.waited_ms;
    return rc;
}

static inline pl_engine *engine(pl_order order, uint32_t max, uint32_t per_key,
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

static inline pl_key key(const char *dep, const char *ver, double cpu, double mem)
{
    pl_key k = {dep, strlen(dep), ver, strlen(ver), cpu, mem};
    return k;
}

static inline int park(pl_engine *e, const pl_key *k, const char *id, owner_t *o,
                uint64_t now)
{
    return park_n(e, k, id, strlen(id), o, now, &o->w);
}

static inline int ledger_balanced(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total;
}

static inline void check_ledger(const pl_engine *e, uint64_t total, uint64_t now_n,
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


/* The revoke step's rule: tag <bad> goes, the others move on by one; the
 * reason is the owner itself for odd tags, none for even ones. */
static unsigned m_bad_tag;
static inline int judge_tag(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
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

#endif
