/* cluster.h -- the key ring at work: whether a request for a key is served
 * here or sent to the instance that owns the key, the redirect that sends
 * it, and the mark a redirected request comes back with.
 *
 * No I/O: the broker asks, peers.h says who the members are. A redirected
 * request carries its hop count in its query (pl_hop=N), which a client
 * following a 307 keeps: an instance that gets a request already
 * redirected serves it rather than send it on while views of the ring
 * disagree, so no request bounces. A redirected dispatch also carries a
 * signature under the dispatch token (pl_exp, pl_nonce, pl_sig), as a
 * client drops its Authorization header on a redirect to another host: it
 * holds for that body, that hop, that member and a short while, once. */
#ifndef PILOTLIGHT_CLUSTER_H
#define PILOTLIGHT_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/key.h"
#include "pilotlight/ring.h"

/* A request redirected this often is served wherever it lands. */
#define PL_CLUSTER_HOPS_MAX 2

/* How long a redirected dispatch's signature holds, in seconds: a client
 * follows a 307 at once. */
#define PL_CLUSTER_SIG_TTL_S 10

/* How far apart the members' wall clocks may be, in seconds, for their
 * signatures to hold (docs/scale-out.md). */
#define PL_CLUSTER_SKEW_S 30

/* A signature's nonce: 128 random bits in lower-case hex. */
#define PL_CLUSTER_NONCE_HEX 32

/* Longest Location header line pl_cluster_location() writes. */
#define PL_CLUSTER_LOCATION_MAX 320

typedef struct {
    pl_ring ring;
    int self;           /* this instance's index in ring; -1 once it has left */
    int on;             /* a ring is configured: without one, everything is
                         * served here */
    int agreed;         /* every member up reports this view (peers.h) */
    uint32_t view;      /* which view of the ring: 1, 2, ... (0: none yet) */
    uint64_t digest;    /* the view's pl_ring_digest, as checks compare it */
    uint64_t newcomer_until; /* this instance joined and sends a miss on to
                              * the key's owner before it until then (ms;
                              * UINT64_MAX: until the views agree) */
    uint64_t grace_ms;  /* how long after they agree a newcomer still does */
} pl_cluster;

/* What a request's query says of its redirects. */
typedef struct {
    unsigned hops;       /* pl_hop: times it was redirected (0: never) */
    uint64_t exp;        /* pl_exp: when its signature ends, epoch seconds */
    const char *sig;     /* pl_sig: 64 hex digits, or NULL */
    const char *nonce;   /* pl_nonce: PL_CLUSTER_NONCE_HEX hex digits, or NULL */
    unsigned marked : 1; /* the query holds any of the four */
    unsigned malformed : 1; /* ... and one of them is malformed */
    unsigned signed_only : 1; /* admitted by its signature, not a bearer
                               * token (routes.c sets it): never signed
                               * again, so never sent on */
} pl_hop;

/* No ring: every request is served here. <grace_ms>: how long after the
 * members' views agree a newcomer still sends a miss on to the member that
 * owned the key before it (the polls the others moved on may still be on
 * their way: a check period). */
void pl_cluster_init(pl_cluster *cl, uint64_t grace_ms);

/* The members are now <ring>, this instance being member <self> (-1: not
 * a member), and every member up agrees on them (<agreed>), at loop time
 * <now>: a new view begins. An instance that becomes a member is a
 * newcomer until the views agree (and the grace after): the others may
 * still hold the polls of the keys it takes. */
void pl_cluster_set(pl_cluster *cl, const pl_ring *ring, int self, int agreed, uint64_t now);

/* Reads pl_hop, pl_exp, pl_nonce and pl_sig from <query> (<len> bytes; NULL is an
 * empty query); other parameters are left alone. Returns 0, or -EINVAL
 * when one of those is malformed (then *out is as without them, but
 * marked and malformed). */
int pl_cluster_read_hop(const char *query, size_t len, pl_hop *out);

/* Where a request for a key is served, in the ring's current view. */
typedef struct {
    int to;         /* redirect it to this member now; -1: serve it here */
    int foreign;    /* served here although another member owns the key
                     * (it came redirected while views disagree) */
    int after_miss; /* served here, a dispatch that finds nobody is sent on
                     * to this member; -1: answered here */
} pl_cluster_verdict;

/* The ring's one decision about a request for <key> that carries <hop>, at
 * loop time <now>: pl_cluster_route() and, for a dispatch that misses,
 * pl_cluster_after_miss(). Pure: the same view, key, hop and time give the
 * same verdict. */
void pl_cluster_decide(const pl_cluster *cl, const pl_key *key, const pl_hop *hop,
                       uint64_t now, pl_cluster_verdict *v);

/* Where a request for <key> that has been redirected <hops> times goes:
 * -1 to serve it here, or the ring index of the instance to redirect it
 * to. Served here: without a ring or members; when this instance owns the
 * key; and, so that nothing bounces, when the request has been redirected
 * already, unless this instance has left the ring and it was only once
 * (a draining instance sends on what reached it late). *foreign is set to
 * 1 when it is served here although another instance owns the key. */
int pl_cluster_route(const pl_cluster *cl, const pl_key *key, unsigned hops, int *foreign);

/* Where a dispatch that found nobody parked here may still find a poll:
 * the ring index to redirect it to, or -1 (answer false). When it was
 * served here only because it came redirected (<foreign>, as
 * pl_cluster_route() said), the key's owner in this view; when this
 * instance owns the key but is a newcomer (<recently>: the others may not
 * count it in yet, and still park the key's polls elsewhere), the owner
 * among the others. Never past PL_CLUSTER_HOPS_MAX. */
int pl_cluster_after_miss(const pl_cluster *cl, const pl_key *key, unsigned hops, int foreign,
                          int recently);

/* Whether <key> is this instance's now (always, without a ring). */
int pl_cluster_owns(const pl_cluster *cl, const pl_key *key);

/* The ring index of <key>'s owner; the ring must have a member. */
size_t pl_cluster_owner(const pl_cluster *cl, const pl_key *key);

/* Writes the header line "Location: http://OWNER<path>?pl_hop=<hops + 1>"
 * and CRLF into <out> (PL_CLUSTER_LOCATION_MAX bytes), OWNER being member
 * <owner>'s "host:port", or its host with <port> when <port> is not 0 (a
 * dispatch on a listener of its own, at the same port on every instance).
 * With a non-empty <secret>, adds pl_exp (<now_s> plus the TTL),
 * pl_nonce (<nonce>, PL_CLUSTER_NONCE_HEX hex digits) and pl_sig, which
 * signs the expiry, the hop count, the member <owner>, the nonce, <path>
 * and <body>. Returns the line's length, or -ENOSPC. */
int pl_cluster_location(char *out, const char *owner, uint16_t port, const char *path,
                        unsigned hops, const char *secret, const char *nonce,
                        const char *body, size_t body_len, uint64_t now_s);

/* Whether <h> holds <secret>'s signature over its expiry, hop count and
 * nonce, the member <self> (this instance's name in the ring: a signature
 * for another member is not one for this), <path> and <body>, with an
 * expiry that is neither past nor further off than a signature is made
 * for, each by the clock skew allowed. A signature accepted here must
 * still be taken once (pl_cluster_replay_take). */
int pl_cluster_hop_signed(const pl_hop *h, const char *secret, const char *self,
                          const char *path, const char *body, size_t body_len, uint64_t now_s);

/* The nonces of the signatures accepted, each kept until its signature
 * could no longer hold, so none is accepted twice. Bounded: full, it
 * refuses rather than forgets. */
typedef struct {
    struct pl_cluster_seen *slots; /* NULL until the first */
    size_t cap;
} pl_cluster_replay;

/* Most nonces a replay set holds. */
#define PL_CLUSTER_REPLAY_MAX 16384

/* Takes the nonce of <h> (checked by pl_cluster_hop_signed) at <now_s>.
 * Returns 0 the first time, -EALREADY for a nonce taken before, -ENOSPC
 * when the set is full of live ones, -ENOMEM. */
int pl_cluster_replay_take(pl_cluster_replay *rp, const pl_hop *h, uint64_t now_s);

/* Frees what <rp> holds. */
void pl_cluster_replay_free(pl_cluster_replay *rp);

#endif
