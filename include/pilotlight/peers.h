/* peers.h -- the key ring's members: who they are and whether each is up.
 *
 * The candidates come from a static list or from a DNS name resolved
 * again every resolve_ms (a Kubernetes headless Service, a Compose service
 * scaled to N). Every candidate but this instance is asked for its
 * /readyz every check_ms, on a connection kept open between checks: one
 * that answers 200 is a member; one that answers anything else (503 while
 * it drains) or refuses the connection is out at once; one that does not
 * answer within timeout_ms twice in a row is out. When a member's kept
 * connection ends between checks (its process died or is draining), it is
 * checked again at once, so a killed peer leaves the ring within a round
 * trip rather than a check period. This instance is a member until
 * pl_peers_leave().
 *
 * Views converge: each check carries the checker's view of the ring (a
 * digest of its members, pl_ring_digest) and its name, each answer the
 * answerer's view, name and wall clock (header X-PL-Ring). A member that
 * sees a view other than its own, either way, looks the DNS name up again
 * at once (at most once a check period): the first member to see a new
 * address makes the others look within a check. Nothing is taken from a
 * peer's word but that trigger: the members are still what the list or the
 * DNS name says and the checks find up. The views agree when every member
 * up reports the view this instance has (a peer that sends none is taken
 * to agree). */
#ifndef PILOTLIGHT_PEERS_H
#define PILOTLIGHT_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "pilotlight/ring.h"

typedef struct pl_peers pl_peers;

typedef struct {
    const char *list;    /* "host:port,host:port,...", or "" */
    const char *dns;     /* "name:port", or "" */
    const char *self;    /* this instance as its peers reach it, "host:port";
                          * "" with a DNS name: the name's address this
                          * instance listens on, with port self_port */
    const char *self_host; /* the address it listens on (listen's host): with
                            * a wildcard or a host name, any address of this
                            * host is taken for it */
    uint16_t self_port;  /* the port this instance listens on */
    uint16_t check_port; /* where peers are asked: 0 = each one's own port
                          * (with a dispatch listener: its port, the same
                          * on every instance, which has descriptors of
                          * its own) */
    int64_t *skew_ms;    /* where to keep the largest clock difference seen
                          * in a peer's answer (ms; NULL: not kept) */
    uint64_t check_ms;   /* how often each peer's /readyz is asked */
    uint64_t timeout_ms; /* a check not answered within this fails */
    uint64_t resolve_ms; /* how often the DNS name is resolved again */
} pl_peers_opts;

/* Unanswered checks in a row that take a peer out. */
#define PL_PEERS_FAILS 2

/* Called when the members changed, or whether every member up agrees on
 * them did, with the new ring (valid until the next call), this instance's
 * index in it (-1 after pl_peers_leave) and <agreed>. */
typedef void (*pl_peers_changed_fn)(void *arg, const pl_ring *ring, int self, int agreed);

/* Starts watching the candidates of <o> (its strings are copied). The ring
 * starts as this instance alone, and <changed> runs as peers are found up.
 * Returns NULL, with a message in <err>, when <o> is not usable or memory
 * is short. */
pl_peers *pl_peers_start(uv_loop_t *loop, const pl_peers_opts *o, pl_peers_changed_fn changed,
                         void *arg, char *err, size_t errlen);

/* One candidate member, as pl_peers_each() tells it. */
typedef struct {
    const char *name; /* "host:port", as the ring names it */
    int self;         /* this instance */
    int up;           /* a member: its last check said ready (self: not left) */
    unsigned failed;  /* checks unanswered in a row */
} pl_peer_info;

/* Calls <fn> for each candidate, this instance included (for the status
 * page). Returns how many. */
size_t pl_peers_each(const pl_peers *p, void (*fn)(const pl_peer_info *info, void *arg),
                     void *arg);

/* This instance leaves the ring (it drains): <changed> runs at once. The
 * checks of the others go on. */
void pl_peers_leave(pl_peers *p);

/* A peer's check said its view is <digest> and its name <name> (<len>
 * bytes): a view other than this instance's makes the DNS name be looked
 * up again soon; a view other than the peer's last answer said makes the
 * peer be checked now, so that whether the views agree is known within a
 * round trip of its change rather than at the next tick. */
void pl_peers_heard(pl_peers *p, uint64_t digest, const char *name, size_t len);

/* Takes up new settings (a reload): candidates no longer named go, new ones
 * are checked at once, those kept keep their state; a new DNS name is
 * looked up at once. Returns 0, or -EINVAL (with a message in <err>; then
 * nothing changed). */
int pl_peers_reconfigure(pl_peers *p, const pl_peers_opts *o, char *err, size_t errlen);

/* Stops the checks and closes every handle; the loop runs their close
 * callbacks, then pl_peers_free() may run. NULL is fine for both. */
void pl_peers_stop(pl_peers *p);
void pl_peers_free(pl_peers *p);

#endif
