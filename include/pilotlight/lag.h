/* lag.h -- event-loop lag: how late the loop runs work it had scheduled.
 *
 * A kernel timer (timerfd) expires every period at exact monotonic times;
 * the loop sees it among its other I/O, and the time between an expiry and
 * the moment the loop got round to it is one observation. Expiries the loop
 * missed altogether are each observed too, so a long stall is not hidden as
 * one sample. The cost is one descriptor and one read per period, whatever
 * the request rate. */
#ifndef PILOTLIGHT_LAG_H
#define PILOTLIGHT_LAG_H

#include <uv.h>

#include "pilotlight/histogram.h"

typedef struct pl_lag pl_lag;

/* Starts observing into <h> every <period_ms>. Returns the monitor, or NULL
 * when the timer or memory could not be had (then nothing is observed). */
pl_lag *pl_lag_start(uv_loop_t *loop, pl_histogram *h, unsigned period_ms);

/* Stops observing and closes the handle; run the loop once more before
 * pl_lag_free(). NULL is fine for both. */
void pl_lag_stop(pl_lag *l);
void pl_lag_free(pl_lag *l);

#endif
