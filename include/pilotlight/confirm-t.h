/* confirm-t.h -- delivery = confirm's types: how a delivery was found
 * acknowledged, how an attempt ended, and the counters confirm keeps of
 * them (rendered by metrics.c). */
#ifndef PILOTLIGHT_CONFIRM_T_H
#define PILOTLIGHT_CONFIRM_T_H

#include <stdint.h>

#include "pilotlight/histogram.h"

/* How a delivery was found acknowledged. Order is the order of the metrics
 * labels. */
typedef enum {
    PL_CONFIRM_BY_ACK_EVENT = 0, /* the kernel's ACK report */
    PL_CONFIRM_BY_POLL,          /* asking SIOCOUTQ, where reports were refused */
    PL_CONFIRM_BY_NEXT_REQUEST,  /* the controller's next request carried it */
    PL_CONFIRM_BY_NEXT_TURN,     /* asking SIOCOUTQ on the loop's next turns (busy) */
    PL_CONFIRM_BY_LATE_CHECK,    /* asking the kernel once the ACK was late, or
                                  * the connection ended */
    PL_CONFIRM_BY__COUNT
} pl_confirm_method;

/* How one attempt to deliver to a controller ended; redelivered counts the
 * run going on to the key's next poll. */
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

/* What confirm counts. */
typedef struct {
    uint64_t method[PL_CONFIRM_BY__COUNT];
    uint64_t outcome[PL_CONFIRM__COUNT];
    uint64_t ack_events_refused; /* controller connections left to polling */
    uint64_t probes;             /* parked polls probed: a delivery was late */
    uint64_t skipped;            /* polls passed over: their probe unanswered */
    pl_histogram ack_seconds;    /* payload written to ACK report */
} pl_confirm_counters;

#endif
