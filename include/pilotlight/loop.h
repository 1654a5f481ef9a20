/* loop.h -- a timer due at a loop time, as every module on the loop arms
 * its own. */
#ifndef PILOTLIGHT_LOOP_H
#define PILOTLIGHT_LOOP_H

#include <stdint.h>

#include <uv.h>

/* Starts <t> to run <cb> once at loop time <due> (milliseconds, as
 * uv_now), or on the loop's next turn when <due> has passed; <min_ms>
 * is the least delay (1 keeps a timer that re-arms itself from running
 * again in the same turn). */
static inline void pl_timer_at(uv_timer_t *t, uv_timer_cb cb, uint64_t due, uint64_t min_ms)
{
    uint64_t now = uv_now(t->loop), ms = due > now ? due - now : 0;

    uv_timer_start(t, cb, ms > min_ms ? ms : min_ms, 0);
}

#endif
