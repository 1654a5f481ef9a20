/* redirect.h -- the key ring on the request path: whether a request for a
 * key is served here or sent (307) to the member that owns it, and what
 * becomes of the polls parked here for keys the ring gave to another.
 *
 * cluster.h decides, with no I/O; this module acts on the decision: it
 * writes the 307s, keeps the ring's view and its counters, and moves
 * parked polls when the view changes. The broker calls it at three points
 * of a request (after the key is found, after a dispatch missed, and when
 * a poll is answered MOVED) and nowhere else. */
#ifndef PILOTLIGHT_REDIRECT_H
#define PILOTLIGHT_REDIRECT_H

#include <uv.h>

#include "pilotlight/cluster.h"
#include "pilotlight/config.h"
#include "pilotlight/engine.h"
#include "pilotlight/http.h"
#include "pilotlight/metrics.h"

typedef struct pl_redirect pl_redirect;

/* Returns the ring's side of the broker serving <cfg> with <engine>,
 * counting into <m>, or NULL when out of memory. Until the first
 * pl_redirect_ring_changed() there is no ring: everything is served here. */
pl_redirect *pl_redirect_new(uv_loop_t *loop, pl_engine *engine, const pl_config *cfg,
                             pl_metrics *m);

/* Whether the request <req> (with <hop>, as routes.c read it) for the key
 * found at <spot> is served here. When not, it has been answered: 307 to
 * the member that owns the key, or 400 for a malformed hop mark. A key
 * found to be this instance's in the current view is marked so with the
 * key (spot->mark), so that its next requests cost no look at the ring.
 * <dispatch>: a dispatch (its 307 carries the dispatch listener's port and
 * a signature), else a poll. */
int pl_redirect_elsewhere(pl_redirect *r, pl_conn *c, const pl_request *req,
                          const pl_hop *hop, pl_engine_spot *spot, int dispatch);

/* The dispatch <req> for <key>, served here, found nobody: returns whether
 * it was sent on (307) to where the ring says a poll may still be. */
int pl_redirect_after_miss(pl_redirect *r, pl_conn *c, const pl_request *req,
                           const pl_hop *hop, const pl_key *key);

/* Answers the parked poll <c>, whose key went to member <name>, with a 307
 * there (or closes it, should the name not fit). The one other 307 this
 * module writes. */
void pl_redirect_moved(pl_conn *c, const char *name);

/* The members changed, or whether they all agree on them did (peers.h):
 * <self> is this instance's index in <ring>, -1 once it has left. With
 * <move>, the polls parked here for keys another member owns now are
 * answered MOVED at once: those of keys this instance owned before, and,
 * once the views agree, any (a poll parked here as another's while they
 * disagreed); so no poll is sent back and forth. */
void pl_redirect_ring_changed(pl_redirect *r, const pl_ring *ring, int self, int agreed,
                              int move);

/* Writes the header line this instance's /readyz answers carry for its
 * peers' checks: "X-PL-Ring: <view digest> <wall clock ms> <its name>" and
 * CRLF, into <buf> (<cap> bytes). Returns its length, 0 without a ring. */
size_t pl_redirect_view_header(const pl_redirect *r, char *buf, size_t cap);

/* Called with the view a peer's check carried: <digest> and the peer's
 * name (<len> bytes). */
typedef void (*pl_redirect_heard_fn)(void *arg, uint64_t digest, const char *name, size_t len);

/* A peer's check carried <value> (<len> bytes; its X-PL-Ring: "<view
 * digest> <name>"): told to the function pl_redirect_on_heard() set, which
 * compares it with this instance's view and with the peer's last answer. */
void pl_redirect_heard(pl_redirect *r, const char *value, size_t len);
void pl_redirect_on_heard(pl_redirect *r, pl_redirect_heard_fn fn, void *arg);

/* No ring any more (a reload): every request is served here. */
void pl_redirect_off(pl_redirect *r);

/* Looks again, on the loop's next turn, for polls parked here for another
 * member's key (after a hand-over released polls a change passed over). */
void pl_redirect_recheck(pl_redirect *r);

/* Whether <req> (for <path>), which came without the dispatch token, holds
 * a signed redirect to this instance in its <hop> mark that still holds
 * and was not used before; takes it (a second use is refused). */
int pl_redirect_signed(pl_redirect *r, const pl_request *req, const pl_hop *hop,
                       const char *path);

/* Closes its timer; run the loop once more before pl_redirect_free(). */
void pl_redirect_stop(pl_redirect *r);
void pl_redirect_free(pl_redirect *r);

#endif
