/* broker.h -- the endpoints: routes requests to the engine and answers them.
 *
 * Glue between the HTTP layer (which knows sockets) and the engine (which
 * knows keys and waiters): a parked poll is an engine waiter whose owner is
 * the connection; the engine's settle callback writes its answer. */
#ifndef PILOTLIGHT_BROKER_H
#define PILOTLIGHT_BROKER_H

#include <uv.h>

#include "pilotlight/broker-t.h"
#include "pilotlight/cluster.h"
#include "pilotlight/config.h"
#include "pilotlight/http.h"
#include "pilotlight/metrics.h"
#include "pilotlight/ring.h"
#include "pilotlight/status.h"

typedef struct pl_broker pl_broker;

/* Returns a broker serving <cfg> (which must outlive it), or NULL when out
 * of memory. */
pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg);

/* What a listener serves: controllers (/connect, polls) and dispatchers
 * (dispatch, /metrics, /debug/waiters); /healthz and /readyz are on both. */
enum { PL_SERVE_CONTROLLERS = 1, PL_SERVE_DISPATCH = 2 };

/* "controllers", "dispatch" or "all", for the log. */
const char *pl_broker_serves_name(unsigned serves);

/* One listener's view of the broker: the <app> of its pl_http. */
typedef struct {
    pl_broker *broker;
    unsigned serves; /* PL_SERVE_* */
} pl_broker_view;

/* Returns the view for a pl_http whose listener serves <serves>. */
pl_broker_view *pl_broker_view_of(pl_broker *b, unsigned serves);

/* Lets /metrics count the connections of <h> (up to two listeners). */
void pl_broker_attach(pl_broker *b, const pl_http *h);

/* GET /warm-start: parks a controller's poll (or answers why not). <hop>
 * is what the request's query says of its redirects (routes.c reads it). */
void pl_broker_park(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop);

/* POST /warm-start: hands the run to a parked poll of its key, and answers
 * didWarmStart (delivery = confirm: once it is known). */
void pl_broker_dispatch(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop);

/* The key ring changed (peers.h): from now on requests for keys another
 * member owns are redirected there (307), and the polls parked here for
 * them are sent there (outcome MOVED; redirect.h says when). <self> is
 * this instance's index in <ring>, -1 once it has left (it drains: it owns
 * nothing); <agreed>: every member up reports the same members. */
void pl_broker_ring_changed(pl_broker *b, const pl_ring *ring, int self, int agreed);

/* No ring any more (a reload removed it): every key is served here. */
void pl_broker_ring_off(pl_broker *b);

/* What the small endpoints serve: /connect's body (<len> bytes), whether
 * the server drains (/readyz), and what serves /metrics and /debug/waiters. */
const char *pl_broker_connect_body(const pl_broker *b, size_t *len);
int pl_broker_draining(const pl_broker *b);
pl_status *pl_broker_status(pl_broker *b);

/* The key ring's side of the broker (redirect.h). */
struct pl_redirect *pl_broker_ring(pl_broker *b);

/* Takes up <next> (a live reload): caps, order and park timeout, token
 * mode and secrets (a new verifier, so a dropped secret's cached tokens go
 * too), what /connect serves. Tighter rules apply to what is parked: a
 * poll a new one like it would not pass is answered as that one would be
 * (token rules: revoked, 401 or closed unanswered when its token was never
 * verified here; a lower cap: rejected, 503, the newest first). Everything
 * else the broker reads from its cfg at each use, so the caller then copies
 * <next> over that cfg. Returns 0, or -ENOMEM (nothing changed). Counts the reload. */
int pl_broker_reconfigure(pl_broker *b, const pl_config *next);

/* Counts a reload that failed before reaching the broker (a bad file). */
void pl_broker_count_reload_error(pl_broker *b);

/* Counts a binary upgrade's end. */
void pl_broker_count_upgrade(pl_broker *b, pl_upgrade_result result);

/* Calls <fn> for every parked poll (not one whose delivery awaits its
 * confirmation), oldest first, with its connection. <fn> must not change
 * the broker. */
void pl_broker_each_parked(pl_broker *b,
                           void (*fn)(pl_conn *c, const pl_waiter_info *info, void *arg),
                           void *arg);

/* The broker's counters, for what the server feeds them (the loop's lag). */
pl_metrics *pl_broker_metrics(pl_broker *b);

/* The configuration the broker serves. */
const pl_config *pl_broker_config(const pl_broker *b);

/* PL_SERVE_* of the listener <c> came in on. */
unsigned pl_broker_conn_serves(const pl_conn *c);

/* Holds (<on>) the parked poll <w> while a new process may be taking its
 * socket over, or releases it (pl_engine_hold): held, nothing here answers
 * it. A release brings its deadline back, even one passed meanwhile. */
void pl_broker_hold(pl_broker *b, pl_waiter *w, int on);

/* Settles the parked poll <w> as handed over to a new process: its
 * connection is closed here without a word (the new process holds the
 * socket). */
void pl_broker_hand_over(pl_broker *b, pl_waiter *w);

/* Parks the poll of the adopted connection <c> (pl_http_adopt), parked
 * <age_ms> ago in the old process. Returns 0, or an engine error
 * (PL_ENOMEM, PL_EINVAL, PL_EEXIST) with <c> left as it was. */
int pl_broker_adopt(pl_broker *b, pl_conn *c, const pl_key *key, const char *id,
                    size_t id_len, uint64_t age_ms);

/* /readyz answers 503 from now on. */
void pl_broker_set_draining(pl_broker *b);

/* Closes every parked poll without a response (outcome shutdown); polls
 * arriving later are closed the same way. */
void pl_broker_close_parked(pl_broker *b);

/* Closes the broker's timer; run the loop once more before pl_broker_free. */
void pl_broker_stop(pl_broker *b);
void pl_broker_free(pl_broker *b);

#endif
