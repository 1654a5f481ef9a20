/* confirm_loop.h -- the confirmations (confirm.h) on the loop: the real
 * connections (http.h), the loop's clock, one timer and one check handle.
 * Only this driver knows libuv; the machine it drives does not. */
#ifndef PILOTLIGHT_CONFIRM_LOOP_H
#define PILOTLIGHT_CONFIRM_LOOP_H

#include <uv.h>

#include "pilotlight/confirm.h"

typedef struct pl_confirm_loop pl_confirm_loop;

/* Returns the confirmations of <engine>'s deliveries on <loop> (the rest
 * as for pl_confirm_new), or NULL when out of memory. */
pl_confirm_loop *pl_confirm_loop_new(uv_loop_t *loop, pl_engine *engine,
                                     pl_confirm_counters *counters, const pl_confirm_opts *opts,
                                     pl_confirm_answer_fn answer, pl_confirm_poll_fn poll_ok,
                                     void *arg);

/* The machine it drives. */
pl_confirm *pl_confirm_loop_confirm(pl_confirm_loop *l);

/* Decides what still awaits a decision and closes the handles; run the
 * loop once more before pl_confirm_loop_free(). NULL is fine for both. */
void pl_confirm_loop_stop(pl_confirm_loop *l);
void pl_confirm_loop_free(pl_confirm_loop *l);

#endif
