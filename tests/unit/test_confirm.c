/* test_confirm.c -- delivery = confirm's records alone: a fake table of
 * connections and a fake clock drive the machine (confirm.h), a real
 * engine holds the polls. How each ACK is learnt (report, next request,
 * the loop's next turns, a look now and then), what a stuck or vanished
 * controller costs, and that nothing one connection teaches can make
 * another wait past the documented bound. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/confirm.h"
#include "pilotlight/engine.h"
#include "unit.h"

/* ---- a fake connection ---- */

typedef struct {
    int used;
    pl_conn_owner *ops;  /* its owner, as confirm set it */
    void *obj;
    int held, released, aborted, eof_holds, probes;
    unsigned sw;         /* the switch's value */
    int due;             /* the last write asked for a report */
    int refused;         /* the kernel refuses reports */
    int quick;           /* PL_CONN_PEER_QUICK */
    int solicit;         /* PL_CONN_SOLICIT, as set */
    int solicited;       /* runs written with it */
    int unsent, unacked; /* what TCP_INFO would say of its last write */
    int ended;           /* PL_CONN_END_* */
    int gone;            /* a dispatcher's end waits in its socket */
    int writes;          /* runs written to it */
    int probes_unanswered;
    uint32_t rtt_us;
} fconn;

#define NCONNS 16
static fconn conns[NCONNS];
static uint64_t now_ms = 1000, armed = UINT64_MAX;
static int turning;

static pl_conn *as_conn(fconn *f)
{
    return (pl_conn *)(void *)f;
}

static fconn *of(pl_conn *c)
{
    return (fconn *)(void *)c;
}

static int f_acknowledged(pl_conn *c)
{
    return of(c)->unacked ? -EAGAIN : 0;
}

static int f_tcp_info(pl_conn *c, pl_tcp_facts *t)
{
    fconn *f = of(c);

    memset(t, 0, sizeof(*t));
    t->unacked = f->unacked ? 1000 : 0;
    t->unsent = f->unsent ? 1000 : 0;
    t->rtt_us = f->rtt_us;
    t->rttvar_us = f->rtt_us / 4;
    t->rto_us = 200000 + f->rtt_us;
    t->probes = (uint8_t)f->probes_unanswered;
    return 0;
}

static void f_probe(pl_conn *c)
{
    of(c)->probes++;
}

static int f_ended(pl_conn *c)
{
    return of(c)->ended;
}

static int f_peer_gone(pl_conn *c)
{
    return of(c)->gone;
}

static void f_hold(pl_conn *c)
{
    of(c)->held = 1;
}

static void f_hold_on_eof(pl_conn *c)
{
    of(c)->eof_holds = 1;
}

static void f_release(pl_conn *c)
{
    of(c)->held = 0;
    of(c)->released++;
    of(c)->ops = NULL;
}

static void f_abort(pl_conn *c)
{
    of(c)->aborted = 1;
}

static void f_set_owner(pl_conn *c, void *obj, pl_conn_owner *ops)
{
    of(c)->obj = obj;
    of(c)->ops = obj != NULL ? ops : NULL;
}

static int f_take_request(pl_conn *c, pl_buf *out)
{
    (void)c, (void)out;
    return -ENOENT; /* the payload is copied */
}

static int f_set_reports(pl_conn *c, unsigned v)
{
    of(c)->sw = v & 3;
    of(c)->solicit = (v & PL_CONN_SOLICIT) != 0;
    return v == PL_CONN_REPORTS_ON && of(c)->refused ? -EOPNOTSUPP : 0;
}

static unsigned f_reports(pl_conn *c)
{
    fconn *f = of(c);

    return f->sw | (f->due ? PL_CONN_REPORT_DUE : 0) | (f->refused ? PL_CONN_REPORTS_REFUSED : 0) |
           (f->quick ? PL_CONN_PEER_QUICK : 0) | (f->solicit ? PL_CONN_SOLICIT : 0);
}

static uint64_t f_now(void *drv)
{
    (void)drv;
    return now_ms;
}

static uint64_t ns_extra;
static uint64_t f_now_ns(void *drv)
{
    (void)drv;
    return now_ms * 1000000ULL + ns_extra;
}

static void f_arm(void *drv, uint64_t due)
{
    (void)drv;
    armed = due;
}

static void f_turns(void *drv, int on)
{
    (void)drv;
    turning = on;
}

static const pl_confirm_io io = {
    f_acknowledged, f_tcp_info, f_probe, f_ended, f_peer_gone, f_hold, f_hold_on_eof,
    f_release, f_abort, f_set_owner, f_take_request, f_set_reports, f_reports,
    f_now, f_now_ns, f_arm, f_turns,
};

/* ---- the broker around it ---- */

static pl_engine *engine;
static pl_confirm *cf;
static pl_confirm_counters counters;
static const pl_key KA = {"dep-a", 5, "v1", 2, 1, 1024};
static int answers, last_result = -1;
static pl_conn *last_dispatcher;
static uint32_t last_note;

static void answer(void *arg, pl_conn *d, const pl_message *m, uint32_t note,
                   pl_dispatch_result result, uint64_t waited, uint64_t start)
{
    (void)arg, (void)waited, (void)start;
    /* the run answered for comes back, its key copied: the status page's */
    CHECK(m != NULL && m->key.deployment_len == KA.deployment_len &&
          memcmp(m->key.deployment, KA.deployment, KA.deployment_len) == 0);
    answers++;
    last_result = (int)result;
    last_dispatcher = d;
    last_note = note;
}

static int poll_ok(void *arg, void *owner, uint64_t parked_at, const pl_message *m)
{
    (void)arg, (void)owner, (void)parked_at, (void)m;
    return PL_VET_OFFER;
}

/* The engine's settle callback, as the broker's: a match is written. */
static int settle(void *owner, pl_outcome outcome, const void *arg)
{
    fconn *f = owner;

    (void)arg;
    if (outcome != PL_OUTCOME_MATCHED)
        return 0;
    pl_confirm_writing(cf, as_conn(f));
    f->writes++;
    f->solicited += f->solicit;
    f->solicit = 0; /* used up by the write */
    f->unacked = 1;
    f->due = f->sw == PL_CONN_REPORTS_ON && !f->refused;
    return pl_confirm_written(cf);
}


static fconn *conn_new(void)
{
    for (int i = 0; i < NCONNS; i++)
        if (!conns[i].used) {
            memset(&conns[i], 0, sizeof(conns[i]));
            conns[i].used = 1;
            conns[i].rtt_us = 1000;
            return &conns[i];
        }
    return NULL;
}

static void setup(int on)
{
    pl_engine_opts eo = {PL_ORDER_FIFO, 0, 0, 600000, settle};
    pl_confirm_opts co = {on, 2000, 3000};

    memset(conns, 0, sizeof(conns));
    memset(&counters, 0, sizeof(counters));
    now_ms = 1000;
    ns_extra = 0;
    armed = UINT64_MAX;
    turning = 0;
    answers = 0;
    last_result = -1;
    engine = pl_engine_new(&eo);
    cf = pl_confirm_new(&io, NULL, engine, &counters, &co, answer, poll_ok, NULL);
    CHECK(engine != NULL && cf != NULL);
}

static void teardown(void)
{
    pl_confirm_stop(cf);
    pl_confirm_free(cf);
    pl_engine_free(engine);
}

/* A poll parked on <f> (the broker's hold_waiter). */
static void park(fconn *f, const char *id)
{
    pl_engine_spot spot;
    pl_waiter *w;

    pl_engine_find(engine, &KA, &spot);
    CHECK_EQ(pl_engine_park(engine, &spot, id, strlen(id), f, now_ms, &w), 0);
    pl_confirm_parked(cf, as_conn(f));
}

/* A dispatch from <d>: returns what pl_engine_deliver() did. */
static int dispatch(fconn *d)
{
    static const char body[] = "{\"run\":1}";
    pl_message m = {KA, body, sizeof(body) - 1, NULL};
    pl_delivery del = {.payload = &m};
    pl_engine_spot spot;
    int rc;

    pl_confirm_note_dispatch(cf);
    pl_engine_find(engine, &KA, &spot);
    rc = pl_engine_deliver(engine, &spot, now_ms, &del);
    if (rc == PL_DELIVERY_PENDING)
        pl_confirm_start(cf, as_conn(d), &m, &del, now_ms * 1000000ULL, 0x5eed);
    return rc;
}

/* Time passes: the driver ticks the machine when asked, as a loop does
 * (a timer due now runs on the next turn, a millisecond on at least). */
static void advance(uint64_t ms)
{
    uint64_t end = now_ms + ms;

    while (armed != UINT64_MAX && armed <= end) {
        now_ms = armed > now_ms ? armed : now_ms + 1;
        if (now_ms > end)
            break;
        pl_confirm_tick(cf);
    }
    now_ms = end;
}

static void event(fconn *f, int ev, int arg)
{
    CHECK(f->ops != NULL);
    if (f->ops != NULL)
        f->ops->on_event(f->obj, as_conn(f), ev, arg);
}

/* ---- tests ---- */

/* A report: true at once, learnt by the report; its connection let go. */
static void test_report(void)
{
    setup(1);
    fconn *c = conn_new(), *d = conn_new();
    park(c, "a");
    CHECK_EQ(c->sw, PL_CONN_REPORTS_ON);
    CHECK_EQ(dispatch(d), PL_DELIVERY_PENDING);
    CHECK(c->held && c->due && answers == 0);
    c->unacked = 0;
    c->due = 0;
    event(c, PL_CONN_EV_ACKED, 0);
    CHECK(answers == 1 && last_result == PL_DISPATCH_HIT && last_dispatcher == as_conn(d));
    CHECK_EQ(last_note, 0x5eed); /* the caller's word, handed back */
    CHECK_EQ(counters.method[PL_CONFIRM_BY_ACK_EVENT], 1);
    CHECK(c->released == 1 && !c->held && c->sw == PL_CONN_REPORTS_ON);
    CHECK_EQ(pl_confirm_pending(cf), 0);
    CHECK_EQ(armed, UINT64_MAX); /* nothing left to look at */
    teardown();
}

/* A report that came with the controller's next request: it rides. Its
 * next run asks for no report, and its next request confirms it; one that
 * then says nothing is looked for, and its writes ask for reports again. */
static void test_ride(void)
{
    setup(1);
    fconn *c = conn_new(), *d = conn_new();
    park(c, "a");
    dispatch(d);
    c->unacked = c->due = 0;
    event(c, PL_CONN_EV_ACKED, 1);
    CHECK(c->sw != PL_CONN_REPORTS_ON && answers == 1);
    park(c, "a");                   /* the request it came with */
    CHECK(c->sw != PL_CONN_REPORTS_ON); /* still riding */
    dispatch(d);
    CHECK(!c->due);
    c->unacked = 0;
    event(c, PL_CONN_EV_DATA, 0);   /* its next request, with the ACK */
    CHECK(answers == 2 && last_result == PL_DISPATCH_HIT);
    CHECK_EQ(counters.method[PL_CONFIRM_BY_NEXT_REQUEST], 1);
    park(c, "a");
    dispatch(d);                    /* ... and this time it says nothing */
    advance(5);
    CHECK_EQ(answers, 2);
    c->unacked = 0;
    advance(200);
    CHECK(answers == 3 && last_result == PL_DISPATCH_HIT);
    CHECK_EQ(counters.method[PL_CONFIRM_BY_POLL], 1);
    CHECK_EQ(c->sw, PL_CONN_REPORTS_ON); /* asks for reports again */
    teardown();
}

/* A busy broker: the write asks for no report, the loop's next turns look
 * instead, and the switch is back on after. */
static void test_busy_sweeps(void)
{
    setup(1);
    fconn *c = conn_new(), *d = conn_new();
    park(c, "a");
    for (int i = 0; i < 40; i++) { /* dispatches 100 us apart */
        ns_extra += 100000;
        pl_confirm_note_dispatch(cf);
    }
    dispatch(d);
    CHECK(!c->due && turning && c->sw == PL_CONN_REPORTS_ON);
    pl_confirm_turn(cf); /* its own turn: not looked at yet */
    CHECK_EQ(answers, 0);
    c->unacked = 0;
    pl_confirm_turn(cf);
    CHECK(answers == 1 && last_result == PL_DISPATCH_HIT && !turning);
    CHECK_EQ(counters.method[PL_CONFIRM_BY_NEXT_TURN], 1);
    teardown();
}

/* Reports refused by the kernel: counted once, and the ACK is looked for. */
static void test_refused(void)
{
    setup(1);
    fconn *c = conn_new(), *d = conn_new();
    c->refused = 1;
    park(c, "a");
    CHECK_EQ(counters.ack_events_refused, 1);
    dispatch(d);
    c->unacked = 0;
    advance(2);
    CHECK(answers == 1 && last_result == PL_DISPATCH_HIT);
    CHECK_EQ(counters.method[PL_CONFIRM_BY_POLL], 1);
    teardown();
}

/* A run stuck behind a controller that does not take it (never sent) moves
 * to the live poll behind it once late, and that one has it. */
static void test_stuck_moves_on(uint64_t *moved_after)
{
    fconn *stuck = conn_new(), *live = conn_new(), *d = conn_new();
    uint64_t t0 = now_ms;

    park(stuck, "stuck");
    park(live, "live");
    dispatch(d);
    CHECK(stuck->writes == 1 && live->writes == 0);
    stuck->unsent = 1;
    while (live->writes == 0 && now_ms < t0 + 5000)
        advance(1);
    *moved_after = now_ms - t0;
    CHECK(stuck->aborted && live->writes == 1);
    live->unacked = live->due = 0;
    event(live, PL_CONN_EV_ACKED, 0);
    CHECK(answers >= 1 && last_result == PL_DISPATCH_HIT);
    CHECK_EQ(counters.outcome[PL_CONFIRM_REDELIVERED], 1);
}

/* A controller that never reads: false, within the documented bound
 * (confirm_timeout_ms + confirm_wait_max_ms). */
static uint64_t never_read(void)
{
    fconn *c = conn_new(), *d = conn_new();
    uint64_t t0 = now_ms;

    park(c, "deaf");
    dispatch(d);
    c->unsent = 1;
    while (answers == 0 && now_ms < t0 + 60000)
        advance(10);
    CHECK(answers == 1 && last_result == PL_DISPATCH_MISS);
    return now_ms - t0;
}

/* Whatever slow readers teach (ten runs that take 1.5 s to go out whole
 * and be acknowledged), a stuck run still moves to the live poll soon, and
 * a controller that never reads is still answered within the bound. */
static void test_slow_readers_teach_nothing_harmful(void)
{
    uint64_t fresh_move, trained_move, bound;

    setup(1);
    test_stuck_moves_on(&fresh_move);
    teardown();

    setup(1);
    for (int i = 0; i < 10; i++) {
        fconn *c = conn_new(), *d = conn_new();
        park(c, "slow");
        dispatch(d);
        c->unsent = 1; /* its window closed: the run goes out slowly */
        advance(1500);
        c->unsent = c->unacked = c->due = 0;
        event(c, PL_CONN_EV_ACKED, 0);
        c->used = d->used = 0;
    }
    CHECK_EQ(answers, 10);
    answers = 0;
    test_stuck_moves_on(&trained_move);
    answers = 0;
    bound = never_read();
    teardown();
    fprintf(stderr, "  stuck run moved after %llu ms fresh, %llu ms trained; "
                    "never-reader answered after %llu ms\n",
            (unsigned long long)fresh_move, (unsigned long long)trained_move,
            (unsigned long long)bound);
    CHECK(fresh_move <= 60);
    CHECK(trained_move <= 260);
    CHECK(bound <= 2000 + 3000);
}

/* A dispatcher gone before the run could move on: offered to nobody. */
static void test_gone_dispatcher(void)
{
    setup(1);
    fconn *stuck = conn_new(), *live = conn_new(), *d = conn_new();
    park(stuck, "stuck");
    park(live, "live");
    dispatch(d);
    stuck->unsent = 1;
    d->gone = 1;
    advance(300);
    CHECK(answers == 1 && last_result == PL_DISPATCH_ABANDONED);
    CHECK(live->writes == 0);
    teardown();
}

/* The controller's connection closes with its run all sent, unacknowledged:
 * false, never offered again (it may have it). */
static void test_closed_under_it(void)
{
    setup(1);
    fconn *c = conn_new(), *next = conn_new(), *d = conn_new();
    park(c, "a");
    park(next, "b");
    dispatch(d);
    c->ops->on_close(c->obj, as_conn(c));
    CHECK(answers == 1 && last_result == PL_DISPATCH_UNCONFIRMED);
    CHECK(next->writes == 0);
    teardown();
}

/* A peer that may be in ping-pong mode has its run written so that it
 * ACKs at once (PL_CONN_SOLICIT), one whose ACKs ride its next request
 * too (without a report: the request, or the first look, confirms it);
 * one that never replied quickly has not. */
static void test_solicit(void)
{
    setup(1);
    fconn *c = conn_new(), *d = conn_new();
    park(c, "a");
    dispatch(d);
    CHECK_EQ(c->solicited, 0); /* no quick reply seen */
    c->unacked = c->due = 0;
    event(c, PL_CONN_EV_ACKED, 0);
    c->quick = 1;
    park(c, "a");
    dispatch(d);
    CHECK(c->solicited == 1 && c->due); /* solicited, and reported */
    c->unacked = c->due = 0;
    event(c, PL_CONN_EV_ACKED, 1);     /* it came with a request: rides */
    park(c, "a");
    dispatch(d);
    CHECK(c->solicited == 2 && !c->due); /* solicited, not reported */
    c->unacked = 0;
    event(c, PL_CONN_EV_DATA, 0);
    CHECK(answers == 3 && last_result == PL_DISPATCH_HIT);
    CHECK_EQ(counters.method[PL_CONFIRM_BY_NEXT_REQUEST], 1);
    park(c, "a");
    dispatch(d);                       /* riding, and no request comes */
    CHECK(c->solicited == 3 && !c->due);
    c->unacked = 0;                    /* its ACK left as it read */
    advance(3);
    CHECK(answers == 4 && last_result == PL_DISPATCH_HIT); /* the first look */
    CHECK_EQ(counters.method[PL_CONFIRM_BY_POLL], 1);
    teardown();
    setup(0); /* written: never */
    c = conn_new();
    d = conn_new();
    c->quick = 1;
    park(c, "a");
    dispatch(d);
    CHECK_EQ(c->solicited, 0);
    teardown();
}

/* delivery = written: every hook does nothing; a run written is true. */
static void test_written_mode(void)
{
    setup(0);
    fconn *c = conn_new(), *d = conn_new();
    park(c, "a");
    CHECK_EQ(c->sw, 0);
    CHECK_EQ(dispatch(d), PL_DELIVERED);
    CHECK(!c->held && !c->due && answers == 0 && armed == UINT64_MAX);
    CHECK_EQ(pl_confirm_vet(cf, as_conn(c)), PL_VET_OFFER);
    teardown();
}

int main(void)
{
    RUN(test_report);
    RUN(test_ride);
    RUN(test_busy_sweeps);
    RUN(test_refused);
    RUN(test_slow_readers_teach_nothing_harmful);
    RUN(test_gone_dispatcher);
    RUN(test_closed_under_it);
    RUN(test_written_mode);
    RUN(test_solicit);
    return unit_finish();
}
