/* confirm_rule.h -- delivery = confirm's rule: when a run written to a
 * controller counts as received, and what the broker may do until it knows.
 *
 * The rule (docs/delivery.md): a payload that may have reached a controller
 * whole is never offered to another controller, and never answered false
 * while that controller may still acknowledge it. What TCP lets us know:
 *
 *   acknowledged up to its last byte        -> true
 *   some byte of it never left this host,
 *   or the connection ended before it left  -> safe: reset that connection,
 *                                              offer the run to the next poll
 *   it all left, no acknowledgement yet     -> wait, for as long as this
 *                                              connection's acknowledgement
 *                                              can take (pl_confirm_rule_wait_ms)
 *   that wait has passed                    -> the controller is taken for
 *                                              dead: reset it, next poll
 *   reset by the controller after it all
 *   left, with no acknowledgement seen      -> false, offered to nobody
 *
 * Pure: facts and times in, an action out, unit-tested with a table
 * (tests/unit/test_confirm_rule.c). confirm.h keeps the deliveries awaiting
 * the decision. */
#ifndef PILOTLIGHT_CONFIRM_RULE_H
#define PILOTLIGHT_CONFIRM_RULE_H

#include <stdint.h>

#include "pilotlight/confirm-t.h"

/* Linux delays an ACK by up to this long (TCP_DELACK_MAX); other stacks by
 * as long or less. */
#define PL_CONFIRM_DELACK_MS 200

/* What is known of one payload written to a controller. */
typedef struct {
    uint8_t acked;    /* every byte of it acknowledged */
    uint8_t unsent;   /* some byte of it never left this host */
    uint8_t fin;      /* the controller's FIN came (and did not acknowledge it
                       * all, unless acked) */
    uint8_t reset;    /* a reset closed the connection */
    uint8_t gave_up;  /* the kernel gave up on the connection (an error other
                       * than a reset: its retransmissions timed out) */
    uint32_t rtt_us, rttvar_us, rto_us; /* the kernel's view of the path; rto
                                         * without back-off; 0: unknown */
    uint64_t left_at; /* when its last byte left (ms), when !unsent */
} pl_confirm_facts;

/* One attempt's times, in loop milliseconds. */
typedef struct {
    uint64_t late_at;  /* past this, an unsent payload may be taken back when
                        * another poll waits */
    uint64_t deadline; /* of the dispatch: no new attempt after it, and an
                        * unsent payload is taken back at it */
    uint64_t wait_max_ms; /* the most the wait for an ACK may last */
    int others;        /* another poll of the key is waiting */
} pl_confirm_times;

typedef enum {
    PL_CONFIRM_WAIT = 0,  /* look again at *until, or when something happens */
    PL_CONFIRM_DELIVERED, /* true */
    PL_CONFIRM_RETRY,     /* reset the controller's connection; the run may go
                           * to the next poll (or false) */
    PL_CONFIRM_UNDECIDED, /* false, and the run is offered to nobody */
} pl_confirm_action;

/* How long a controller whose whole payload has left is given to
 * acknowledge it: the original's ACK, delayed, and those of the tail-loss
 * probe and two retransmissions (one ACK lost in twenty still leaves four
 * chances), from this connection's round trip and retransmission timeout:
 * 3 x (rtt + rto) + 2 x PL_CONFIRM_DELACK_MS, at most <max_ms>. */
uint64_t pl_confirm_rule_wait_ms(const pl_confirm_facts *f, uint64_t max_ms);

/* Decides about the payload described by <f> at <now>. Sets *why to the
 * attempt's outcome for every action but WAIT, and *until for WAIT (the
 * latest time to look again; sooner when something happens). */
pl_confirm_action pl_confirm_rule_decide(const pl_confirm_facts *f, const pl_confirm_times *t,
                                         uint64_t now, uint64_t *until, pl_confirm_outcome *why);

#endif
