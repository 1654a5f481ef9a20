/* metrics.h -- counters and histograms, rendered as Prometheus text 0.0.4.
 * Labels take a few fixed values only: nothing per key or per client. */
#ifndef PILOTLIGHT_METRICS_H
#define PILOTLIGHT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "pilotlight/engine.h"
#include "pilotlight/histogram.h"
#include "pilotlight/proc.h"

typedef enum {
    PL_ROUTE_OTHER = 0,
    PL_ROUTE_CONNECT,
    PL_ROUTE_PARK,
    PL_ROUTE_DISPATCH,
    PL_ROUTE_HEALTHZ,
    PL_ROUTE_READYZ,
    PL_ROUTE_METRICS,
    PL_ROUTE_DEBUG,
    PL_ROUTE__COUNT
} pl_route;

/* What a dispatch came to. */
typedef enum {
    PL_DISPATCH_HIT = 0,     /* true */
    PL_DISPATCH_MISS,        /* false: no poll took it, or none could have it
                              * whole */
    PL_DISPATCH_INVALID,     /* 400 */
    PL_DISPATCH_ABANDONED,   /* its dispatcher had gone before the run was
                              * handed to a controller: offered to nobody */
    PL_DISPATCH_UNCONFIRMED, /* false although the last controller tried may
                              * have it: TCP could not tell (delivery = confirm;
                              * docs/delivery.md) */
    PL_DISPATCH__COUNT
} pl_dispatch_result;

/* How a delivery (delivery = confirm) was found acknowledged. */
typedef enum {
    PL_CONFIRM_BY_ACK_EVENT = 0, /* the kernel's ACK report */
    PL_CONFIRM_BY_POLL,          /* asking SIOCOUTQ, where reports were refused */
    PL_CONFIRM_BY_NEXT_REQUEST,  /* the controller's next request carried it */
    PL_CONFIRM_BY_NEXT_TURN,     /* asking SIOCOUTQ on the loop's next turns (busy) */
    PL_CONFIRM_BY_LATE_CHECK,    /* asking the kernel once the ACK was late, or
                                  * the connection ended */
    PL_CONFIRM_BY__COUNT
} pl_confirm_method;

/* How one attempt to deliver to a controller ended (delivery = confirm);
 * redelivered counts the run going on to the key's next poll. */
typedef enum {
    PL_CONFIRM_ACKED = 0,
    PL_CONFIRM_UNSENT,           /* part of it never left: reset, not received */
    PL_CONFIRM_CLOSED_UNREAD,    /* the controller closed before it had it all */
    PL_CONFIRM_UNACKNOWLEDGED,   /* it all left; no ACK within the wait: the
                                  * controller was taken for dead */
    PL_CONFIRM_RESET_AFTER_SEND, /* reset by the controller after it all left,
                                  * no ACK seen: false, offered to nobody */
    PL_CONFIRM_REDELIVERED,
    PL_CONFIRM__COUNT
} pl_confirm_outcome;

/* How a binary upgrade (SIGUSR2) ended, seen from the process upgraded. */
typedef enum {
    PL_UPGRADE_HANDED_OVER = 0, /* the new process took everything over */
    PL_UPGRADE_FAILED,          /* it could not start, exited or refused */
    PL_UPGRADE_TIMEOUT,         /* it missed a step's bound: killed */
    PL_UPGRADE_ABORTED,         /* SIGTERM or SIGINT came first: killed */
    PL_UPGRADE__COUNT
} pl_upgrade_result;

typedef struct {
    uint64_t http[PL_ROUTE__COUNT][5]; /* by status class 1xx..5xx */
    uint64_t dispatch[PL_DISPATCH__COUNT];
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
    uint64_t upgrades[PL_UPGRADE__COUNT]; /* SIGUSR2 upgrades, by result */
    uint64_t max_waiters, max_waiters_per_key, max_connections; /* in effect */
    uint64_t confirm_method[PL_CONFIRM_BY__COUNT];
    uint64_t confirm[PL_CONFIRM__COUNT];
    uint64_t ack_events_refused;   /* controller connections left to polling */
    uint64_t confirm_probes;       /* parked polls probed: a delivery was late */
    uint64_t confirm_skipped;      /* polls passed over: their probe unanswered */
    pl_histogram confirm_ack_seconds; /* payload written to ACK report */
    int ring_on;                   /* a key ring is configured */
    uint64_t ring_members;         /* in this instance's view, itself included */
    uint64_t ring_changes;         /* times the view changed */
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
