/* diag.h -- what dispatches came to lately, and why each miss missed: the
 * memory behind the status page.
 *
 * No sockets, no clock: callers pass the event loop's milliseconds. Memory
 * is fixed: the PL_DIAG_KEYS keys most recently dispatched to, each with
 * its hits and misses in one-minute buckets over PL_DIAG_MINUTES; the last
 * PL_DIAG_LAST hits and misses; the last PL_DIAG_TOKENS polls refused their
 * deployment token. Key strings live in the pools' size classes, as long
 * as they are; everything is freed with the diagnosis.
 *
 * A hit costs a lookup of its key by the hash the engine already computed,
 * two counters and one record; the diagnosis of a miss (what the engine
 * has parked nearest its key, pl_engine_nearest) and its run's id are read
 * on the miss only. */
#ifndef PILOTLIGHT_DIAG_H
#define PILOTLIGHT_DIAG_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/broker-t.h"
#include "pilotlight/diag-t.h"
#include "pilotlight/engine.h"
#include "pilotlight/key.h"

#define PL_DIAG_KEYS 64
#define PL_DIAG_MINUTES 10
#define PL_DIAG_LAST 16
#define PL_DIAG_TOKENS 16
#define PL_DIAG_RUN_MAX 64 /* bytes of a run id kept: longer ones are cut */

typedef struct pl_diag pl_diag;

/* Returns a diagnosis of dispatches to <engine> (which must outlive it),
 * or NULL when out of memory. */
pl_diag *pl_diag_new(const pl_engine *engine);
void pl_diag_free(pl_diag *d);

/* A dispatch answered, as the broker tells it. */
typedef struct {
    const pl_key *key;
    /* Where pl_engine_find() found it, or NULL (a confirmation's). */
    const pl_engine_spot *spot;
    uint32_t tag; /* its key's (pl_diag_tag), or 0: looked up by spot or key */
    /* The dequeuedMessage's bytes (valid JSON), read for its run's id when
     * the answer is false; NULL: none kept. */
    const char *payload;
    size_t payload_len;
    pl_dispatch_result result; /* not INVALID: a body without a key */
    int offered;               /* the run was offered to a poll of the key */
    uint64_t now;              /* loop ms */
    uint64_t took_ns;          /* arrived to answered */
    uint64_t waited_ms;        /* a hit's: how long its poll had been parked */
} pl_diag_dispatch;

/* Records <x>. Returns, for a miss, what was parked nearest (pl_nearest),
 * else -1. Should memory run out, the dispatch is classified but not
 * kept. */
int pl_diag_dispatched(pl_diag *d, const pl_diag_dispatch *x);

/* Tags the key at <spot>, found with polls parked, before its delivery:
 * spot->note takes the key's tag, which the engine keeps with the key
 * while it has polls, so that the next dispatches to it (and a confirmed
 * delivery's answer, pl_diag_dispatch's tag) find their record without a
 * lookup. A spot already tagged costs a compare. At <now> (loop ms).
 * spot->note is 0 when memory is out. */
void pl_diag_tag(pl_diag *d, pl_engine_spot *spot, uint64_t now);

/* A poll for <key> was refused its deployment token (<enforced>: 401), or
 * found it invalid (token_mode = log: parked all the same), at <now>.
 * <token> is its pl_token_result. A key without a deployment is not kept. */
void pl_diag_token_refused(pl_diag *d, const pl_key *key, int token, int enforced,
                           uint64_t now);

/* ---- reading it back (strings valid until the diagnosis next changes) ---- */

/* Hits and misses (every false answer: miss, unconfirmed, abandoned) over
 * the last PL_DIAG_MINUTES minutes, the oldest minute first, the current
 * one last. */
typedef struct {
    uint32_t hits[PL_DIAG_MINUTES], misses[PL_DIAG_MINUTES];
    uint64_t total_hits, total_misses;
} pl_diag_window;

/* All dispatches' window at <now>. */
void pl_diag_window_all(const pl_diag *d, uint64_t now, pl_diag_window *out);

/* The window at <now> of the key whose encoding is <enc> (<len> bytes,
 * hash <hash> as pl_hash(enc, len, 0)). Returns 1, or 0 when the key is not
 * among those kept (*out zero). */
int pl_diag_key_window(const pl_diag *d, const unsigned char *enc, size_t len, uint32_t hash,
                       uint64_t now, pl_diag_window *out);

/* Calls <fn> for each key kept, in no particular order,
 * with its window at <now>. Returns how many. */
size_t pl_diag_each_key(const pl_diag *d, uint64_t now,
                        void (*fn)(const pl_key *key, const pl_diag_window *w, void *arg),
                        void *arg);

/* A token refusal as kept. */
typedef struct {
    pl_key key;
    int token;        /* pl_token_result */
    int enforced;
    uint64_t at;      /* the last one, loop ms */
    uint32_t count;   /* refusals of this key in a row kept */
} pl_diag_refusal;

/* One dispatch as kept. */
typedef struct {
    pl_key key;
    pl_dispatch_result result;
    uint64_t at;                   /* loop ms */
    uint64_t took_ns;
    uint64_t waited_ms;            /* a hit's poll had been parked so long */
    /* a false answer's: the run's id (run.friendlyId), NUL-terminated, ""
     * when it had none; run_cut: only its first bytes are kept */
    char run[PL_DIAG_RUN_MAX + 1];
    int run_cut;
    /* a miss's (result MISS): */
    pl_nearest nearest;
    int has_near;                  /* near is set */
    pl_key near;                   /* the nearest key parked then */
    uint64_t near_parked;          /* polls on it */
    uint64_t near_version_parked;  /* polls on its version, every machine */
    uint64_t version_parked;       /* polls on the dispatch's version */
    uint64_t deployment_parked;    /* polls for the deployment */
    uint64_t deployment_keys;      /* keys of the deployment */
    uint64_t parked;               /* polls parked in all */
    int has_refusal;
    pl_diag_refusal refusal;       /* the refusal that explains it (TOKEN) */
} pl_diag_event;

/* Calls <fn> for each hit kept (<misses> 0) or each false answer kept (1),
 * the newest first. Returns how many. */
size_t pl_diag_each_event(const pl_diag *d, int misses,
                          void (*fn)(const pl_diag_event *ev, void *arg), void *arg);

/* Writes the diagnosis of the miss <ev> in words into <buf> (<cap> bytes,
 * NUL-terminated, cut if need be): what was parked nearest and how it
 * differs. Returns <buf>. */
const char *pl_diag_why(const pl_diag_event *ev, char *buf, size_t cap);

/* The metrics label of <n>: "key", "token", "machine", ... */
const char *pl_nearest_name(pl_nearest n);

#endif
