/* engine.c -- parked waiters in a hash map of queues, one settle path. */
#include <string.h>

#include <utlist.h>

#include "pilotlight/engine.h"
#include "pilotlight/hash.h"
#include "pilotlight/invariant.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"

/* uthash allocates its buckets from the pools' size classes (an id index
 * that empties and refills on every cycle then costs no system call) and,
 * on failure, leaves the table unchanged and tells us instead of calling
 * exit(). */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) pl_pool_alloc(sz, NULL)
#define uthash_free(ptr, sz) pl_pool_free(ptr, sz)
#define uthash_nonfatal_oom(obj) (oom_flag = 1)
static int oom_flag;
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = pl_hash((keyptr), (keylen), 0))
#include <uthash.h>

typedef struct pl_engine_entry pl_entry;

/* A controller id and its NUL up to this long live in a waiter from the
 * waiter pool: "controller_" and a UUID is 47 bytes. A longer one (ids up
 * to 256 bytes) takes a size class. */
#define ID_INLINE 48

struct pl_waiter {
    pl_waiter *qprev, *qnext; /* in its key's queue, oldest first */
    pl_entry *entry;          /* its key's; NULL once out of every queue */
    void *owner;              /* NULL once retired (see retire) */
    /* When it parked, in loop milliseconds (the low 56 bits: two million
     * years), with the owner's tag and the held bit above: a waiter costs
     * no byte more for them. */
    uint64_t stamp;
    /* By controller id, hashed with the deployment. uthash also keeps its
     * items in the order they were added: that order is the time list. */
    UT_hash_handle hh;
    char id[];         /* the controller id, NUL-terminated */
};

static pl_pool waiter_pool = PL_POOL_INIT("waiter", sizeof(pl_waiter) + ID_INLINE);

#define STAMP_AT ((UINT64_C(1) << 56) - 1)
#define STAMP_TAG_SHIFT 56
#define STAMP_TAG (UINT64_C(0x7f) << STAMP_TAG_SHIFT)
#define STAMP_HELD (UINT64_C(1) << 63)

static uint64_t parked_at(const pl_waiter *w)
{
    return w->stamp & STAMP_AT;
}

static int held(const pl_waiter *w)
{
    return (w->stamp & STAMP_HELD) != 0;
}

struct pl_engine_entry {
    UT_hash_handle hh; /* by encoded key */
    pl_waiter *head;   /* utlist: head->qprev is the tail */
    pl_entry *dprev, *dnext; /* in its deployment's bucket (deps) */
    uint32_t count;
    uint32_t mark;     /* the callers' words (pl_engine_spot) */
    uint32_t note;
    uint32_t keylen;
    uint32_t dhash;    /* its deployment's hash (see id_hash) */
    unsigned char keybytes[];
};

/* The keys by deployment, for a dispatch that found nobody: what is parked
 * nearest its key (pl_engine_nearest). A key entry joins its deployment's
 * bucket as it is made and leaves it as it is freed: no allocation, and
 * nothing per waiter. The deployment's hash is the one the id index
 * computes at every park anyway. */
#define DEP_BUCKETS 1024

struct pl_engine {
    pl_engine_opts opts;
    pl_entry *entries;      /* uthash head, by key */
    pl_entry *deps[DEP_BUCKETS]; /* utlist heads, by deployment (dhash) */
    /* uthash head, by controller id (see id_hash). Every parked waiter is
     * in it, in the order they parked: the head is the oldest, and as one
     * timeout serves all, the list is sorted by deadline too. */
    pl_waiter *by_id;
    size_t nkeys;
    size_t held; /* waiters held for a hand-over (pl_engine_hold) */
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

/* The key info of <ent> (strings into the entry). */
static void entry_info(const pl_entry *ent, pl_key_info *info)
{
    pl_key_decode(ent->keybytes, ent->keylen, &info->key);
    info->parked = ent->count;
    info->oldest_parked_at = parked_at(ent->head); /* appended in time order */
}

size_t pl_engine_each_key(const pl_engine *e, size_t max,
                          void (*fn)(const pl_key_info *info, void *arg), void *arg)
{
    const pl_entry *ent;
    size_t n = 0;

    for (ent = e->entries; ent != NULL && n < max; ent = ent->hh.next, n++) {
        pl_key_info info;
        entry_info(ent, &info);
        fn(&info, arg);
    }
    return e->nkeys;
}

size_t pl_engine_waiter_size(size_t id_len)
{
    size_t n = sizeof(pl_waiter) + id_len + 1;

    return n <= waiter_pool.size ? waiter_pool.size : n;
}

/* "A waiter": from the waiter pool, or a size class for a long id. */
static pl_waiter *waiter_get(size_t id_len)
{
    size_t n = pl_engine_waiter_size(id_len);

    return n == waiter_pool.size ? pl_pool_get(&waiter_pool) : pl_pool_alloc(n, NULL);
}

/* Frees <w>; its id length is in hh.keylen from the moment it was made. */
static void waiter_put(pl_waiter *w)
{
    size_t n = pl_engine_waiter_size(w->hh.keylen);

    if (n == waiter_pool.size)
        pl_pool_put(&waiter_pool, w);
    else
        pl_pool_free(w, n);
}

const char *pl_outcome_name(pl_outcome o)
{
    static const char *const names[PL_OUTCOME__COUNT] = {
        "matched", "timeout", "disconnect", "replaced", "shutdown", "rejected",
        "handed_over", "revoked", "aborted", "moved",
    };
    return (unsigned)o < PL_OUTCOME__COUNT ? names[o] : "unknown";
}

static pl_entry *lookup_hashed(const pl_engine *e, const unsigned char *buf, size_t len,
                               uint32_t hv)
{
    pl_entry *ent = NULL;

    HASH_FIND_BYHASHVALUE(hh, e->entries, buf, len, hv, ent);
    return ent;
}

static pl_entry *lookup(const pl_engine *e, const unsigned char *buf, size_t len)
{
    return lookup_hashed(e, buf, len, pl_hash(buf, len, 0));
}

int pl_engine_find(const pl_engine *e, const pl_key *key, pl_engine_spot *spot)
{
    spot->key = key;
    spot->len = pl_key_encode(key, spot->buf);
    spot->hash = spot->len > 0 ? pl_hash(spot->buf, spot->len, 0) : 0;
    spot->entry = spot->len > 0 ? lookup_hashed(e, spot->buf, spot->len, spot->hash) : NULL;
    spot->mark = spot->entry != NULL ? spot->entry->mark : 0;
    spot->note = spot->entry != NULL ? spot->entry->note : 0;
    return spot->len > 0 ? 0 : PL_EINVAL;
}

static pl_entry *find_entry(const pl_engine *e, const pl_key *key)
{
    pl_engine_spot spot;

    pl_engine_find(e, key, &spot);
    return spot.entry;
}

size_t pl_engine_waiting(const pl_engine *e, const pl_key *key)
{
    pl_entry *ent = find_entry(e, key);
    return ent ? ent->count : 0;
}

/* Adds an empty entry for the encoded key <buf>, whose deployment hashes
 * to <dhash>; NULL when out of memory (nothing changed). */
static pl_entry *new_entry(pl_engine *e, const unsigned char *buf, size_t len, uint32_t dhash)
{
    pl_entry *ent = pl_pool_alloc(sizeof(*ent) + len, NULL);

    if (ent == NULL)
        return NULL;
    memset(ent, 0, sizeof(*ent));
    ent->keylen = (uint32_t)len;
    ent->dhash = dhash;
    memcpy(ent->keybytes, buf, len);
    oom_flag = 0;
    HASH_ADD(hh, e->entries, keybytes, len, ent);
    if (oom_flag) {
        pl_pool_free(ent, sizeof(*ent) + len);
        return NULL;
    }
    DL_APPEND2(e->deps[dhash % DEP_BUCKETS], ent, dprev, dnext);
    e->nkeys++;
    return ent;
}

static void drop_entry_if_empty(pl_engine *e, pl_entry *ent)
{
    if (ent->count > 0)
        return;
    HASH_DELETE(hh, e->entries, ent);
    DL_DELETE2(e->deps[ent->dhash % DEP_BUCKETS], ent, dprev, dnext);
    pl_pool_free(ent, sizeof(*ent) + ent->keylen);
    e->nkeys--;
}

static int same_text(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && memcmp(a, b, alen) == 0;
}

static uint32_t deployment_hash(const pl_key *key)
{
    return pl_hash(key->deployment, key->deployment_len, 0);
}

/* The next entry of <key>'s deployment (hashed <dh>) in its bucket from
 * <ent> on, decoded into *k; NULL past the last. */
static const pl_entry *next_of(const pl_entry *ent, const pl_key *key, uint32_t dh, pl_key *k)
{
    for (; ent != NULL; ent = ent->dnext) {
        if (ent->dhash != dh)
            continue;
        pl_key_decode(ent->keybytes, ent->keylen, k);
        if (same_text(k->deployment, k->deployment_len, key->deployment, key->deployment_len))
            return ent;
    }
    return NULL;
}

void pl_engine_nearest(const pl_engine *e, const pl_key *key, size_t max, pl_engine_near *out)
{
    uint32_t dh = deployment_hash(key);
    const pl_entry *head = e->deps[dh % DEP_BUCKETS], *best = NULL, *ent;
    int best_same = 0;
    size_t n = 0;
    pl_key k;

    memset(out, 0, sizeof(*out));
    for (ent = next_of(head, key, dh, &k); ent != NULL && n < max;
         ent = next_of(ent->dnext, key, dh, &k), n++) {
        int same = same_text(k.version, k.version_len, key->version, key->version_len);

        out->deployment_keys++;
        out->deployment_parked += ent->count;
        if (same)
            out->version_parked += ent->count;
        if (same && k.cpu == key->cpu && k.memory == key->memory) {
            out->key_parked += ent->count;
            continue; /* the key itself is no neighbour of its own */
        }
        /* A key on the same version is nearer than any on another. */
        if (best == NULL || same > best_same || (same == best_same && ent->count > best->count)) {
            best = ent;
            best_same = same;
        }
    }
    if (best == NULL)
        return;
    out->found = 1;
    entry_info(best, &out->nearest);
    n = 0;
    for (ent = next_of(head, key, dh, &k); ent != NULL && n < max;
         ent = next_of(ent->dnext, key, dh, &k), n++)
        if (same_text(k.version, k.version_len, out->nearest.key.version,
                      out->nearest.key.version_len))
            out->nearest_version_parked += ent->count;
}

/* Links <w>, already in the id index (so at the tail of the time list), at
 * the tail of its key's queue. */
static void link_waiter(pl_engine *e, pl_waiter *w)
{
    DL_APPEND2(w->entry->head, w, qprev, qnext);
    w->entry->count++;
    e->ledger.parked_now++;
}

static void unlink_waiter(pl_engine *e, pl_waiter *w)
{
    pl_entry *ent = w->entry;

    PL_ASSERT(ent != NULL && ent->count > 0);
    DL_DELETE2(ent->head, w, qprev, qnext);
    w->entry = NULL;
    ent->count--;
    HASH_DELETE(hh, e->by_id, w);
    drop_entry_if_empty(e, ent);
    if (held(w))
        e->held--;
}

static int ledger_balanced(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total + l->adopted;
}

/* Counts <w>'s outcome and frees it. The owner is cleared first: the
 * pools keep it through a free, so a second settle or confirm of the same
 * waiter finds no owner and stops the process instead of answering a
 * connection twice. */
static void retire(pl_engine *e, pl_waiter *w, pl_outcome outcome, int linked)
{
    PL_ASSERT((unsigned)outcome < PL_OUTCOME__COUNT && w->owner != NULL);
    if (linked)
        e->ledger.parked_now--;
    e->ledger.settled[outcome]++;
    PL_ASSERT(ledger_balanced(&e->ledger));
    w->owner = NULL;
    waiter_put(w);
}

/* The one exit of a waiter. <w> may be parked (linked) or not yet linked
 * (rejected at park). Returns the settle callback's answer. */
static int settle(pl_engine *e, pl_waiter *w, pl_outcome outcome,
                  const void *arg, int linked)
{
    int rc;

    /* In its queues exactly when it is said to be; never settled before. */
    PL_ASSERT(w->owner != NULL && (w->entry != NULL) == (linked != 0));
    if (linked)
        unlink_waiter(e, w);
    rc = e->opts.settle(w->owner, outcome, arg);
    if (outcome == PL_OUTCOME_MATCHED && rc == PL_SETTLE_PENDING)
        return rc; /* still counted as parked until pl_engine_confirm() */
    if ((outcome == PL_OUTCOME_MATCHED || outcome == PL_OUTCOME_REPLACED) && rc != 0)
        outcome = PL_OUTCOME_DISCONNECT;
    retire(e, w, outcome, linked);
    return rc;
}

void pl_engine_confirm(pl_engine *e, pl_waiter *w, pl_outcome outcome)
{
    /* only a delivery awaiting its confirmation: out of every queue */
    PL_ASSERT(w->entry == NULL);
    retire(e, w, outcome, 1);
}

void pl_engine_settle(pl_engine *e, pl_waiter *w, pl_outcome outcome)
{
    settle(e, w, outcome, NULL, 1);
}

#define OVER_CAP "too many parked polls on this server"
#define OVER_KEY_CAP "too many parked polls for this deployment and machine"

/* Returns why one more poll for <ent> would exceed a cap, or NULL. <old>, a
 * waiter about to be replaced, does not count: it leaves as this one comes. */
static const char *over_cap(const pl_engine *e, const pl_entry *ent,
                            const pl_waiter *old)
{
    uint64_t parked = e->ledger.parked_now - (old != NULL);
    uint32_t on_key = ent ? ent->count - (old != NULL && old->entry == ent) : 0;

    if (e->opts.max_waiters && parked >= e->opts.max_waiters)
        return OVER_CAP;
    if (e->opts.max_waiters_per_key && on_key >= e->opts.max_waiters_per_key)
        return OVER_KEY_CAP;
    return NULL;
}

/* A poll replaces only its own controller's older poll: the same id for
 * the same deployment. Other tenants may use the same id, so the index keys
 * waiters by id alone (the id is all a waiter stores) but hashes the id with
 * the deployment: each tenant's waiters of one id land apart, and finding
 * one compares the deployment through its key entry. */
static unsigned id_hash(const char *id, size_t id_len, uint32_t dhash)
{
    return pl_hash(id, id_len, dhash);
}

/* The waiter of controller <id> parked for <key>'s deployment, or NULL. */
static pl_waiter *find_own(const pl_engine *e, const char *id, size_t id_len,
                           const pl_key *key, unsigned hv)
{
    const UT_hash_table *tbl;
    const UT_hash_handle *hh;
    unsigned bkt;

    if (e->by_id == NULL)
        return NULL;
    tbl = e->by_id->hh.tbl;
    HASH_TO_BKT(hv, tbl->num_buckets, bkt);
    for (hh = tbl->buckets[bkt].hh_head; hh != NULL; hh = hh->hh_next) {
        pl_waiter *w = ELMT_FROM_HH(tbl, hh);
        pl_key k;

        if (hh->hashv != hv || hh->keylen != id_len || memcmp(hh->key, id, id_len) != 0 ||
            held(w))
            continue;
        pl_key_decode(w->entry->keybytes, w->entry->keylen, &k);
        if (k.deployment_len == key->deployment_len &&
            memcmp(k.deployment, key->deployment, k.deployment_len) == 0)
            return w;
    }
    return NULL;
}

/* Makes every allocation a park needs: the key entry (unless <ent> exists
 * already) and the id index slot. Returns 0, or PL_ENOMEM with nothing
 * changed. */
static int index_waiter(pl_engine *e, pl_waiter *w, pl_entry *ent, const unsigned char *key,
                        size_t keylen, size_t id_len, unsigned hv, uint32_t dhash)
{
    w->entry = ent ? ent : new_entry(e, key, keylen, dhash);
    if (w->entry == NULL)
        return PL_ENOMEM;
    /* An older waiter of the same id may still be in the index: uthash
     * keeps both until that one is deleted by pointer. Adding first means
     * the table never empties (and is freed) in between. */
    oom_flag = 0;
    HASH_ADD_KEYPTR_BYHASHVALUE(hh, e->by_id, w->id, id_len, hv, w);
    if (oom_flag) {
        drop_entry_if_empty(e, w->entry);
        return PL_ENOMEM;
    }
    return 0;
}

/* A waiter not yet in any list, or NULL when out of memory. */
static pl_waiter *new_waiter(const char *id, size_t id_len, void *owner, uint64_t at)
{
    pl_waiter *w = waiter_get(id_len);

    if (w == NULL)
        return NULL;
    memset(w, 0, sizeof(*w));
    w->hh.keylen = (unsigned)id_len; /* waiter_put() reads it, indexed or not */
    memcpy(w->id, id, id_len);
    w->id[id_len] = '\0';
    w->owner = owner;
    w->stamp = at & STAMP_AT;
    return w;
}

int pl_engine_park(pl_engine *e, const pl_engine_spot *spot, const char *id, size_t id_len,
                   void *owner, uint64_t now, pl_waiter **out)
{
    const pl_key *key = spot->key;
    uint32_t dh;
    unsigned hv;
    pl_entry *ent = spot->entry;
    pl_waiter *w, *old;
    const char *why;

    *out = NULL;
    if (spot->len == 0)
        return PL_EINVAL;
    dh = deployment_hash(key);
    hv = id_hash(id, id_len, dh);
    /* A poll replaces only its own controller's older poll: the same id
     * for the same deployment (a token-verified one when tokens are on).
     * Another tenant reusing the id parks beside it and ends nothing. */
    w = new_waiter(id, id_len, owner, now);
    if (w == NULL)
        return PL_ENOMEM;

    old = find_own(e, id, id_len, key, hv);
    why = over_cap(e, ent, old);
    if (why == NULL && index_waiter(e, w, ent, spot->buf, spot->len, id_len, hv, dh) != 0) {
        waiter_put(w);
        return PL_ENOMEM;
    }
    if (why == NULL) {
        w->entry->mark = spot->mark;
        w->entry->note = spot->note;
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

/* The first waiter of <ent> in match order, and the one after <w>. */
static pl_waiter *first_in_order(const pl_entry *ent, pl_order order)
{
    return order == PL_ORDER_LIFO ? ent->head->qprev : ent->head;
}

static pl_waiter *next_in_order(const pl_entry *ent, const pl_waiter *w, pl_order order)
{
    if (order == PL_ORDER_FIFO)
        return w->qnext;
    return w == ent->head ? NULL : w->qprev;
}

/* One round of pl_engine_deliver over <*entp> (set to NULL when its last
 * waiter left). Counts the waiters the vet passed over in *skipped. In the
 * <second> round, those it skipped are offered; those it passes, never. */
static int deliver_round(pl_engine *e, pl_entry **entp, uint64_t now, pl_delivery *d,
                         int second, size_t *skipped)
{
    pl_engine_vet_fn vet = d->vet;
    pl_order order = e->opts.order;
    pl_waiter *w = first_in_order(*entp, order);

    while (w != NULL) {
        pl_waiter *next = next_in_order(*entp, w, order);
        uint64_t at = parked_at(w);
        void *owner = w->owner;
        int v, last, rc;

        if (e->held > 0 && held(w)) { /* being handed over: nobody's now */
            w = next;
            continue;
        }
        v = vet != NULL ? vet(owner, at, d->vet_arg) : PL_VET_OFFER;
        if (v == PL_VET_STOP)
            return PL_DELIVERY_STOPPED;
        if (v == PL_VET_PASS) {
            w = next;
            continue;
        }
        if (v == PL_VET_SKIP && !second) {
            (*skipped)++;
            w = next;
            continue;
        }
        /* Settling the last waiter frees the entry: decide before. */
        last = (*entp)->count == 1;
        rc = settle(e, w, PL_OUTCOME_MATCHED, d->payload, 1);
        if (rc == 0 || rc == PL_SETTLE_PENDING) {
            d->waiter = rc == PL_SETTLE_PENDING ? w : NULL;
            d->owner = owner;
            d->waited_ms = now >= at ? now - at : 0;
            return rc == 0 ? PL_DELIVERED : PL_DELIVERY_PENDING;
        }
        if (last) {
            *entp = NULL;
            return 0;
        }
        w = next;
    }
    return 0;
}

int pl_engine_deliver(pl_engine *e, const pl_engine_spot *spot, uint64_t now, pl_delivery *d)
{
    pl_entry *ent = spot->entry;
    size_t skipped = 0;
    int rc;

    d->waiter = NULL;
    d->owner = NULL;
    d->waited_ms = 0;
    if (ent == NULL)
        return 0;
    ent->mark = spot->mark; /* before a delivery may free it */
    ent->note = spot->note;
    rc = deliver_round(e, &ent, now, d, 0, &skipped);
    /* The ones passed over stay parked, so the entry does too. */
    if (rc == 0 && skipped > 0)
        rc = deliver_round(e, &ent, now, d, 1, &skipped);
    return rc;
}

size_t pl_engine_each_in_key(const pl_engine *e, const pl_key *key, size_t max,
                             void (*fn)(void *owner, void *arg), void *arg)
{
    const pl_entry *ent = find_entry(e, key);
    size_t n = 0;

    for (const pl_waiter *w = ent ? first_in_order(ent, e->opts.order) : NULL;
         w != NULL && n < max; w = next_in_order(ent, w, e->opts.order)) {
        if (e->held > 0 && held(w))
            continue;
        fn(w->owner, arg);
        n++;
    }
    return n;
}

size_t pl_engine_expire(pl_engine *e, uint64_t now)
{
    pl_waiter *w, *next;
    size_t n = 0;

    if (e->opts.park_timeout_ms == 0)
        return 0;
    /* A held waiter's deadline waits for the hand-over's verdict; the
     * list is sorted, so the first one not yet due ends the walk. */
    for (w = e->by_id; w != NULL && parked_at(w) + e->opts.park_timeout_ms <= now; w = next) {
        next = w->hh.next;
        if (held(w))
            continue;
        settle(e, w, PL_OUTCOME_TIMEOUT, NULL, 1);
        n++;
    }
    return n;
}

int pl_engine_next_deadline(const pl_engine *e, uint64_t *deadline)
{
    const pl_waiter *w = e->by_id;

    while (e->held > 0 && w != NULL && held(w))
        w = w->hh.next;
    if (e->opts.park_timeout_ms == 0 || w == NULL)
        return -ENOENT;
    *deadline = parked_at(w) + e->opts.park_timeout_ms;
    return 0;
}

void pl_engine_drain(pl_engine *e)
{
    while (e->by_id != NULL)
        settle(e, e->by_id, PL_OUTCOME_SHUTDOWN, NULL, 1);
}

void pl_engine_set_opts(pl_engine *e, const pl_engine_opts *opts)
{
    e->opts = *opts;
}

/* The newest waiter not held for a hand-over, walking back from <w> (in
 * the time list when <by_time>, else in its key's queue); NULL if none. */
static pl_waiter *newest_free(pl_waiter *w, const pl_waiter *head, int by_time)
{
    while (w != NULL && held(w))
        w = by_time ? w->hh.prev : w == head ? NULL : w->qprev;
    return w;
}

size_t pl_engine_enforce_caps(pl_engine *e)
{
    pl_entry *ent, *tmp;
    pl_waiter *w;
    size_t n = 0;

    /* The newest go: they are the ones a cap in force then would have
     * refused. Per key first, then whatever still exceeds the total. */
    if (e->opts.max_waiters_per_key > 0) {
        HASH_ITER(hh, e->entries, ent, tmp) {
            while (ent->count > e->opts.max_waiters_per_key &&
                   (w = newest_free(ent->head->qprev, ent->head, 0)) != NULL) {
                settle(e, w, PL_OUTCOME_REJECTED, OVER_KEY_CAP, 1);
                n++;
            }
        }
    }
    while (e->opts.max_waiters > 0 && e->ledger.parked_now > e->opts.max_waiters &&
           e->by_id != NULL &&
           (w = newest_free(ELMT_FROM_HH(e->by_id->hh.tbl, e->by_id->hh.tbl->tail), NULL, 1)) !=
               NULL) {
        settle(e, w, PL_OUTCOME_REJECTED, OVER_CAP, 1);
        n++;
    }
    return n;
}

static void waiter_info(const pl_waiter *w, pl_waiter_info *info)
{
    pl_key_decode(w->entry->keybytes, w->entry->keylen, &info->key);
    info->id = w->id;
    info->id_len = w->hh.keylen;
    info->parked_at = parked_at(w);
    info->owner = w->owner;
    info->w = (pl_waiter *)w;
    info->tag = (unsigned)((w->stamp & STAMP_TAG) >> STAMP_TAG_SHIFT);
    info->held = held(w);
}

size_t pl_engine_settle_if(pl_engine *e, pl_outcome outcome,
                           int (*judge)(const pl_waiter_info *info, unsigned *tag,
                                        const void **why, void *arg),
                           void *arg)
{
    pl_waiter *w, *next;
    size_t n = 0;

    for (w = e->by_id; w != NULL; w = next) {
        pl_waiter_info info;
        const void *why = NULL;
        unsigned tag;

        next = w->hh.next;
        if (held(w))
            continue;
        waiter_info(w, &info);
        tag = info.tag;
        if (judge(&info, &tag, &why, arg)) {
            settle(e, w, outcome, why, 1);
            n++;
        } else {
            pl_engine_set_tag(w, tag);
        }
    }
    return n;
}

void pl_engine_hold(pl_engine *e, pl_waiter *w, int on)
{
    if (held(w) == (on != 0))
        return;
    w->stamp ^= STAMP_HELD;
    if (on)
        e->held++;
    else
        e->held--;
}

void pl_engine_set_tag(pl_waiter *w, unsigned tag)
{
    w->stamp = (w->stamp & ~STAMP_TAG) | ((uint64_t)(tag & 0x7f) << STAMP_TAG_SHIFT);
}

int pl_engine_adopt(pl_engine *e, const pl_key *key, const char *id, size_t id_len,
                    void *owner, uint64_t at, pl_waiter **out)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(key, buf);
    uint32_t dh = deployment_hash(key);
    unsigned hv = id_hash(id, id_len, dh);
    pl_waiter *w;

    *out = NULL;
    if (len == 0)
        return PL_EINVAL;
    /* The time list stays sorted whatever order waiters arrive in. */
    if (e->by_id != NULL) {
        const pl_waiter *newest = ELMT_FROM_HH(e->by_id->hh.tbl, e->by_id->hh.tbl->tail);
        if (parked_at(newest) > at)
            at = parked_at(newest);
    }
    if (find_own(e, id, id_len, key, hv) != NULL)
        return PL_EEXIST;
    w = new_waiter(id, id_len, owner, at);
    if (w == NULL)
        return PL_ENOMEM;
    if (index_waiter(e, w, lookup(e, buf, len), buf, len, id_len, hv, dh) != 0) {
        waiter_put(w);
        return PL_ENOMEM;
    }
    e->ledger.adopted++;
    link_waiter(e, w);
    *out = w;
    return 0;
}

void pl_engine_waiter_info(const pl_waiter *w, pl_waiter_info *info)
{
    waiter_info(w, info);
}

size_t pl_engine_each_waiter(const pl_engine *e,
                             void (*fn)(const pl_waiter_info *info, void *arg), void *arg)
{
    size_t n = 0;

    for (const pl_waiter *w = e->by_id; w != NULL; w = w->hh.next, n++) {
        pl_waiter_info info;
        waiter_info(w, &info);
        fn(&info, arg);
    }
    return n;
}
