/* reclaim.c -- give pages back once a crowd of connections has gone. */
#include <malloc.h>

#include "pilotlight/log.h"
#include "pilotlight/pool.h"
#include "pilotlight/reclaim.h"
#include "pilotlight/uvmem.h"

/* Fewer connections coming and going than this do not trim: a handful
 * would free and fault the same pages again and again. */
#define MIN_PEAK 16
#define FRACTION 8

static struct {
    uv_prepare_t prep;
    int started;
    uint64_t open;
    uint64_t peak; /* most open since memory was last given back */
    uint64_t low;  /* open at that time (0 before any) */
} r;

int pl_reclaim_due(uint64_t open, uint64_t peak, uint64_t low)
{
    /* Again at every new low: a crowd's last few connections, whatever
     * order they close in, leave no page behind. */
    return open < low || (peak >= MIN_PEAK && open <= peak / FRACTION);
}

static void trim(uv_prepare_t *prep)
{
    size_t n = pl_pool_trim();

    r.peak = r.low = r.open;
    malloc_trim(0); /* what is not pooled: hash tables, large buffers */
    pl_uvmem_trim(); /* libuv's descriptor table, zeros once a crowd has gone */
    uv_prepare_stop(prep);
    PL_LOG(PL_LOG_DEBUG, "pool chunks returned", "\"chunks\":%zu,\"connections\":%llu", n,
           (unsigned long long)r.open);
}

void pl_reclaim_start(uv_loop_t *loop)
{
    uv_prepare_init(loop, &r.prep);
    r.started = 1;
}

void pl_reclaim_opened(void)
{
    if (++r.open > r.peak)
        r.peak = r.open;
}

void pl_reclaim_closed(void)
{
    r.open--;
    if (r.started && pl_reclaim_due(r.open, r.peak, r.low))
        uv_prepare_start(&r.prep, trim);
}

void pl_reclaim_stop(void)
{
    if (r.started)
        uv_close((uv_handle_t *)&r.prep, NULL);
    r.started = 0;
}
