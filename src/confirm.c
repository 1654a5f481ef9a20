/* confirm.c -- delivery = confirm: a run written to a controller, until that
 * controller's TCP stack has acknowledged it or cannot have it; and how
 * each acknowledgement is learnt. */
#include <errno.h>
#include <string.h>

#include <utlist.h>

#include "pilotlight/buf.h"
#include "pilotlight/confirm.h"
#include "pilotlight/invariant.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"

/* ---- the deliveries awaiting a decision ---- */

/* An attempt is late, and the kernel is asked what it knows, once its ACK
 * has taken longer than ACKs take here (mean + 4 deviations of the reports
 * seen, as TCP's retransmit timer), at least LATE_MIN_MS: above Linux's
 * shortest delayed ACK (40 ms); at most LATE_MAX_MS: above its longest
 * (200 ms), so that no sequence of slow readers can make a late attempt
 * wait longer (what one connection teaches cannot hurt another). The
 * reports learnt from are those of runs that fit a few segments
 * (LEARN_MAX_BYTES): a large run's ACK time is its transfer's. */
#define LATE_MIN_MS 50
#define LATE_MAX_MS 250
#define LEARN_MAX_BYTES 8192

/* A controller whose ACK came with its next request is asked for its ACK
 * only once that request is this late, then each time its wait has
 * doubled: a prompt one costs no system call, a stalled crowd few. Short,
 * as a ride can be a coincidence (a pooled client's other poll on the
 * connection): its run was solicited, so its ACK left as it was read, and
 * the first look finds it. */
#define RIDE_MS 3

/* A busy broker looks for a controller's ACK itself on the loop's next
 * turns (SIOCOUTQ) instead of asking the kernel for a report: a report
 * wakes the loop on its own, which costs more than the look in a turn that
 * comes anyway. Busy: dispatches closer together than SWEEP_GAP_NS, on
 * average (an EWMA of their gaps, each counted at most as SWEEP_GAP_MAX_NS
 * so that one quiet spell is forgotten as quickly). */
#define SWEEP_GAP_NS 500000
#define SWEEP_GAP_MAX_NS 10000000

/* A swept delivery no turn has confirmed this long after its write is
 * polled each millisecond; the record's due at the window's end makes sure
 * a loop with nothing else to do looks. Not shorter: a timer due within
 * the kernel's tick makes every blocking epoll_wait reprogram the CPU's
 * timer, a VM exit here. */
#define SWEEP_WINDOW_MS 20

/* The owner's switch for a connection's ACK reports (pl_conn_set_reports):
 * what confirm remembers of it between deliveries. */
enum {
    SW_NEW = 0,                   /* never set: reports to be turned on */
    SW_ON = PL_CONN_REPORTS_ON,   /* each run's write asks for a report */
    SW_RIDE,  /* its last ACK came with its next request, which says as much
               * as a report would: its writes ask for none, saving a
               * recvmsg() and libuv's EPOLL_CTL_MOD per delivery */
    SW_SKIP,  /* this write asks for none: the broker is busy, and looks on
               * the loop's next turns instead (back to SW_ON after it) */
};

/* When an ACK is overdue, the next polls of its key are probed, so that a
 * run that has to move on finds the dead ones among them already known. */
#define PROBE_AHEAD 8

/* How a delivery's ACK is learnt before the attempt is late. */
enum {
    HOW_REPORT = 0, /* the kernel's ACK report */
    HOW_RIDE,       /* the controller's next request, else a look now and then */
    HOW_POLL,       /* a look (SIOCOUTQ) each millisecond: no reports */
    HOW_SWEEP,      /* a look on the loop's next turns (busy) */
};

/* A dispatch whose run was written to a controller and is not yet decided.
 * It owns the run, to offer it to the next poll: the dispatch request's
 * own bytes, taken over (a copy of the payload only where they cannot be),
 * and a copy of the key strings. */
typedef struct rec rec;
struct rec {
    rec *prev, *next;     /* in cf->recs */
    rec *fprev, *fnext;   /* in cf->fresh, while swept in its window */
    pl_confirm *cf;
    pl_waiter *w;         /* the attempt's waiter, pending in the engine */
    pl_conn *controller;  /* the attempt's connection, held */
    pl_conn *dispatcher;  /* NULL once it went away */
    uint64_t start_ns;    /* the dispatch arrived (io->now_ns) */
    uint64_t deadline;    /* of the dispatch (loop ms, as all below) */
    uint64_t written;     /* this attempt's payload was written */
    uint64_t late_at;     /* ask the kernel from then on */
    uint64_t look_at;     /* a polled attempt's next look */
    uint64_t due;         /* when the timer is next to look at it */
    uint64_t sent_ns;     /* a reported attempt's write, for the histogram */
    uint64_t turn;        /* a swept attempt's loop turn */
    uint64_t waited_ms;   /* how long the attempt's poll had been parked */
    uint64_t left_at;     /* its whole payload was first seen to have left,
                           * at this time; 0 until then */
    pl_confirm_outcome last; /* how the last failed attempt ended */
    uint32_t note;        /* the caller's (pl_confirm_start) */
    unsigned how : 2;     /* HOW_* */
    unsigned late : 1;    /* past late_at: the kernel was asked */
    unsigned overdue : 1; /* its ACK is overdue for its path: counted in
                           * cf->overdue, its key's next polls probed */
    unsigned fresh : 1;   /* in cf->fresh */
    unsigned swept : 1;   /* the turns looked first (busy) */
    unsigned failed : 1;  /* an earlier attempt failed (see last) */
    pl_buf request;       /* the dispatch request's bytes, or none */
    pl_message msg;       /* views into request or data[] */
    char data[];
};

struct pl_confirm {
    const pl_confirm_io *io;
    void *drv;
    pl_engine *engine;
    pl_confirm_counters *m;
    pl_confirm_opts opts;
    pl_confirm_answer_fn answer;
    pl_confirm_poll_fn poll_ok;
    void *arg;
    rec *recs;
    size_t nrecs;
    rec *fresh;              /* swept records in their window, oldest first */
    unsigned overdue;        /* records whose ACK is overdue */
    uint64_t suspect_until;  /* a controller was just taken for dead */
    uint64_t armed;          /* the due io->arm() was last given */
    uint64_t turns;          /* loop turns swept, to skip a record's own */
    uint64_t dispatch_ns, gap_ns; /* the last dispatch; the gaps' EWMA */
    uint64_t ack_srtt_ns, ack_rttvar_ns; /* ACK report times, as TCP's RTO */
};

#define NOW(cf) ((cf)->io->now((cf)->drv))
#define NOW_NS(cf) ((cf)->io->now_ns((cf)->drv))

static void look(pl_confirm *cf, rec *r, uint64_t now, int final);
static void controller_closed(void *obj, pl_conn *c);
static void controller_event(void *obj, pl_conn *c, int ev, int arg);
static void dispatcher_closed(void *obj, pl_conn *c);

static pl_conn_owner controller_owner = {controller_closed, controller_event, 0};
static pl_conn_owner dispatcher_owner = {dispatcher_closed, NULL, 0};

static size_t rec_size(const rec *r)
{
    return sizeof(*r) + (r->request.data != NULL ? 0 : r->msg.payload_len) +
           r->msg.key.deployment_len + r->msg.key.version_len;
}

/* ---- when to look ---- */

/* Makes the driver tick by <due> (it may tick early, and re-arm). */
static void arm(pl_confirm *cf, uint64_t due)
{
    if (cf->armed != UINT64_MAX && cf->armed <= due)
        return;
    cf->armed = due;
    cf->io->arm(cf->drv, due);
}

static void schedule(pl_confirm *cf, rec *r, uint64_t due)
{
    r->due = due;
    arm(cf, due);
}

void pl_confirm_tick(pl_confirm *cf)
{
    uint64_t now = NOW(cf), next = UINT64_MAX;
    rec *r, *after;

    cf->armed = UINT64_MAX;
    for (r = cf->recs; r != NULL; r = after) {
        after = r->next;
        if (r->due <= now)
            look(cf, r, now, 0);
    }
    /* A record looked at either went or has a later due. */
    for (r = cf->recs; r != NULL; r = r->next)
        next = r->due < next ? r->due : next;
    if (next != UINT64_MAX)
        arm(cf, next);
}

/* ---- the busy broker's looks on the loop's next turns ---- */

static void fresh_join(pl_confirm *cf, rec *r)
{
    r->turn = cf->turns;
    r->fresh = 1;
    DL_APPEND2(cf->fresh, r, fprev, fnext);
    if (r == cf->fresh)
        cf->io->turns(cf->drv, 1);
}

static void fresh_leave(pl_confirm *cf, rec *r)
{
    if (!r->fresh)
        return;
    r->fresh = 0;
    DL_DELETE2(cf->fresh, r, fprev, fnext);
    if (cf->fresh == NULL)
        cf->io->turns(cf->drv, 0);
}

static void acked(pl_confirm *cf, rec *r, pl_confirm_method how);

/* Looks at the fresh record <r>, written before this turn: acknowledged,
 * it is confirmed; past its window, polled from now on. */
static void sweep_one(pl_confirm *cf, rec *r, uint64_t now)
{
    int state = cf->io->acknowledged(r->controller);

    if (state == 0) {
        acked(cf, r, PL_CONFIRM_BY_NEXT_TURN);
    } else if (state != -EAGAIN || now - r->written >= SWEEP_WINDOW_MS) {
        fresh_leave(cf, r);
        r->how = HOW_POLL;
        r->swept = 1;
        r->look_at = now + 1;
        schedule(cf, r, r->look_at < r->late_at ? r->look_at : r->late_at);
    }
}

void pl_confirm_turn(pl_confirm *cf)
{
    uint64_t now = NOW(cf);
    rec *r, *after;

    for (r = cf->fresh; r != NULL && r->turn != cf->turns; r = after) {
        after = r->fnext;
        sweep_one(cf, r, now);
    }
    cf->turns++;
}

void pl_confirm_note_dispatch(pl_confirm *cf)
{
    uint64_t ns, gap;

    if (!cf->opts.on)
        return;
    ns = NOW_NS(cf);
    gap = ns - cf->dispatch_ns;
    cf->dispatch_ns = ns;
    gap = gap < SWEEP_GAP_MAX_NS ? gap : SWEEP_GAP_MAX_NS;
    cf->gap_ns = (7 * cf->gap_ns + gap) / 8;
}

static int busy(const pl_confirm *cf)
{
    return cf->gap_ns < SWEEP_GAP_NS;
}

/* ---- an attempt ---- */

/* How long ACKs take here, by the reports seen: past it, an attempt is
 * late. */
static uint64_t late_ms(const pl_confirm *cf)
{
    uint64_t ms = (cf->ack_srtt_ns + 4 * cf->ack_rttvar_ns) / 1000000 + 1;

    return ms < LATE_MIN_MS ? LATE_MIN_MS : ms > LATE_MAX_MS ? LATE_MAX_MS : ms;
}

static void learn(pl_confirm *cf, uint64_t ns)
{
    uint64_t d;

    if (ns > LATE_MAX_MS * 1000000ULL)
        ns = LATE_MAX_MS * 1000000ULL; /* no one sample weighs more */
    if (cf->ack_srtt_ns == 0) {
        cf->ack_srtt_ns = ns;
        cf->ack_rttvar_ns = ns / 2;
        return;
    }
    d = ns > cf->ack_srtt_ns ? ns - cf->ack_srtt_ns : cf->ack_srtt_ns - ns;
    cf->ack_rttvar_ns = (3 * cf->ack_rttvar_ns + d) / 4;
    cf->ack_srtt_ns = (7 * cf->ack_srtt_ns + ns) / 8;
}

/* Takes the attempt pl_engine_deliver() left pending in <d>: the
 * controller's connection is held, and its ACK learnt by the kernel's
 * report where its write asked for one, else by its next request (it
 * rides), by the loop's next turns (busy) or by asking now and then. */
static void attempt_begin(pl_confirm *cf, rec *r, const pl_delivery *d, uint64_t now)
{
    unsigned st, sw;
    int refused;

    r->w = d->waiter;
    r->controller = d->owner;
    r->waited_ms = d->waited_ms;
    r->written = now;
    /* Never later than the dispatch's own deadline. */
    r->late_at = now + late_ms(cf);
    if (r->late_at > r->deadline)
        r->late_at = r->deadline;
    r->late = r->overdue = r->swept = 0;
    r->left_at = 0;
    cf->io->set_owner(r->controller, r, &controller_owner);
    cf->io->hold(r->controller);
    st = cf->io->reports(r->controller);
    sw = st & 3;
    refused = (st & PL_CONN_REPORTS_REFUSED) != 0;
    if (refused && sw == SW_ON) {
        /* The kernel took the option but refused this write's request: no
         * report comes on this connection. Counted once. */
        cf->m->ack_events_refused++;
        sw = SW_RIDE;
        cf->io->set_reports(r->controller, sw);
    }
    if (sw == SW_SKIP)
        cf->io->set_reports(r->controller, SW_ON);
    if (st & PL_CONN_REPORT_DUE) {
        r->how = HOW_REPORT;
        r->sent_ns = NOW_NS(cf);
        r->look_at = UINT64_MAX;
    } else if (sw == SW_RIDE && !refused) {
        r->how = HOW_RIDE;
        r->look_at = now + RIDE_MS;
    } else if (busy(cf)) {
        r->how = HOW_SWEEP;
        r->look_at = UINT64_MAX; /* the turns look; then polled */
        fresh_join(cf, r);
        schedule(cf, r, now + SWEEP_WINDOW_MS < r->late_at ? now + SWEEP_WINDOW_MS : r->late_at);
        return;
    } else {
        /* no report: refused, or the write went out in pieces */
        r->how = HOW_POLL;
        r->look_at = now + 1;
    }
    schedule(cf, r, r->look_at < r->late_at ? r->look_at : r->late_at);
}

static void not_overdue(pl_confirm *cf, rec *r)
{
    if (r->overdue) {
        r->overdue = 0;
        cf->overdue--;
    }
}

/* Ends <r>: its dispatcher (if still there) hears <result>, and it is
 * freed. The attempt in hand, if any, was acknowledged. */
static void finish(pl_confirm *cf, rec *r, pl_dispatch_result result)
{
    size_t size;

    fresh_leave(cf, r);
    not_overdue(cf, r);
    if (r->w != NULL) {
        PL_ASSERT(result == PL_DISPATCH_HIT);
        pl_engine_confirm(cf->engine, r->w, PL_OUTCOME_MATCHED);
        cf->io->release(r->controller);
        r->w = NULL;
    }
    if (result == PL_DISPATCH_MISS && r->failed &&
        (r->last == PL_CONFIRM_UNACKNOWLEDGED || r->last == PL_CONFIRM_RESET_AFTER_SEND))
        result = PL_DISPATCH_UNCONFIRMED;
    if (r->dispatcher != NULL)
        cf->io->set_owner(r->dispatcher, NULL, NULL);
    cf->answer(cf->arg, r->dispatcher, &r->msg, r->note, result, r->waited_ms, r->start_ns);
    DL_DELETE(cf->recs, r);
    cf->nrecs--;
    /* With nothing left to watch the timer stops: left armed, it would cut
     * the loop's sleeps short as it counts down. */
    if (cf->recs == NULL && cf->armed != UINT64_MAX) {
        cf->armed = UINT64_MAX;
        cf->io->arm(cf->drv, UINT64_MAX);
    }
    size = rec_size(r); /* before the request it counts is freed */
    pl_buf_free(&r->request);
    pl_pool_free(r, size);
}

static void acked(pl_confirm *cf, rec *r, pl_confirm_method how)
{
    if (how == PL_CONFIRM_BY_ACK_EVENT) {
        uint64_t ns = NOW_NS(cf) - r->sent_ns;
        pl_histogram_observe(&cf->m->ack_seconds, (double)ns / 1e9);
        if (r->msg.payload_len <= LEARN_MAX_BYTES)
            learn(cf, ns);
    }
    /* A riding connection whose ACK had to be looked for stopped polling
     * again at once: its writes ask for reports again. */
    if (r->how == HOW_RIDE && how != PL_CONFIRM_BY_NEXT_REQUEST &&
        !(cf->io->reports(r->controller) & PL_CONN_REPORTS_REFUSED))
        cf->io->set_reports(r->controller, SW_ON);
    cf->m->method[how]++;
    cf->m->outcome[PL_CONFIRM_ACKED]++;
    finish(cf, r, PL_DISPATCH_HIT);
}

/* The attempt in hand failed (<why>): its connection is reset, so nothing
 * more of the run can reach that controller, and its waiter ends. */
static void attempt_fail(pl_confirm *cf, rec *r, pl_confirm_outcome why)
{
    pl_conn *c = r->controller;
    /* The controller ended it (or it failed) before anything could be
     * known: its doing. Otherwise the broker gave up on it. */
    int theirs = why == PL_CONFIRM_CLOSED_UNREAD || why == PL_CONFIRM_RESET_AFTER_SEND ||
                 (why == PL_CONFIRM_UNSENT && cf->io->ended(c) != 0);

    PL_LOG(PL_LOG_DEBUG, "delivery not confirmed", "\"outcome\":%d", (int)why);
    cf->m->outcome[why]++;
    r->last = why;
    r->failed = 1;
    fresh_leave(cf, r);
    not_overdue(cf, r);
    if (why == PL_CONFIRM_UNACKNOWLEDGED)
        cf->suspect_until = NOW(cf) + cf->opts.wait_max_ms;
    cf->io->set_owner(c, NULL, NULL);
    cf->io->abort(c);
    pl_engine_confirm(cf->engine, r->w, theirs ? PL_OUTCOME_DISCONNECT : PL_OUTCOME_ABORTED);
    r->w = NULL;
    r->controller = NULL;
}

/* Whether <r>'s dispatcher has gone (closed, or its FIN came): then its
 * run is offered to nobody. */
static int dispatcher_gone(const rec *r)
{
    return r->dispatcher == NULL || r->cf->io->peer_gone(r->dispatcher);
}

static int reoffer_vet(void *owner, uint64_t parked_at, void *arg)
{
    rec *r = arg;
    int v;

    if (dispatcher_gone(r))
        return PL_VET_STOP;
    if ((v = r->cf->poll_ok(r->cf->arg, owner, parked_at, &r->msg)) != PL_VET_OFFER)
        return v;
    return pl_confirm_vet(r->cf, owner);
}

/* After a failed attempt: the key's next poll, if the budget allows and
 * the dispatcher is still there; else the answer. */
static void reoffer(pl_confirm *cf, rec *r, uint64_t now)
{
    pl_delivery d = {.payload = &r->msg, .vet = reoffer_vet, .vet_arg = r};
    pl_engine_spot spot;
    int rc = 0;

    if (now < r->deadline && pl_engine_find(cf->engine, &r->msg.key, &spot) == 0)
        rc = pl_engine_deliver(cf->engine, &spot, now, &d);
    if (rc == PL_DELIVERY_PENDING) {
        cf->m->outcome[PL_CONFIRM_REDELIVERED]++;
        attempt_begin(cf, r, &d, now);
    } else if (rc == PL_DELIVERED) {
        /* delivery = written since a reload: its meaning of true */
        r->waited_ms = d.waited_ms;
        finish(cf, r, PL_DISPATCH_HIT);
    } else {
        finish(cf, r, rc == PL_DELIVERY_STOPPED ? PL_DISPATCH_ABANDONED : PL_DISPATCH_MISS);
    }
}

/* First time an attempt's ACK is overdue for its own path: the next polls
 * of its key are probed, and polls are vetted until it is decided. */
static void mark_overdue(pl_confirm *cf, rec *r);

static void probe_one(void *owner, void *arg)
{
    pl_confirm *cf = arg;

    cf->io->probe(owner);
    cf->m->probes++;
}

static void mark_overdue(pl_confirm *cf, rec *r)
{
    if (r->overdue)
        return;
    r->overdue = 1;
    cf->overdue++;
    pl_engine_each_in_key(cf->engine, &r->msg.key, PROBE_AHEAD, probe_one, cf);
}

/* What the kernel knows of the attempt in hand, as facts for the decision.
 * Returns 0, or a negative errno when it cannot be asked. */
static int gather(const rec *r, uint64_t now, pl_confirm_facts *f, pl_tcp_facts *t)
{
    const pl_confirm_io *io = r->cf->io;
    int end = io->ended(r->controller), rc;

    if ((rc = io->tcp_info(r->controller, t)) != 0)
        return rc;
    memset(f, 0, sizeof(*f));
    f->acked = t->unacked == 0;
    f->unsent = t->unsent > 0;
    f->fin = end == PL_CONN_END_EOF;
    f->reset = end == PL_CONN_END_RESET || (t->closed && end != PL_CONN_END_FAILED);
    f->gave_up = end == PL_CONN_END_FAILED;
    f->rtt_us = t->rtt_us;
    f->rttvar_us = t->rttvar_us;
    f->rto_us = t->rto_us;
    /* The last data segment to leave, unless retransmitted since, was the
     * run's last: a retransmission before the first look only makes this
     * later, the wait longer. */
    f->left_at = now > t->since_sent_ms ? now - t->since_sent_ms : 0;
    if (f->left_at < r->written)
        f->left_at = r->written;
    return 0;
}

/* How an acknowledgement found by asking the kernel was learnt: where a
 * report was due, by a late check; else by the looks that stand in for it. */
static pl_confirm_method look_method(const rec *r)
{
    if (r->how == HOW_REPORT)
        return PL_CONFIRM_BY_LATE_CHECK;
    return r->swept ? PL_CONFIRM_BY_NEXT_TURN : PL_CONFIRM_BY_POLL;
}

/* How soon to look again at an attempt no event will tell about: one
 * polled, one whose payload has not all left, one whose controller sent
 * its FIN (a reset may follow, unseen with reading stopped). */
static uint64_t recheck_ms(const pl_confirm_facts *f)
{
    uint64_t ms = f->rtt_us / 2000;

    return ms < 5 ? 5 : ms > 50 ? 50 : ms;
}

/* Asks the kernel and decides about <r>'s attempt. <final>: its connection
 * is being closed under it, so it cannot wait. */
static void decide(pl_confirm *cf, rec *r, uint64_t now, int final)
{
    pl_confirm_times times = {r->late_at, r->deadline, cf->opts.wait_max_ms, 0};
    pl_confirm_outcome why = PL_CONFIRM_ACKED;
    pl_confirm_action action;
    pl_confirm_facts f;
    pl_tcp_facts t;
    uint64_t until = 0;

    memset(&f, 0, sizeof(f));
    r->late = 1;
    if (gather(r, now, &f, &t) != 0) {
        /* Cannot be asked: as unknown as a reset after the payload left. */
        action = PL_CONFIRM_UNDECIDED;
        why = PL_CONFIRM_RESET_AFTER_SEND;
    } else {
        /* The first look that finds it all sent dates its departure: the
         * retransmissions that follow must not move the wait's end. */
        if (!f.unsent && r->left_at == 0)
            r->left_at = f.left_at;
        if (!f.unsent)
            f.left_at = r->left_at;
        times.others = f.unsent && pl_engine_waiting(cf->engine, &r->msg.key) > 0;
        action = pl_confirm_rule_decide(&f, &times, now, &until, &why);
        PL_LOG(PL_LOG_DEBUG, "delivery looked at",
               "\"action\":%d,\"unacked\":%u,\"unsent\":%u,\"fin\":%d,\"closed\":%d,"
               "\"rtt_us\":%u,\"rttvar_us\":%u,\"rto_us\":%u,\"since_sent_ms\":%u,"
               "\"wait_ms\":%llu,\"age_ms\":%llu",
               (int)action, t.unacked, t.unsent, f.fin, t.closed, t.rtt_us, t.rttvar_us,
               t.rto_us, t.since_sent_ms,
               (unsigned long long)pl_confirm_rule_wait_ms(&f, cf->opts.wait_max_ms),
               (unsigned long long)(now - r->written));
    }
    if (action == PL_CONFIRM_WAIT && final) {
        action = f.unsent ? PL_CONFIRM_RETRY : PL_CONFIRM_UNDECIDED;
        why = f.unsent ? PL_CONFIRM_UNSENT : PL_CONFIRM_UNACKNOWLEDGED;
    }
    switch (action) {
    case PL_CONFIRM_DELIVERED:
        acked(cf, r, look_method(r));
        return;
    case PL_CONFIRM_RETRY:
        attempt_fail(cf, r, why);
        if (final)
            finish(cf, r, PL_DISPATCH_MISS);
        else
            reoffer(cf, r, now);
        return;
    case PL_CONFIRM_UNDECIDED:
        attempt_fail(cf, r, why);
        finish(cf, r, PL_DISPATCH_MISS);
        return;
    case PL_CONFIRM_WAIT:
        break;
    }
    /* Overdue: past the time an ACK takes on this path, delayed ACK
     * included. Its key's other polls are probed meanwhile. */
    if (!f.unsent && !f.fin &&
        now >= f.left_at + (f.rtt_us + 4 * (uint64_t)f.rttvar_us) / 1000 + PL_CONFIRM_DELACK_MS)
        mark_overdue(cf, r);
    if (f.unsent || f.fin || r->how != HOW_REPORT) {
        uint64_t again = now + recheck_ms(&f);
        until = again < until ? again : until;
    } else if (!r->overdue) {
        uint64_t at = f.left_at + (f.rtt_us + 4 * (uint64_t)f.rttvar_us) / 1000 +
                      PL_CONFIRM_DELACK_MS;
        until = at < until ? at : until;
    }
    r->look_at = until;
    schedule(cf, r, until);
}

/* Looks at <r>: a polled attempt asks whether it is acknowledged; a late
 * one (or one whose controller ended it) is decided. */
static void look(pl_confirm *cf, rec *r, uint64_t now, int final)
{
    int state;

    if (final || r->late || now >= r->late_at || cf->io->ended(r->controller) != 0) {
        decide(cf, r, now, final);
        return;
    }
    if (r->how == HOW_SWEEP) {
        sweep_one(cf, r, now); /* the window's end, in a loop with nothing else to do */
        return;
    }
    if (r->how == HOW_REPORT || now < r->look_at) {
        schedule(cf, r, r->look_at < r->late_at ? r->look_at : r->late_at);
        return;
    }
    state = cf->io->acknowledged(r->controller);
    if (state == 0) {
        acked(cf, r, look_method(r));
        return;
    }
    if (state != -EAGAIN) {
        decide(cf, r, now, 0);
        return;
    }
    /* A riding controller is asked again each time its wait has doubled. */
    r->look_at = now + (r->how == HOW_RIDE ? now - r->written : 1);
    schedule(cf, r, r->look_at < r->late_at ? r->look_at : r->late_at);
}

/* ---- what happens to the connections ---- */

static void controller_event(void *obj, pl_conn *c, int ev, int arg)
{
    rec *r = obj;
    pl_confirm *cf = r->cf;

    if (ev == PL_CONN_EV_ACKED) {
        /* The report came with the controller's next request: it rides,
         * and its writes ask for no more reports. */
        if (arg)
            cf->io->set_reports(c, SW_RIDE);
        acked(cf, r, PL_CONFIRM_BY_ACK_EVENT);
    } else if (ev == PL_CONN_EV_DATA) {
        /* A request carries the ACK of what its sender had read: one sent
         * after reading the run (a client that waits for each answer) says
         * it was taken; one sent before (pipelined) does not, and waits. */
        if (cf->io->acknowledged(r->controller) == 0)
            acked(cf, r, PL_CONFIRM_BY_NEXT_REQUEST);
    } else if (ev == PL_CONN_EV_END) {
        look(cf, r, NOW(cf), 0);
    }
}

static void controller_closed(void *obj, pl_conn *c)
{
    rec *r = obj;

    (void)c;
    decide(r->cf, r, NOW(r->cf), 1);
}

static void dispatcher_closed(void *obj, pl_conn *c)
{
    rec *r = obj;

    (void)c;
    r->dispatcher = NULL;
}

/* ---- the set ---- */

int pl_confirm_vet(pl_confirm *cf, pl_conn *c)
{
    pl_tcp_facts t;

    if (!cf->opts.on || (cf->overdue == 0 && NOW(cf) >= cf->suspect_until))
        return PL_VET_OFFER;
    if (cf->io->tcp_info(c, &t) == 0 && t.probes > 0) {
        cf->m->skipped++;
        return PL_VET_SKIP;
    }
    return PL_VET_OFFER;
}

void pl_confirm_start(pl_confirm *cf, pl_conn *dispatcher, const pl_message *m,
                      const pl_delivery *d, uint64_t start_ns, uint32_t note)
{
    size_t dl = m->key.deployment_len, vl = m->key.version_len, pl = 0;
    uint64_t now = NOW(cf);
    pl_buf request = {0};
    rec *r;

    /* The payload is a view into the request's bytes: keeping them saves a
     * copy of it for every delivery. */
    if (cf->io->take_request(dispatcher, &request) != 0)
        pl = m->payload_len;
    r = pl_pool_alloc(sizeof(*r) + pl + dl + vl, NULL);
    if (r == NULL) {
        /* Written but cannot be watched: what delivery = written says. */
        pl_buf_free(&request);
        pl_engine_confirm(cf->engine, d->waiter, PL_OUTCOME_MATCHED);
        cf->answer(cf->arg, dispatcher, m, note, PL_DISPATCH_HIT, d->waited_ms, start_ns);
        return;
    }
    memset(r, 0, sizeof(*r));
    r->cf = cf;
    r->request = request;
    memcpy(r->data, m->payload, pl);
    memcpy(r->data + pl, m->key.deployment, dl);
    memcpy(r->data + pl + dl, m->key.version, vl);
    r->msg.key = m->key;
    r->msg.payload = request.data != NULL ? m->payload : r->data;
    r->msg.payload_len = m->payload_len;
    r->msg.key.deployment = r->data + pl;
    r->msg.key.version = r->data + pl + dl;
    r->dispatcher = dispatcher;
    r->start_ns = start_ns;
    r->note = note;
    r->deadline = now + cf->opts.timeout_ms;
    DL_PREPEND(cf->recs, r);
    cf->nrecs++;
    cf->io->set_owner(dispatcher, r, &dispatcher_owner);
    cf->io->hold_on_eof(dispatcher); /* it may half-close as it waits */
    attempt_begin(cf, r, d, now);
}


pl_confirm *pl_confirm_new(const pl_confirm_io *io, void *drv, pl_engine *engine,
                           pl_confirm_counters *counters, const pl_confirm_opts *opts,
                           pl_confirm_answer_fn answer, pl_confirm_poll_fn poll_ok, void *arg)
{
    pl_confirm *cf = pl_malloc(sizeof(*cf));

    if (cf == NULL)
        return NULL;
    memset(cf, 0, sizeof(*cf));
    cf->io = io;
    cf->drv = drv;
    cf->engine = engine;
    cf->m = counters;
    cf->opts = *opts;
    cf->answer = answer;
    cf->poll_ok = poll_ok;
    cf->arg = arg;
    cf->gap_ns = SWEEP_GAP_MAX_NS;
    cf->armed = UINT64_MAX;
    return cf;
}

void pl_confirm_set_opts(pl_confirm *cf, const pl_confirm_opts *opts)
{
    cf->opts = *opts;
}

/* ---- the broker's hooks ---- */

void pl_confirm_parked(pl_confirm *cf, pl_conn *c)
{
    unsigned sw = cf->io->reports(c) & 3;

    if (!cf->opts.on) {
        /* Nobody waits for its ACKs: its writes ask for none; should they
         * matter again (a reload), its next request brings them. */
        if (sw == SW_ON)
            cf->io->set_reports(c, SW_RIDE);
        return;
    }
    /* Once per connection: a riding one keeps riding. One whose kernel
     * refuses reports is counted, and left without. */
    if (sw == SW_NEW && cf->io->set_reports(c, SW_ON) != 0) {
        cf->m->ack_events_refused++;
        cf->io->set_reports(c, SW_RIDE);
    }
}

void pl_confirm_writing(pl_confirm *cf, pl_conn *c)
{
    unsigned r, sw;

    if (!cf->opts.on)
        return;
    r = cf->io->reports(c);
    sw = r & 3;
    /* A report wakes the loop on its own; a busy loop looks itself, on
     * turns that come anyway. */
    if (busy(cf) && sw == SW_ON)
        sw = SW_SKIP;
    /* A peer that may be in ping-pong mode ACKs a run of one segment only
     * when its delayed-ACK timer fires: the run goes as two segments, which
     * it ACKs as it reads (docs/notes/2026-12-05-soliciting-the-ack.md).
     * Riding ones too: their next request confirms the run as before, and
     * where that request does not come (the ride was a coincidence), the
     * first look finds the ACK, not a delayed-ACK timer 40 ms later. */
    if (r & PL_CONN_PEER_QUICK)
        cf->io->set_reports(c, sw | PL_CONN_SOLICIT);
    else if (sw != (r & 3))
        cf->io->set_reports(c, sw);
}

int pl_confirm_written(pl_confirm *cf)
{
    return cf->opts.on ? PL_SETTLE_PENDING : 0;
}

/* ---- the driver's ---- */

size_t pl_confirm_pending(const pl_confirm *cf)
{
    return cf->nrecs;
}

void pl_confirm_stop(pl_confirm *cf)
{
    uint64_t now = NOW(cf);

    while (cf->recs != NULL)
        decide(cf, cf->recs, now, 1);
}

void pl_confirm_free(pl_confirm *cf)
{
    pl_free(cf);
}
