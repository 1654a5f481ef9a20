/* test_engine_delivery.c -- a delivery's way through the engine: one left
 * pending until confirmed, the vet that skips or stops, the order in which
 * a key's polls are offered, and the invariant that stops a second answer. */
#include <signal.h>
#include <unistd.h>

#include <sys/wait.h>

#include "engine_fixture.h"

static void test_pending_delivery(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a, b;
    pl_waiter *wa, *wb;
    int payload = 7;
    uint64_t waited = 0, due;
    const pl_ledger *l = pl_engine_ledger(e);

    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    a.pending = b.pending = 1;
    CHECK_EQ(park_n(e, &KA, "a", 1, &a, 10, &wa), 0);
    CHECK_EQ(park_n(e, &KA, "b", 1, &b, 20, &wb), 0);
    CHECK_EQ(deliver(e, &KA, &payload, 50, &waited), PL_DELIVERY_PENDING);
    CHECK_EQ(waited, 40);
    CHECK_EQ(a.calls, 1);
    CHECK_EQ(l->parked_now, 2);             /* a is pending, b parked */
    CHECK_EQ(pl_engine_waiting(e, &KA), 1); /* but only b can be matched */
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 120);                     /* a left the time list */
    CHECK_EQ(pl_engine_expire(e, 115), 0);  /* nor can a time out */
    CHECK_EQ(a.calls, 1);
    pl_engine_confirm(e, wa, PL_OUTCOME_DISCONNECT); /* not acknowledged */
    CHECK_EQ(l->settled[PL_OUTCOME_DISCONNECT], 1);
    CHECK_EQ(l->parked_now, 1);
    CHECK_EQ(deliver(e, &KA, &payload, 60, &waited), PL_DELIVERY_PENDING);
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_confirm(e, wb, PL_OUTCOME_MATCHED);
    CHECK_EQ(l->settled[PL_OUTCOME_MATCHED], 1);
    CHECK_EQ(l->parked_now, 0);
    CHECK_EQ(l->parked_total, 2);
    CHECK_EQ(b.calls, 1);
    pl_engine_free(e);
}

/* Runs <fn> in a child; 1 when it was stopped by an invariant (SIGABRT). */
static int aborts(void (*fn)(void))
{
    int status = 0;
    pid_t pid = fork();

    if (pid == 0) {
        fclose(stderr); /* the invariant's report is expected */
        fn();
        _exit(0);
    }
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

static void settle_a_pending_waiter(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {.pending = 1};
    int payload = 1;

    park(e, &KA, "a", &a, 10);
    deliver(e, &KA, &payload, 20, NULL);
    pl_engine_settle(e, a.w, PL_OUTCOME_DISCONNECT); /* it is no longer parked */
}

static void confirm_a_parked_waiter(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {0};

    park(e, &KA, "a", &a, 10);
    pl_engine_confirm(e, a.w, PL_OUTCOME_MATCHED); /* nothing was delivered */
}

/* Exactly-once holds in release builds too: settling a waiter whose
 * delivery awaits confirmation, or confirming one still parked, would
 * answer a controller twice, and stops the process instead. */
static void test_invariants_stop_a_second_answer(void)
{
    CHECK(aborts(settle_a_pending_waiter));
    CHECK(aborts(confirm_a_parked_waiter));
}

/* The vet: skipped waiters stay parked and are offered, in order, only
 * when no other took the payload; a stop offers it to nobody. */
typedef struct {
    owner_t *skip[4];
    int stop_at;   /* stop when asked for the n-th time (1-based); 0: never */
    int asked;
    uint64_t pass_before; /* pass over those parked before this, for good */
} vet_t;

static int vet_cb(void *owner, uint64_t parked_at, void *arg)
{
    vet_t *v = arg;

    v->asked++;
    if (v->stop_at != 0 && v->asked == v->stop_at)
        return PL_VET_STOP;
    if (parked_at < v->pass_before)
        return PL_VET_PASS;
    for (int i = 0; i < 4; i++)
        if (v->skip[i] == owner)
            return PL_VET_SKIP;
    return PL_VET_OFFER;
}

/* A waiter passed over altogether is offered neither in the first round
 * nor in the second, and stays parked; the vet is told when each parked. */
static void test_vet_pass_is_for_good(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0};
    int payload = 5;
    vet_t v = {{&b}, 0, 0, 2};
    pl_delivery d = {.payload = &payload, .vet = vet_cb, .vet_arg = &v};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    /* a (parked at 1) is passed over, b skipped: b in the second round */
    CHECK_EQ(deliver_d(e, &KA, 10, &d), PL_DELIVERED);
    CHECK(d.owner == &b && a.calls == 0);
    /* a alone, passed over: nobody takes it, a stays */
    CHECK_EQ(deliver_d(e, &KA, 11, &d), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 1);
    pl_engine_free(e);
}

static void test_vet_skips_then_offers_the_skipped(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0};
    int payload = 3;
    vet_t v = {{&a, &b}, 0, 0, 0};
    pl_delivery d = {.payload = &payload, .vet = vet_cb, .vet_arg = &v};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 3), 0);
    /* a and b are passed over: c, the third in line, takes it */
    CHECK_EQ(deliver_d(e, &KA, 10, &d), PL_DELIVERED);
    CHECK_EQ(c.calls, 1);
    CHECK(d.owner == &c);
    CHECK_EQ(d.waited_ms, 7);
    CHECK_EQ(a.calls + b.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* only suspects left: the second round offers them in order */
    v.asked = 0;
    CHECK_EQ(deliver_d(e, &KA, 11, &d), PL_DELIVERED);
    CHECK(d.owner == &a);
    CHECK_EQ(b.calls, 0);
    /* a refusing suspect is settled and the next one offered */
    b.refuse = 1;
    CHECK_EQ(deliver_d(e, &KA, 12, &d), 0);
    CHECK_EQ(b.outcome, PL_OUTCOME_MATCHED);
    CHECK_EQ(pl_engine_ledger(e)->settled[PL_OUTCOME_DISCONNECT], 1);
    CHECK_EQ(pl_engine_key_count(e), 0);
    pl_engine_free(e);
}

static void test_vet_stop_offers_to_nobody(void)
{
    pl_engine *e = engine(PL_ORDER_LIFO, 0, 0, 0);
    owner_t a = {0}, b = {0};
    int payload = 4;
    vet_t v = {{NULL}, 1, 0, 0};
    pl_delivery d = {.payload = &payload, .vet = vet_cb, .vet_arg = &v};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    CHECK_EQ(deliver_d(e, &KA, 10, &d), PL_DELIVERY_STOPPED);
    CHECK_EQ(a.calls + b.calls, 0);
    CHECK(d.owner == NULL);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* lifo: the newest first, then back to the oldest */
    v.stop_at = 0;
    v.skip[0] = &b;
    CHECK_EQ(deliver_d(e, &KA, 11, &d), PL_DELIVERED);
    CHECK(d.owner == &a);
    pl_engine_free(e);
}

static void collect_owner(void *owner, void *arg)
{
    owner_t **out = arg;

    while (*out != NULL)
        out++;
    *out = owner;
}

static void test_each_in_key_in_match_order(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0}, b = {0}, c = {0}, x = {0};
    owner_t *seen[5] = {NULL};

    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KB, "x", &x, 2), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 3), 0);
    CHECK_EQ(park(e, &KA, "c", &c, 4), 0);
    CHECK_EQ(pl_engine_each_in_key(e, &KA, 2, collect_owner, seen), 2);
    CHECK(seen[0] == &a && seen[1] == &b && seen[2] == NULL);
    memset(seen, 0, sizeof(seen));
    CHECK_EQ(pl_engine_each_in_key(e, &KC, 8, collect_owner, seen), 0);
    pl_engine_free(e);
    e = engine(PL_ORDER_LIFO, 0, 0, 0);
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 2), 0);
    memset(seen, 0, sizeof(seen));
    CHECK_EQ(pl_engine_each_in_key(e, &KA, 8, collect_owner, seen), 2);
    CHECK(seen[0] == &b && seen[1] == &a);
    pl_engine_free(e);
}

/* A pending delivery the broker gave up on ends as aborted: counted apart
 * from a client's disconnect, and the ledger still adds up. */
static void test_pending_delivery_aborted(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t a = {0};
    int payload = 5;
    pl_delivery d = {.payload = &payload};
    const pl_ledger *l = pl_engine_ledger(e);

    a.pending = 1;
    CHECK_EQ(park(e, &KA, "a", &a, 1), 0);
    CHECK_EQ(deliver_d(e, &KA, 2, &d), PL_DELIVERY_PENDING);
    CHECK(d.waiter == a.w && d.owner == &a);
    pl_engine_confirm(e, d.waiter, PL_OUTCOME_ABORTED);
    CHECK_EQ(l->settled[PL_OUTCOME_ABORTED], 1);
    CHECK_EQ(l->settled[PL_OUTCOME_DISCONNECT], 0);
    CHECK_EQ(l->parked_now, 0);
    CHECK_STR(pl_outcome_name(PL_OUTCOME_ABORTED), "aborted");
    pl_engine_free(e);
}

int main(void)
{
    RUN(test_pending_delivery);
    RUN(test_invariants_stop_a_second_answer);
    RUN(test_vet_skips_then_offers_the_skipped);
    RUN(test_vet_stop_offers_to_nobody);
    RUN(test_vet_pass_is_for_good);
    RUN(test_each_in_key_in_match_order);
    RUN(test_pending_delivery_aborted);
    return unit_finish();
}
