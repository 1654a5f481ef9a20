/* reclaim.h -- when memory goes back to the system: once a crowd of
 * connections has gone.
 *
 * Not per request and not on a timer: when the open connections fall to
 * an eighth of their peak since the last time (that peak at least 16), and
 * after that at every count lower than at the last time (each a new low),
 * the pools give back the pages of their empty chunks (pl_pool_trim),
 * malloc gives back what it can, and libuv's descriptor table its zero
 * pages (pl_uvmem_trim). The work runs once, as the loop is about to wait,
 * however many connections closed in that turn. Counting is process-wide:
 * the transport reports each connection opened and closed. */
#ifndef PILOTLIGHT_RECLAIM_H
#define PILOTLIGHT_RECLAIM_H

#include <stdint.h>

#include <uv.h>

/* Whether memory goes back now that <open> connections are open, having
 * been <peak> at most since the last time, and <low> then (0 before any):
 * the policy above, alone. */
int pl_reclaim_due(uint64_t open, uint64_t peak, uint64_t low);

/* The trims run on <loop> from now on. */
void pl_reclaim_start(uv_loop_t *loop);

/* A connection opened, closed (from its close callback). */
void pl_reclaim_opened(void);
void pl_reclaim_closed(void);

/* Closes the handle; the loop then runs once more. */
void pl_reclaim_stop(void);

#endif
