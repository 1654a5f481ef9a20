/* confirm.h -- delivery = confirm: the deliveries awaiting their decision
 * (confirm_rule.h), and how each learns that its controller acknowledged
 * the run. The one place that decides how an ACK is learnt: by the kernel's
 * report, by the controller's next request, by a look on the loop's next
 * turns or by asking now and then; and the shape of the write that makes
 * the controller's kernel acknowledge at once.
 *
 * A state machine over records, with no loop and no socket of its own: the
 * connections and the clock come through a table of functions
 * (pl_confirm_io), which confirm_loop.c fills with the real ones and a
 * unit test with fakes. The broker calls the hooks below at fixed points of
 * a park and a delivery; under delivery = written each does nothing. */
#ifndef PILOTLIGHT_CONFIRM_H
#define PILOTLIGHT_CONFIRM_H

#include <stdint.h>

#include "pilotlight/broker-t.h"
#include "pilotlight/buf.h"
#include "pilotlight/confirm-t.h"
#include "pilotlight/confirm_rule.h"
#include "pilotlight/engine.h"
#include "pilotlight/http.h"
#include "pilotlight/message.h"

typedef struct pl_confirm pl_confirm;

typedef struct {
    int on;               /* delivery = confirm; else every hook does nothing */
    uint64_t timeout_ms;  /* confirm_timeout_ms: the safe moves' budget */
    uint64_t wait_max_ms; /* confirm_wait_max_ms */
} pl_confirm_opts;

/* What the machine does to connections and to time, through its driver
 * (<drv>): http.h's verbs and the loop's clock and timers for real. */
typedef struct {
    int (*acknowledged)(pl_conn *c);
    int (*tcp_info)(pl_conn *c, pl_tcp_facts *t);
    void (*probe)(pl_conn *c);
    int (*ended)(pl_conn *c);
    int (*peer_gone)(pl_conn *c);
    void (*hold)(pl_conn *c);
    void (*hold_on_eof)(pl_conn *c);
    void (*release)(pl_conn *c);
    void (*abort)(pl_conn *c);
    void (*set_owner)(pl_conn *c, void *obj, pl_conn_owner *ops);
    int (*take_request)(pl_conn *c, pl_buf *out);
    int (*set_reports)(pl_conn *c, unsigned value);
    unsigned (*reports)(pl_conn *c);
    uint64_t (*now)(void *drv);    /* ms, the loop's clock */
    uint64_t (*now_ns)(void *drv); /* ns, a monotonic clock */
    /* Run pl_confirm_tick() by <due> (ms); UINT64_MAX: not at all. */
    void (*arm)(void *drv, uint64_t due);
    /* Run pl_confirm_turn() after each turn of the loop while <on>. */
    void (*turns)(void *drv, int on);
} pl_confirm_io;

/* What the broker does for the confirmations: answer a dispatcher (NULL
 * when it went away: count only) with <result> for the run <m> (its key
 * and payload; valid during the call) and the <note> pl_confirm_start()
 * was given; <waited_ms> is how long the controller that took the run had
 * been parked, <start_ns> when the dispatch arrived (io->now_ns). */
typedef void (*pl_confirm_answer_fn)(void *arg, pl_conn *dispatcher, const pl_message *m,
                                     uint32_t note, pl_dispatch_result result,
                                     uint64_t waited_ms, uint64_t start_ns);

/* What the broker asks of a poll before a run goes to it (the same as for
 * a first offer): PL_VET_OFFER, or PL_VET_PASS for one not to have it. */
typedef int (*pl_confirm_poll_fn)(void *arg, void *owner, uint64_t parked_at,
                                  const pl_message *m);

/* Returns the confirmations of <engine>'s deliveries (the engine's waiters
 * are owned by their connections), counting into <counters>, working
 * through <io> and <drv>, or NULL when out of memory. */
pl_confirm *pl_confirm_new(const pl_confirm_io *io, void *drv, pl_engine *engine,
                           pl_confirm_counters *counters, const pl_confirm_opts *opts,
                           pl_confirm_answer_fn answer, pl_confirm_poll_fn poll_ok, void *arg);

/* Takes up new settings (a reload): for deliveries started from now on. */
void pl_confirm_set_opts(pl_confirm *cf, const pl_confirm_opts *opts);

/* ---- the broker's hooks ---- */

/* A poll parked on <c> (or was adopted on it): its ACKs will matter. */
void pl_confirm_parked(pl_confirm *cf, pl_conn *c);

/* A dispatch arrived: the confirmations keep a moving average of the gaps
 * between dispatches, as a busy broker looks for ACKs itself on its loop's
 * next turns instead of asking for a report each. */
void pl_confirm_note_dispatch(pl_confirm *cf);

/* Vets a parked poll's connection <c> before it is offered a run: while
 * some delivery is late or a controller was just taken for dead, a poll
 * whose keepalive probe has gone unanswered is passed over (PL_VET_SKIP)
 * for the others; otherwise, and on the common path, PL_VET_OFFER with no
 * system call. */
int pl_confirm_vet(pl_confirm *cf, pl_conn *c);

/* A run is about to be written to <c> (the engine's settle callback, for a
 * match): how its ACK will be learnt is set up. */
void pl_confirm_writing(pl_confirm *cf, pl_conn *c);

/* ... and was written: returns PL_SETTLE_PENDING (its delivery is to be
 * confirmed: pl_confirm_start() follows), or 0 (delivery = written). */
int pl_confirm_written(pl_confirm *cf);

/* The delivery of <m> that pl_engine_deliver() just left pending (<d>) for
 * <dispatcher>, whose request it is: the dispatcher is answered when it is
 * decided. Takes over the request's bytes (io->take_request) or copies
 * the payload, and copies the key. <start_ns>: when the dispatch arrived;
 * <note>: the caller's word, handed back with the answer. Out of memory,
 * the delivery is taken as written (true). */
void pl_confirm_start(pl_confirm *cf, pl_conn *dispatcher, const pl_message *m,
                      const pl_delivery *d, uint64_t start_ns, uint32_t note);

/* ---- the driver's ---- */

/* The time io->arm() asked for has come. */
void pl_confirm_tick(pl_confirm *cf);

/* A turn of the loop has ended (while io->turns() asked for them). */
void pl_confirm_turn(pl_confirm *cf);

/* Deliveries awaiting their decision now. */
size_t pl_confirm_pending(const pl_confirm *cf);

/* Decides every delivery still awaiting a decision, with what is known
 * now (normally none: a drained server has closed every connection). */
void pl_confirm_stop(pl_confirm *cf);
void pl_confirm_free(pl_confirm *cf);

#endif
