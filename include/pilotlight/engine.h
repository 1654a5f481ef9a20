/* engine.h -- the matching engine: parked waiters by key, matched in O(1).
 *
 * Plain data structures and a state machine: no sockets, no event loop, no
 * clock of its own (callers pass `now` in milliseconds). Every waiter leaves
 * through one settle path, which calls the owner's settle callback exactly
 * once and then frees the waiter. */
#ifndef PILOTLIGHT_ENGINE_H
#define PILOTLIGHT_ENGINE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "pilotlight/key.h"

typedef struct pl_engine pl_engine;
typedef struct pl_waiter pl_waiter;

/* How a waiter ended. Order is the order of the metrics labels. */
typedef enum {
    PL_OUTCOME_MATCHED = 0, /* got a dispatched payload */
    PL_OUTCOME_TIMEOUT,     /* reached the park timeout (answered 204) */
    PL_OUTCOME_DISCONNECT,  /* its client went away (recorded as 499) */
    PL_OUTCOME_REPLACED,    /* same controller id parked again (409) */
    PL_OUTCOME_SHUTDOWN,    /* server draining: closed without a response */
    PL_OUTCOME_REJECTED,    /* refused at park: over a cap (503) */
    PL_OUTCOME_HANDED_OVER, /* its connection went to a new process (upgrade) */
    PL_OUTCOME_REVOKED,     /* a reload's token rules no longer admit it */
    PL_OUTCOME_ABORTED,     /* matched, but the broker gave up on its delivery
                             * and reset the connection (delivery = confirm) */
    PL_OUTCOME_MOVED,       /* its key went to another instance of the ring
                             * (answered 307 to the new owner) */
    PL_OUTCOME__COUNT
} pl_outcome;

typedef enum { PL_ORDER_FIFO = 0, PL_ORDER_LIFO } pl_order;

/* Called exactly once per waiter, from inside the engine, once the waiter
 * has left every queue. <owner> is what was given to pl_engine_park(). <arg>
 * is the payload for PL_OUTCOME_MATCHED, a reason string for
 * PL_OUTCOME_REJECTED, what pl_engine_settle_if()'s judge gave for the
 * outcome it settles with, NULL otherwise. For MATCHED the callback returns 0 if
 * the payload was handed to a live client, PL_SETTLE_PENDING if it was
 * written but its delivery is still to be confirmed (the waiter then stays
 * counted as parked, out of every queue, until pl_engine_confirm()), and
 * another negative errno (-EPIPE) if the client is already gone (the engine
 * then records a disconnect and tries the next waiter). For REPLACED, a
 * negative errno means the client had hung up already: a disconnect is
 * recorded instead. The return
 * value is ignored for other outcomes. Except for a pending delivery, the
 * waiter is freed when the callback returns. The callback must not call
 * back into the engine. */
typedef int (*pl_settle_cb)(void *owner, pl_outcome outcome, const void *arg);

#define PL_SETTLE_PENDING (-EINPROGRESS)

typedef struct {
    pl_order order;
    uint32_t max_waiters;         /* global cap, 0 = unlimited */
    uint32_t max_waiters_per_key; /* per-key cap, 0 = unlimited */
    uint64_t park_timeout_ms;     /* 0 = never time out */
    pl_settle_cb settle;
} pl_engine_opts;

/* Counters by outcome. At every moment:
 * parked_now + sum(settled[]) == parked_total + adopted. */
typedef struct {
    uint64_t parked_total; /* every poll that reached pl_engine_park() */
    uint64_t parked_now;
    uint64_t settled[PL_OUTCOME__COUNT];
    uint64_t adopted;      /* waiters taken over from an older process */
} pl_ledger;

/* Returns a new engine, or NULL when out of memory. */
pl_engine *pl_engine_new(const pl_engine_opts *opts);

/* Settles every remaining waiter as PL_OUTCOME_SHUTDOWN, then frees <e>. */
void pl_engine_free(pl_engine *e);

/* A key's place in the engine: a park or a delivery starts by finding it,
 * once, so that a decision taken in between (the key ring's: is the key
 * served here?) costs no second lookup and can be kept with the key. Valid
 * until the engine next changes. */
typedef struct {
    const pl_key *key;             /* the key found (the caller's, not copied) */
    struct pl_engine_entry *entry; /* NULL while nothing is parked for the key */
    uint32_t mark;                 /* the caller's word about the key (below) */
    uint32_t note;                 /* a second caller's word, kept alike */
    uint32_t hash;                 /* pl_hash() of the encoding, which the engine's own
                                    * lookup computed: a caller's table of keys
                                    * needs no second one (0 when len is 0) */
    size_t len;                    /* bytes of buf, the key's encoding; 0: none */
    unsigned char buf[PL_KEY_ENCODED_MAX];
} pl_engine_spot;

/* Finds <key>'s place. spot->mark is what the caller last left with the key
 * while it had waiters, 0 for a key without them: a word the engine gives
 * no meaning, kept from one pl_engine_park() or pl_engine_deliver() to the
 * next as long as the key has a waiter, and forgotten with its last one.
 * spot->note is a second such word, for a second caller.
 * Returns 0, or PL_EINVAL when the key cannot be encoded. */
int pl_engine_find(const pl_engine *e, const pl_key *key, pl_engine_spot *spot);

/* Parks a poll from controller <id> (<id_len> bytes, copied) at the place
 * pl_engine_find() gave for its key, keeping spot->mark and spot->note with
 * the key. An older waiter of the same controller id and the same key
 * deployment is settled REPLACED first; one of another deployment is left
 * alone. Over a cap, the new waiter is settled REJECTED at once (the callback runs
 * before this returns). Returns 0 and sets *out when parked, PL_EREJECTED
 * when rejected, PL_ENOMEM or PL_EINVAL (nothing settled, nothing changed)
 * when out of memory or the key could not be encoded. */
int pl_engine_park(pl_engine *e, const pl_engine_spot *spot, const char *id, size_t id_len,
                   void *owner, uint64_t now, pl_waiter **out);

/* The engine's errors, negative errno values as every call returns them. */
#define PL_EREJECTED (-ENOSPC) /* over a cap: the poll was settled REJECTED */
#define PL_ENOMEM (-ENOMEM)
#define PL_EINVAL (-EINVAL)    /* a key field empty or over PL_KEY_FIELD_MAX */

/* Parks a waiter handed over by an older process (binary upgrade): like
 * pl_engine_park, parked at <parked_at>, counted as adopted rather than in
 * parked_total, never rejected for a cap nor replacing another waiter (the
 * older process had them all at once). Returns 0 and sets *out, PL_ENOMEM,
 * PL_EINVAL, or PL_EEXIST when <id> is parked already for the same
 * deployment. A <parked_at> older than the newest waiter's is taken as that
 * one's, keeping deadlines sorted. */
int pl_engine_adopt(pl_engine *e, const pl_key *key, const char *id, size_t id_len,
                    void *owner, uint64_t parked_at, pl_waiter **out);

#define PL_EEXIST (-EEXIST)

/* What one parked waiter is, for a hand-over. Strings are valid during the
 * callback only; <id> is NUL-terminated. */
typedef struct {
    pl_key key;
    const char *id;
    size_t id_len;
    uint64_t parked_at;
    void *owner;
    pl_waiter *w;
    unsigned tag;  /* pl_engine_set_tag()'s, 0 until set */
    int held;      /* held for a hand-over (pl_engine_hold) */
} pl_waiter_info;

/* Calls <fn> for every parked waiter, oldest first. <fn> must not change
 * the engine. Returns how many. */
size_t pl_engine_each_waiter(const pl_engine *e,
                             void (*fn)(const pl_waiter_info *info, void *arg), void *arg);

/* What one waiter is (as pl_engine_each_waiter gives it). */
void pl_engine_waiter_info(const pl_waiter *w, pl_waiter_info *info);

/* Replaces the options (a live reload): caps and order apply from the next
 * park and dispatch, the park timeout to every waiter's deadline. */
void pl_engine_set_opts(pl_engine *e, const pl_engine_opts *opts);

/* Applies the caps to what is parked (after pl_engine_set_opts lowered
 * them): the newest waiters of a key over max_waiters_per_key, then the
 * newest over max_waiters, are settled REJECTED with the reason a new poll
 * would get. Held waiters stay. Returns how many. */
size_t pl_engine_enforce_caps(pl_engine *e);

/* Calls <judge> for every parked waiter not held, oldest first, with its
 * tag in *tag. A nonzero answer settles it with <outcome> (REVOKED: a
 * reload's rules; MOVED: the ring), the callback's <arg> being what
 * <judge> left in *why (NULL to start with); otherwise the waiter keeps
 * *tag as its tag. <judge> must not change the engine. Returns how many
 * were settled. */
size_t pl_engine_settle_if(pl_engine *e, pl_outcome outcome,
                           int (*judge)(const pl_waiter_info *info, unsigned *tag,
                                        const void **why, void *arg),
                           void *arg);

/* Marks <w> as its owner's: 7 bits (0-127) kept in the waiter and read back
 * in pl_waiter_info. The engine gives them no meaning. */
void pl_engine_set_tag(pl_waiter *w, unsigned tag);

/* <on>: <w> is being handed to another process, which holds its socket
 * too: until released (<on> 0), no dispatch matches it, its deadline waits,
 * no newer poll replaces it, no cap or judge ends it. Only a drain or an
 * explicit settle does. A release leaves it where it was in every order. */
void pl_engine_hold(pl_engine *e, pl_waiter *w, int on);

/* Settles one parked waiter with <outcome> (timeout, disconnect, shutdown,
 * handed_over). */
void pl_engine_settle(pl_engine *e, pl_waiter *w, pl_outcome outcome);

/* What pl_engine_vet_fn answers for one waiter about to be offered a payload. */
enum {
    PL_VET_OFFER = 0, /* offer it */
    PL_VET_SKIP,      /* pass it over in this round (it stays parked, and is
                       * offered in a second round if nobody took it) */
    PL_VET_STOP,      /* offer the payload to nobody */
    PL_VET_PASS,      /* pass it over altogether (it stays parked) */
};

/* Asked about each waiter, by its owner and when it was parked, before it
 * is offered a payload. */
typedef int (*pl_engine_vet_fn)(void *owner, uint64_t parked_at, void *arg);

/* One dispatch's way through pl_engine_deliver(): what goes in, what comes
 * out. */
typedef struct {
    const void *payload;   /* in: the settle callback's <arg> */
    pl_engine_vet_fn vet;  /* in, optional */
    void *vet_arg;
    pl_waiter *waiter;     /* out: the waiter whose delivery is pending */
    void *owner;           /* out: the owner of the waiter that took it */
    uint64_t waited_ms;    /* out: how long that waiter was parked */
} pl_delivery;

/* Offers <d>->payload to the waiters of the key at the place
 * pl_engine_find() gave, in match order, until one takes it (spot->mark and
 * spot->note are kept with the key while it has waiters left). A waiter
 * whose callback refuses is settled DISCONNECT and the next one is offered. With a vet function, each waiter is vetted first:
 * the ones skipped are offered in a second round, in match order, only
 * when no other took the payload (suspects last). Returns PL_DELIVERED when
 * a waiter took it, PL_DELIVERY_PENDING when the taking waiter's callback
 * left it to be confirmed (then d->waiter is that waiter, until
 * pl_engine_confirm()), PL_DELIVERY_STOPPED when the vet stopped it, or 0
 * when nobody took it. Nothing is queued either way. d->owner and
 * d->waited_ms are set when a waiter took it. */
int pl_engine_deliver(pl_engine *e, const pl_engine_spot *spot, uint64_t now, pl_delivery *d);

#define PL_DELIVERED 1
#define PL_DELIVERY_PENDING 2
#define PL_DELIVERY_STOPPED 3

/* Ends a delivery left pending, with <outcome>: MATCHED (delivered),
 * DISCONNECT (its client went away first) or ABORTED (the caller gave up
 * on it and reset the connection). Counts it and frees <w>; no callback
 * runs. */
void pl_engine_confirm(pl_engine *e, pl_waiter *w, pl_outcome outcome);

/* Calls <fn> with the owner of each of the first <max> waiters of <key>,
 * in match order. <fn> must not change the engine. Returns how many. */
size_t pl_engine_each_in_key(const pl_engine *e, const pl_key *key, size_t max,
                             void (*fn)(void *owner, void *arg), void *arg);

/* Settles as TIMEOUT every waiter parked at or before now - park_timeout.
 * Returns how many. */
size_t pl_engine_expire(pl_engine *e, uint64_t now);

/* Sets *deadline to the earliest park-timeout deadline. Returns 0, or
 * -ENOENT when nothing can time out. */
int pl_engine_next_deadline(const pl_engine *e, uint64_t *deadline);

/* Settles every waiter with PL_OUTCOME_SHUTDOWN. */
void pl_engine_drain(pl_engine *e);

const pl_ledger *pl_engine_ledger(const pl_engine *e);

/* Number of distinct keys with at least one waiter. */
size_t pl_engine_key_count(const pl_engine *e);

typedef struct {
    pl_key key;                /* strings valid during the callback only */
    size_t parked;
    uint64_t oldest_parked_at;
} pl_key_info;

/* Calls <fn> for at most <max> keys with waiters, in no particular order.
 * Returns the number of such keys in all. */
size_t pl_engine_each_key(const pl_engine *e, size_t max,
                          void (*fn)(const pl_key_info *info, void *arg), void *arg);

/* What is parked nearest to a key, for a dispatch that found nobody:
 * pl_engine_nearest() fills it. */
typedef struct {
    size_t deployment_keys;   /* keys with a waiter for the key's deployment */
    size_t deployment_parked; /* waiters for the key's deployment, any version
                               * or machine */
    size_t version_parked;    /* ... of which on the key's version: on other
                               * machines, or the key's own */
    size_t key_parked;        /* ... of which on the key itself */
    /* The nearest other key with a waiter, of the key's deployment: the one
     * with the most waiters on the key's version, else the one with the
     * most on any version. nearest.parked is that key's count,
     * nearest_version_parked its version's (every machine). Strings are
     * valid until the engine next changes. */
    int found;
    pl_key_info nearest;
    size_t nearest_version_parked;
} pl_engine_near;

/* Fills <out> for <key>, looking at no more than <max> keys of its
 * deployment (its versions and machines). Costs a hash of the deployment
 * and a walk of its keys: the engine keeps the keys of each deployment
 * together, in an index changed only when a key gains its first waiter or
 * loses its last, at no allocation and no hash of its own. */
void pl_engine_nearest(const pl_engine *e, const pl_key *key, size_t max, pl_engine_near *out);

/* Number of waiters parked under <key>. */
size_t pl_engine_waiting(const pl_engine *e, const pl_key *key);

/* Bytes the engine allocates for one parked waiter whose controller id is
 * <id_len> bytes long (not counting the key entry it may share). */
size_t pl_engine_waiter_size(size_t id_len);

const char *pl_outcome_name(pl_outcome o);

#endif
