/* status.h -- what the broker is doing, told to those who ask: /metrics
 * for Prometheus, /debug/waiters for a script, /status (a page) and
 * /debug/status (its JSON) for a person asking whether warm starts happen
 * and, when they do not, why. The bodies are built here, in buffers this
 * module owns, from what the engine, the counters and the diagnosis hold
 * (diag.h); the broker tells it of each dispatch answered and each token
 * refused, and nothing here changes the engine. */
#ifndef PILOTLIGHT_STATUS_H
#define PILOTLIGHT_STATUS_H

#include <uv.h>

#include "pilotlight/config.h"
#include "pilotlight/diag.h"
#include "pilotlight/engine.h"
#include "pilotlight/http.h"
#include "pilotlight/metrics.h"
#include "pilotlight/peers.h"

typedef struct pl_status pl_status;

/* Returns the status of a broker serving <cfg> with <engine>, its counters
 * in <m>, or NULL when out of memory. All must outlive it. */
pl_status *pl_status_new(uv_loop_t *loop, const pl_engine *engine, pl_metrics *m,
                         const pl_config *cfg);

/* Counts the connections of <h> too (up to two listeners). */
void pl_status_attach(pl_status *st, const pl_http *h);

/* The key ring's members as <p> sees them, shown by /status (NULL: no
 * ring, or no longer). <p> must outlive it or be unset first. */
void pl_status_set_peers(pl_status *st, const pl_peers *p);

/* The diagnosis /status shows, which the broker tells of each dispatch
 * (pl_diag_tag before its delivery, pl_diag_dispatched once answered)
 * itself: a hit's path one call deep. */
pl_diag *pl_status_diag(pl_status *st);

/* A poll for <key> came with a deployment token that did not verify
 * (<token>, a pl_token_result), refused 401 when <enforced>. */
void pl_status_token_refused(pl_status *st, const pl_key *key, int token, int enforced,
                             uint64_t now);

/* GET /metrics: every counter as Prometheus text (500 should they not fit
 * the buffer). */
void pl_status_metrics(pl_status *st, pl_conn *c);

/* GET /debug/waiters: what is parked, per key (at most a thousand keys),
 * as JSON; no payloads. */
void pl_status_waiters(pl_status *st, pl_conn *c);

/* GET /status: the status page, rendered whole (readable without
 * JavaScript; its script refreshes it from /debug/status). <draining>: the
 * server is stopping. 503 when out of memory. */
void pl_status_page(pl_status *st, pl_conn *c, int draining);

/* GET /debug/status: what the page shows, as JSON (docs/protocol.md). */
void pl_status_json(pl_status *st, pl_conn *c, int draining);

/* Logs the engine's ledger (at exit: the last word on every poll this
 * process held). */
void pl_status_log_ledger(const pl_status *st);

void pl_status_free(pl_status *st);

#endif
