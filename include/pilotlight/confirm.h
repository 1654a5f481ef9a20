/* confirm.h -- delivery = confirm: when a run written to a controller counts
 * as received, and what the broker does until it knows.
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
 *                                              can take (pl_confirm_wait_ms)
 *   that wait has passed                    -> the controller is taken for
 *                                              dead: reset it, next poll
 *   reset by the controller after it all
 *   left, with no acknowledgement seen      -> false, offered to nobody
 *
 * The first half of this header is that decision, pure: facts and times in,
 * an action out, unit-tested with a table. The second half keeps the
 * deliveries awaiting it: their records, timers and counters. */
#ifndef PILOTLIGHT_CONFIRM_H
#define PILOTLIGHT_CONFIRM_H

#include <stdint.h>

#include <uv.h>

#include "pilotlight/broker-t.h"
#include "pilotlight/confirm-t.h"
#include "pilotlight/engine.h"
#include "pilotlight/http.h"
#include "pilotlight/message.h"

/* ---- the decision ---- */

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
uint64_t pl_confirm_wait_ms(const pl_confirm_facts *f, uint64_t max_ms);

/* Decides about the payload described by <f> at <now>. Sets *why to the
 * attempt's outcome for every action but WAIT, and *until for WAIT (the
 * latest time to look again; sooner when something happens). */
pl_confirm_action pl_confirm_decide(const pl_confirm_facts *f, const pl_confirm_times *t,
                                    uint64_t now, uint64_t *until, pl_confirm_outcome *why);

/* ---- the deliveries awaiting a decision ---- */

typedef struct pl_confirm pl_confirm;

typedef struct {
    uint64_t timeout_ms;  /* confirm_timeout_ms: the safe moves' budget */
    uint64_t wait_max_ms; /* confirm_wait_max_ms */
} pl_confirm_opts;

/* What the broker asks of a poll before a run goes to it (the same as for
 * a first offer): PL_VET_OFFER, or PL_VET_PASS for one not to have it. */
typedef int (*pl_confirm_poll_fn)(void *arg, void *owner, uint64_t parked_at,
                                  const pl_message *m);

/* What the broker does for the confirmations: answer a dispatcher (NULL
 * when it went away: count only) with <result> for the run <m> (its key
 * and payload; valid during the call) and the <note> pl_confirm_start()
 * was given; <waited_ms> is how long the controller that took the run had
 * been parked, <start_ns> when the dispatch arrived (uv_hrtime). */
typedef void (*pl_confirm_answer_fn)(void *arg, pl_conn *dispatcher, const pl_message *m,
                                     uint32_t note, pl_dispatch_result result,
                                     uint64_t waited_ms, uint64_t start_ns);

/* Returns the confirmations of <engine>'s deliveries (the engine's waiters
 * are owned by their connections), counting into <counters>, or NULL when
 * out of memory. */
pl_confirm *pl_confirm_new(uv_loop_t *loop, pl_engine *engine, pl_confirm_counters *counters,
                           const pl_confirm_opts *opts, pl_confirm_answer_fn answer,
                           pl_confirm_poll_fn poll_ok, void *arg);

/* Takes up new settings (a reload): for deliveries started from now on. */
void pl_confirm_set_opts(pl_confirm *cf, const pl_confirm_opts *opts);

/* A dispatch arrived (at <ns>, uv_hrtime): the confirmations keep a moving
 * average of the gaps between dispatches, as a busy broker looks for ACKs
 * itself on its loop's next turns instead of asking for a report each. */
void pl_confirm_note_dispatch(pl_confirm *cf, uint64_t ns);

/* Whether the payload about to be written should ask for no ACK report
 * (the broker is busy: see pl_confirm_note_dispatch). */
int pl_confirm_busy(const pl_confirm *cf);

/* Vets a parked poll's connection <c> before it is offered a run: while
 * some delivery is late or a controller was just taken for dead, a poll
 * whose keepalive probe has gone unanswered is passed over (PL_VET_SKIP)
 * for the others; otherwise, and on the common path, PL_VET_OFFER with no
 * system call. */
int pl_confirm_vet(pl_confirm *cf, pl_conn *c);

/* The delivery of <m> that pl_engine_deliver() just left pending (<d>) for
 * <dispatcher>, whose request it is: the dispatcher is answered when it is
 * decided. Takes over the request's bytes (pl_conn_take_request) or copies
 * the payload, and copies the key. <start_ns>: when the dispatch arrived;
 * <note>: the caller's word, handed back with the answer. Out of memory,
 * the delivery is taken as written (true). */
void pl_confirm_start(pl_confirm *cf, pl_conn *dispatcher, const pl_message *m,
                      const pl_delivery *d, uint64_t start_ns, uint32_t note);

/* Deliveries awaiting their decision now. */
size_t pl_confirm_pending(const pl_confirm *cf);

/* Closes the timers; run the loop once more before pl_confirm_free. The
 * deliveries still awaiting a decision are decided first, with what is
 * known now. */
void pl_confirm_stop(pl_confirm *cf);
void pl_confirm_free(pl_confirm *cf);

#endif
