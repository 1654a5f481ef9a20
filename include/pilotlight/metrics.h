/* metrics.h -- counters and histograms, rendered as Prometheus text 0.0.4.
 * Labels take a few fixed values only: nothing per key or per client. */
#ifndef PILOTLIGHT_METRICS_H
#define PILOTLIGHT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/broker-t.h"
#include "pilotlight/confirm-t.h"
#include "pilotlight/diag-t.h"
#include "pilotlight/engine.h"
#include "pilotlight/histogram.h"
#include "pilotlight/proc.h"
#include "pilotlight/routes-t.h"
#include "pilotlight/upgrade-t.h"

typedef struct {
    uint64_t http[PL_ROUTE__COUNT][5]; /* by status class 1xx..5xx */
    uint64_t dispatch[PL_DISPATCH__COUNT];
    uint64_t miss_nearest[PL_NEAREST__COUNT]; /* misses by what was parked
                                               * nearest (diag.h) */
    uint64_t token[4];              /* by pl_token_result */
    uint64_t connections_open;
    pl_histogram dispatch_seconds; /* dispatch request handling time */
    pl_histogram wait_seconds;     /* how long matched waiters were parked */
    pl_histogram loop_lag;         /* event-loop lag (lag.h) */
    uint64_t refused[2];           /* connections refused: over max_connections,
                                    * out of descriptors (pl_http_refused) */
    pl_proc_stats proc;            /* read at scrape time */
    int proc_ok;                   /* 0 when /proc could not be read */
    uint64_t token_secret[2];       /* valid tokens: current, previous secret */
    uint64_t reloads[2];            /* SIGHUP reloads: ok, error */
    uint64_t forbidden;             /* 403: an address dispatch_allow leaves out */
    uint64_t passed_expiring;       /* polls passed over for a run: their
                                     * controller was about to give up */
    uint64_t upgrades[PL_UPGRADE__COUNT]; /* SIGUSR2 upgrades, by result */
    uint64_t max_waiters, max_waiters_per_key, max_connections; /* in effect */
    pl_confirm_counters confirm;   /* delivery = confirm's own */
    int ring_on;                   /* a key ring is configured */
    uint64_t ring_members;         /* in this instance's view, itself included */
    uint64_t ring_changes;         /* times the view changed */
    uint64_t ring_agreed;          /* every member up reports this view: 1 */
    int64_t ring_clock_skew_ms;    /* the largest clock difference seen in a
                                    * peer's answer */
    uint64_t ring_redirects[2];    /* answered 307: polls, dispatches */
    uint64_t ring_hop_served[2];   /* redirected here, served though another
                                    * instance owns the key: polls, dispatches */
} pl_metrics;

void pl_metrics_init(pl_metrics *m);

static inline void pl_metrics_count_http(pl_metrics *m, pl_route route, int status)
{
    if (status >= 100 && status < 600)
        m->http[route][status / 100 - 1]++;
}

/* Renders everything into <buf> (<cap> bytes). Returns the length, or 0 if
 * it did not fit. */
size_t pl_metrics_render(const pl_metrics *m, const pl_ledger *ledger,
                         size_t keys, char *buf, size_t cap);

#endif
