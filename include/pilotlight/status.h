/* status.h -- what the broker is doing, told to those who ask: /metrics
 * for Prometheus, /debug/waiters for a person or a script. The bodies are
 * built here, in buffers this module owns, from what the engine and the
 * counters hold; nothing here changes them. */
#ifndef PILOTLIGHT_STATUS_H
#define PILOTLIGHT_STATUS_H

#include <uv.h>

#include "pilotlight/config.h"
#include "pilotlight/engine.h"
#include "pilotlight/http.h"
#include "pilotlight/metrics.h"

typedef struct pl_status pl_status;

/* Returns the status of a broker serving <cfg> with <engine>, its counters
 * in <m>, or NULL when out of memory. All must outlive it. */
pl_status *pl_status_new(uv_loop_t *loop, const pl_engine *engine, pl_metrics *m,
                         const pl_config *cfg);

/* Counts the connections of <h> too (up to two listeners). */
void pl_status_attach(pl_status *st, const pl_http *h);

/* GET /metrics: every counter as Prometheus text (500 should they not fit
 * the buffer). */
void pl_status_metrics(pl_status *st, pl_conn *c);

/* GET /debug/waiters: what is parked, per key (at most a thousand keys),
 * as JSON; no payloads. */
void pl_status_waiters(pl_status *st, pl_conn *c);

void pl_status_free(pl_status *st);

#endif
