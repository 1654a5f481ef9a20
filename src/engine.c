/* engine.c -- parked waiters in a hash map of queues, one settle path. */
#include <assert.h>
#include <string.h>

#include "pilotlight/engine.h"
#include "pilotlight/mem.h"

/* uthash allocates its buckets through our wrapper and, on failure, leaves
 * the table unchanged and tells us instead of calling exit(). */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) pl_malloc(sz)
#define uthash_free(ptr, sz) pl_free(ptr)
#define uthash_nonfatal_oom(obj) (oom_flag = 1)
static int oom_flag;
#include <uthash.h>

typedef struct pl_entry pl_entry;

struct pl_waiter {
    pl_waiter *qprev, *qnext; /* in its key's queue, oldest first */
    pl_waiter *tprev, *tnext; /* in the engine's time list, oldest first */
    pl_entry *entry;
    void *owner;
    uint64_t parked_at;
    UT_hash_handle hh; /* by controller id */
    char id[];
};

struct pl_entry {
    UT_hash_handle hh; /* by encoded key */
    pl_waiter *head, *tail;
    uint32_t count;
    uint32_t keylen;
    unsigned char keybytes[];
};

struct pl_engine {
    pl_engine_opts opts;
    pl_entry *entries;      /* uthash head, by key */
    pl_waiter *by_id;       /* uthash head, by controller id */
    pl_waiter *oldest;      /* time list: every waiter, by park time. One */
    pl_waiter *newest;      /* timeout for all keeps it sorted by deadline. */
    size_t nkeys;
    pl_ledger ledger;
};

pl_engine *pl_engine_new(const pl_engine_opts *opts)
{
    pl_engine *e = pl_malloc(sizeof(*e));

    if (e == NULL)
        return NULL;
    memset(e, 0, sizeof(*e));
    e->opts = *opts;
    return e;
}

void pl_engine_free(pl_engine *e)
{
    if (e == NULL)
        return;
    pl_engine_drain(e);
    HASH_CLEAR(hh, e->entries);
    HASH_CLEAR(hh, e->by_id);
    pl_free(e);
}

const pl_ledger *pl_engine_ledger(const pl_engine *e)
{
    return &e->ledger;
}

size_t pl_engine_key_count(const pl_engine *e)
{
    return e->nkeys;
}

size_t pl_engine_each_key(const pl_engine *e, size_t max,
                          void (*fn)(const pl_key_info *info, void *arg), void *arg)
{
    const pl_entry *ent;
    size_t n = 0;

    for (ent = e->entries; ent != NULL && n < max; ent = ent->hh.next, n++) {
        pl_key_info info;
        pl_key_decode(ent->keybytes, ent->keylen, &info.key);
        info.parked = ent->count;
        info.oldest_parked_at = ent->head->parked_at; /* appended in time order */
        fn(&info, arg);
    }
    return e->nkeys;
}

size_t pl_engine_waiter_size(size_t id_len)
{
    return sizeof(pl_waiter) + id_len + 1;
}

const char *pl_outcome_name(pl_outcome o)
{
    static const char *const names[PL_OUTCOME__COUNT] = {
        "matched", "timeout", "disconnect", "replaced", "shutdown", "rejected",
        "handed_over",
    };
    return (unsigned)o < PL_OUTCOME__COUNT ? names[o] : "unknown";
}

static pl_entry *lookup(const pl_engine *e, const unsigned char *buf, size_t len)
{
    pl_entry *ent = NULL;

    HASH_FIND(hh, e->entries, buf, len, ent);
    return ent;
}

static pl_entry *find_entry(const pl_engine *e, const pl_key *key)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(key, buf);

    return len > 0 ? lookup(e, buf, len) : NULL;
}

size_t pl_engine_waiting(const pl_engine *e, const pl_key *key)
{
    pl_entry *ent = find_entry(e, key);
    return ent ? ent->count : 0;
}

/* Adds an empty entry for the encoded key <buf>; NULL when out of memory. */
static pl_entry *new_entry(pl_engine *e, const unsigned char *buf, size_t len)
{
    pl_entry *ent = pl_malloc(sizeof(*ent) + len);

    if (ent == NULL)
        return NULL;
    memset(ent, 0, sizeof(*ent));
    ent->keylen = (uint32_t)len;
    memcpy(ent->keybytes, buf, len);
    oom_flag = 0;
    HASH_ADD(hh, e->entries, keybytes, len, ent);
    if (oom_flag) {
        pl_free(ent);
        return NULL;
    }
    e->nkeys++;
    return ent;
}

static void drop_entry_if_empty(pl_engine *e, pl_entry *ent)
{
    if (ent->count > 0)
        return;
    HASH_DELETE(hh, e->entries, ent);
    pl_free(ent);
    e->nkeys--;
}

/* Links <w> at the tail of its key's queue and of the time list. */
static void link_waiter(pl_engine *e, pl_waiter *w)
{
    pl_entry *ent = w->entry;

    w->qnext = NULL;
    w->qprev = ent->tail;
    if (ent->tail)
        ent->tail->qnext = w;
    else
        ent->head = w;
    ent->tail = w;
    ent->count++;

    w->tnext = NULL;
    w->tprev = e->newest;
    if (e->newest)
        e->newest->tnext = w;
    else
        e->oldest = w;
    e->newest = w;
    e->ledger.parked_now++;
}

static void unlink_waiter(pl_engine *e, pl_waiter *w)
{
    pl_entry *ent = w->entry;

    if (w->qprev)
        w->qprev->qnext = w->qnext;
    else
        ent->head = w->qnext;
    if (w->qnext)
        w->qnext->qprev = w->qprev;
    else
        ent->tail = w->qprev;
    ent->count--;

    if (w->tprev)
        w->tprev->tnext = w->tnext;
    else
        e->oldest = w->tnext;
    if (w->tnext)
        w->tnext->tprev = w->tprev;
    else
        e->newest = w->tprev;

    HASH_DELETE(hh, e->by_id, w);
    drop_entry_if_empty(e, ent);
}

static int ledger_balanced(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total + l->adopted;
}

/* The one exit of a waiter. <w> may be parked (linked) or not yet linked
 * (rejected at park). Returns the settle callback's answer. */
/* Counts <w>'s outcome and frees it. */
static void retire(pl_engine *e, pl_waiter *w, pl_outcome outcome, int linked)
{
    if (linked)
        e->ledger.parked_now--;
    e->ledger.settled[outcome]++;
    assert(ledger_balanced(&e->ledger));
    pl_free(w);
}

static int settle(pl_engine *e, pl_waiter *w, pl_outcome outcome,
                  const void *arg, int linked)
{
    int rc;

    if (linked)
        unlink_waiter(e, w);
    rc = e->opts.settle(w->owner, outcome, arg);
    if (outcome == PL_OUTCOME_MATCHED && rc == PL_SETTLE_PENDING)
        return rc; /* still counted as parked until pl_engine_confirm() */
    if (outcome == PL_OUTCOME_MATCHED && rc != 0)
        outcome = PL_OUTCOME_DISCONNECT;
    retire(e, w, outcome, linked);
    return rc;
}

void pl_engine_confirm(pl_engine *e, pl_waiter *w, int delivered)
{
    retire(e, w, delivered ? PL_OUTCOME_MATCHED : PL_OUTCOME_DISCONNECT, 1);
}

void pl_engine_settle(pl_engine *e, pl_waiter *w, pl_outcome outcome)
{
    settle(e, w, outcome, NULL, 1);
}

/* Returns why one more poll for <ent> would exceed a cap, or NULL. <old>, a
 * waiter about to be replaced, does not count: it leaves as this one comes. */
static const char *over_cap(const pl_engine *e, const pl_entry *ent,
                            const pl_waiter *old)
{
    uint64_t parked = e->ledger.parked_now - (old != NULL);
    uint32_t on_key = ent ? ent->count - (old != NULL && old->entry == ent) : 0;

    if (e->opts.max_waiters && parked >= e->opts.max_waiters)
        return "too many parked polls on this server";
    if (e->opts.max_waiters_per_key && on_key >= e->opts.max_waiters_per_key)
        return "too many parked polls for this deployment and machine";
    return NULL;
}

/* Makes every allocation a park needs: the key entry (unless <ent> exists
 * already) and the id index slot. Returns 0, or PL_ENOMEM with nothing
 * changed. */
static int index_waiter(pl_engine *e, pl_waiter *w, pl_entry *ent,
                        const unsigned char *key, size_t keylen, size_t id_len)
{
    w->entry = ent ? ent : new_entry(e, key, keylen);
    if (w->entry == NULL)
        return PL_ENOMEM;
    /* An older waiter of the same id may still be in the index: uthash
     * keeps both until that one is deleted by pointer. Adding first means
     * the table never empties (and is freed) in between. */
    oom_flag = 0;
    HASH_ADD_KEYPTR(hh, e->by_id, w->id, id_len, w);
    if (oom_flag) {
        drop_entry_if_empty(e, w->entry);
        return PL_ENOMEM;
    }
    return 0;
}

/* A waiter not yet in any list, or NULL when out of memory. */
static pl_waiter *new_waiter(const char *id, size_t id_len, void *owner, uint64_t parked_at)
{
    pl_waiter *w = pl_malloc(pl_engine_waiter_size(id_len));

    if (w == NULL)
        return NULL;
    memset(w, 0, sizeof(*w));
    memcpy(w->id, id, id_len);
    w->id[id_len] = '\0';
    w->owner = owner;
    w->parked_at = parked_at;
    return w;
}

int pl_engine_park(pl_engine *e, const pl_key *key, const char *id,
                   size_t id_len, void *owner, uint64_t now, pl_waiter **out)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(key, buf);
    pl_waiter *w, *old = NULL;
    pl_entry *ent;
    const char *why;

    *out = NULL;
    if (len == 0)
        return PL_EINVAL;
    w = new_waiter(id, id_len, owner, now);
    if (w == NULL)
        return PL_ENOMEM;

    HASH_FIND(hh, e->by_id, id, id_len, old);
    ent = lookup(e, buf, len);
    why = over_cap(e, ent, old);
    if (why == NULL && index_waiter(e, w, ent, buf, len, id_len) != 0) {
        pl_free(w);
        return PL_ENOMEM;
    }
    if (why == NULL) {
        e->ledger.parked_total++;
        link_waiter(e, w); /* before the old one leaves, so a shared entry stays */
    }
    /* The controller gave up on its older poll (it holds only one at a
     * time): answer that one 409, whether or not this one parks. */
    if (old != NULL)
        settle(e, old, PL_OUTCOME_REPLACED, NULL, 1);
    if (why != NULL) {
        e->ledger.parked_total++;
        settle(e, w, PL_OUTCOME_REJECTED, why, 0);
        return PL_EREJECTED;
    }
    *out = w;
    return 0;
}

int pl_engine_deliver(pl_engine *e, const pl_key *key, const void *payload,
                      uint64_t now, uint64_t *waited_ms)
{
    pl_entry *ent = find_entry(e, key);

    while (ent != NULL) {
        pl_waiter *w = e->opts.order == PL_ORDER_LIFO ? ent->tail : ent->head;
        uint64_t parked_at = w->parked_at;
        /* Settling the last waiter frees the entry: decide before. */
        pl_entry *next = ent->count > 1 ? ent : NULL;

        int rc = settle(e, w, PL_OUTCOME_MATCHED, payload, 1);

        if (rc == 0 || rc == PL_SETTLE_PENDING) {
            if (waited_ms)
                *waited_ms = now >= parked_at ? now - parked_at : 0;
            return rc == 0 ? PL_DELIVERED : PL_DELIVERY_PENDING;
        }
        ent = next;
    }
    return 0;
}

size_t pl_engine_expire(pl_engine *e, uint64_t now)
{
    size_t n = 0;

    if (e->opts.park_timeout_ms == 0)
        return 0;
    while (e->oldest != NULL &&
           e->oldest->parked_at + e->opts.park_timeout_ms <= now) {
        settle(e, e->oldest, PL_OUTCOME_TIMEOUT, NULL, 1);
        n++;
    }
    return n;
}

int pl_engine_next_deadline(const pl_engine *e, uint64_t *deadline)
{
    if (e->opts.park_timeout_ms == 0 || e->oldest == NULL)
        return -1;
    *deadline = e->oldest->parked_at + e->opts.park_timeout_ms;
    return 0;
}

void pl_engine_drain(pl_engine *e)
{
    while (e->oldest != NULL)
        settle(e, e->oldest, PL_OUTCOME_SHUTDOWN, NULL, 1);
}

void pl_engine_set_opts(pl_engine *e, const pl_engine_opts *opts)
{
    e->opts = *opts;
}

int pl_engine_adopt(pl_engine *e, const pl_key *key, const char *id, size_t id_len,
                    void *owner, uint64_t parked_at, pl_waiter **out)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(key, buf);
    pl_waiter *w, *old = NULL;

    *out = NULL;
    if (len == 0)
        return PL_EINVAL;
    HASH_FIND(hh, e->by_id, id, id_len, old);
    if (old != NULL)
        return PL_EEXIST;
    /* The time list stays sorted whatever order waiters arrive in. */
    if (e->newest && e->newest->parked_at > parked_at)
        parked_at = e->newest->parked_at;
    w = new_waiter(id, id_len, owner, parked_at);
    if (w == NULL)
        return PL_ENOMEM;
    if (index_waiter(e, w, lookup(e, buf, len), buf, len, id_len) != 0) {
        pl_free(w);
        return PL_ENOMEM;
    }
    e->ledger.adopted++;
    link_waiter(e, w);
    *out = w;
    return 0;
}

size_t pl_engine_each_waiter(const pl_engine *e,
                             void (*fn)(const pl_waiter_info *info, void *arg), void *arg)
{
    size_t n = 0;

    for (const pl_waiter *w = e->oldest; w != NULL; w = w->tnext, n++) {
        pl_waiter_info info;
        pl_key_decode(w->entry->keybytes, w->entry->keylen, &info.key);
        info.id = w->id;
        info.id_len = strlen(w->id);
        info.parked_at = w->parked_at;
        info.owner = w->owner;
        info.w = (pl_waiter *)w;
        fn(&info, arg);
    }
    return n;
}
