/* broker.h -- the endpoints: routes requests to the engine and answers them.
 *
 * Glue between the HTTP layer (which knows sockets) and the engine (which
 * knows keys and waiters): a parked poll is an engine waiter whose owner is
 * the connection; the engine's settle callback writes its answer. */
#ifndef PILOTLIGHT_BROKER_H
#define PILOTLIGHT_BROKER_H

#include <uv.h>

#include "pilotlight/config.h"
#include "pilotlight/http.h"
#include "pilotlight/metrics.h"

typedef struct pl_broker pl_broker;

/* Returns a broker serving <cfg> (which must outlive it), or NULL when out
 * of memory. */
pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg);

/* What a listener serves: controllers (/connect, polls) and dispatchers
 * (dispatch, /metrics, /debug/waiters); /healthz and /readyz are on both. */
enum { PL_SERVE_CONTROLLERS = 1, PL_SERVE_DISPATCH = 2 };

/* Returns the <app> pointer for a pl_http whose listener serves <serves>. */
void *pl_broker_side(pl_broker *b, unsigned serves);

/* Lets /metrics count the connections of <h> (up to two listeners). */
void pl_broker_attach(pl_broker *b, const pl_http *h);

/* pl_http callbacks; <app> is a pl_broker_side() pointer. */
void pl_broker_on_request(void *b, pl_conn *c, const pl_request *req);
void pl_broker_on_close(void *b, pl_conn *c);
void pl_broker_on_response(void *b, unsigned tag, int status);
void pl_broker_on_acked(void *b, pl_conn *c);

/* /readyz answers 503 from now on. */
void pl_broker_set_draining(pl_broker *b);

/* Closes every parked poll without a response (outcome shutdown); polls
 * arriving later are closed the same way. */
void pl_broker_close_parked(pl_broker *b);

/* Closes the broker's timer; run the loop once more before pl_broker_free. */
void pl_broker_stop(pl_broker *b);
void pl_broker_free(pl_broker *b);

#endif
