/* test_confirm_rule.c -- the delivery-confirmation rule alone: facts and times
 * in, an action out (pl_confirm_rule_decide), and the wait it gives a
 * controller whose whole payload is in flight (pl_confirm_rule_wait_ms). */
#include <stdint.h>
#include <stdio.h>

#include "pilotlight/confirm_rule.h"
#include "unit.h"

enum { WAIT = PL_CONFIRM_WAIT, TRUE_ = PL_CONFIRM_DELIVERED, RETRY = PL_CONFIRM_RETRY,
       UNDECIDED = PL_CONFIRM_UNDECIDED };

/* A path of 20 ms round trip (5 ms variation) and a 220 ms RTO: the wait
 * is 3 x (20 + 4 x 5 + 220) + 2 x 200 = 1180 ms. */
#define RTT 20000
#define RTTVAR 5000
#define RTO 220000
#define W 1180

/* Times of every case: written at 1000, late at 1050, deadline at 3000. */
#define LATE 1050
#define DEADLINE 3000
#define LEFT 1000

typedef struct {
    const char *name;
    /* facts */
    int acked, unsent, fin, reset, gave_up;
    /* another poll waits */
    int others;
    uint64_t now;
    /* expected */
    int action;
    pl_confirm_outcome why; /* for every action but WAIT */
    uint64_t until;         /* for WAIT */
} row;

static const row rows[] = {
    /* acknowledged: true, whatever else is known */
    {"acked", 1, 0, 0, 0, 0, 0, 1001, TRUE_, PL_CONFIRM_ACKED, 0},
    {"acked, then reset", 1, 0, 0, 1, 0, 1, 1001, TRUE_, PL_CONFIRM_ACKED, 0},
    {"acked by its FIN", 1, 0, 1, 0, 0, 0, 5000, TRUE_, PL_CONFIRM_ACKED, 0},
    /* part of it never left: safe to take back, when worth it */
    {"unsent, alone, waits for the budget", 0, 1, 0, 0, 0, 0, 1060, WAIT, 0, DEADLINE},
    {"unsent, another waits, not late yet", 0, 1, 0, 0, 0, 1, 1010, WAIT, 0, LATE},
    {"unsent, another waits, late", 0, 1, 0, 0, 0, 1, LATE, RETRY, PL_CONFIRM_UNSENT, 0},
    {"unsent, budget spent", 0, 1, 0, 0, 0, 0, DEADLINE, RETRY, PL_CONFIRM_UNSENT, 0},
    {"unsent, reset", 0, 1, 0, 1, 0, 0, 1001, RETRY, PL_CONFIRM_UNSENT, 0},
    {"unsent, FIN", 0, 1, 1, 0, 0, 0, 1001, RETRY, PL_CONFIRM_UNSENT, 0},
    {"unsent, the kernel gave up", 0, 1, 0, 0, 1, 0, 1001, RETRY, PL_CONFIRM_UNSENT, 0},
    /* all of it left */
    {"in flight: waits its connection's time", 0, 0, 0, 0, 0, 0, 1100, WAIT, 0, LEFT + W},
    {"in flight, another waits: still waits", 0, 0, 0, 0, 0, 1, 2000, WAIT, 0, LEFT + W},
    {"in flight past the budget: still waits", 0, 0, 0, 0, 0, 1, LEFT + W - 1, WAIT, 0,
     LEFT + W},
    {"in flight, the wait is over", 0, 0, 0, 0, 0, 1, LEFT + W, RETRY,
     PL_CONFIRM_UNACKNOWLEDGED, 0},
    {"FIN that did not ack it: waits", 0, 0, 1, 0, 0, 1, 1500, WAIT, 0, LEFT + W},
    {"FIN, then a reset: closed before it came", 0, 0, 1, 1, 0, 1, 1001, RETRY,
     PL_CONFIRM_CLOSED_UNREAD, 0},
    {"reset after it all left", 0, 0, 0, 1, 0, 1, 1001, UNDECIDED,
     PL_CONFIRM_RESET_AFTER_SEND, 0},
    {"reset after it all left, budget spent", 0, 0, 0, 1, 0, 0, 9000, UNDECIDED,
     PL_CONFIRM_RESET_AFTER_SEND, 0},
    {"the kernel gave up early: waits anyway", 0, 0, 0, 0, 1, 1, 1500, WAIT, 0, LEFT + W},
    {"the kernel gave up, wait over", 0, 0, 0, 0, 1, 1, LEFT + W, RETRY,
     PL_CONFIRM_UNACKNOWLEDGED, 0},
};

static void test_table(void)
{
    pl_confirm_times t = {LATE, DEADLINE, 10000, 0};

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const row *r = &rows[i];
        pl_confirm_facts f = {r->acked, r->unsent, r->fin, r->reset, r->gave_up,
                              RTT, RTTVAR, RTO, LEFT};
        pl_confirm_outcome why = PL_CONFIRM__COUNT;
        uint64_t until = 0;
        int got;

        t.others = r->others;
        got = (int)pl_confirm_rule_decide(&f, &t, r->now, &until, &why);
        if (got != r->action)
            fprintf(stderr, "case \"%s\"\n", r->name);
        CHECK_EQ(got, r->action);
        if (r->action == WAIT)
            CHECK_EQ(until, r->until);
        else
            CHECK_EQ(why, r->why);
    }
}

static void test_wait(void)
{
    pl_confirm_facts f = {0};

    f.rtt_us = RTT;
    f.rttvar_us = RTTVAR;
    f.rto_us = RTO;
    CHECK_EQ(pl_confirm_rule_wait_ms(&f, 10000), W);
    /* capped */
    CHECK_EQ(pl_confirm_rule_wait_ms(&f, 500), 500);
    /* loopback: Linux's smallest RTO, 200 ms */
    f.rtt_us = 50;
    f.rttvar_us = 25;
    f.rto_us = 200000;
    CHECK_EQ(pl_confirm_rule_wait_ms(&f, 10000), 3 * 200 + 1 + 400);
    /* unknown: Linux's first RTO */
    f.rtt_us = f.rttvar_us = f.rto_us = 0;
    CHECK_EQ(pl_confirm_rule_wait_ms(&f, 10000), 3400);
}

/* Over paths from loopback to a far region, the wait covers the ACK of the
 * second retransmission of a segment whose tail-loss probe was lost too:
 * probe at 2 x rtt + 200 ms (one segment in flight), retransmissions at
 * rto and 2 x rto after it, the ACK a round trip later, plus a delayed ACK
 * on the data. */
static void test_wait_covers_two_retransmissions(void)
{
    for (uint32_t rtt = 50; rtt <= 400000; rtt = rtt * 2 + 7) {
        pl_confirm_facts f = {0};
        uint64_t rto = rtt + (rtt > 50000 ? rtt : 200000); /* srtt + max(4 var, 200 ms) */
        uint64_t pto = 2 * (uint64_t)rtt + 200000;
        uint64_t need_us = pto + 3 * rto + rtt + PL_CONFIRM_DELACK_MS * 1000;

        f.rtt_us = rtt;
        f.rttvar_us = rtt / 4;
        f.rto_us = (uint32_t)rto;
        CHECK(pl_confirm_rule_wait_ms(&f, UINT64_MAX) * 1000 >= need_us);
    }
}

/* A payload is never taken back while whole and in flight: for every time
 * before the wait's end, with or without other polls, past the deadline or
 * not, the answer is to wait. */
static void test_never_retry_in_flight_before_the_wait(void)
{
    pl_confirm_facts f = {0, 0, 0, 0, 0, RTT, RTTVAR, RTO, LEFT};
    pl_confirm_times t = {LATE, DEADLINE, 10000, 1};

    for (uint64_t now = LEFT; now < LEFT + W; now += 7) {
        pl_confirm_outcome why;
        uint64_t until;
        for (int fin = 0; fin <= 1; fin++)
            for (int gave_up = 0; gave_up <= 1; gave_up++) {
                f.fin = (uint8_t)fin;
                f.gave_up = (uint8_t)gave_up;
                CHECK_EQ(pl_confirm_rule_decide(&f, &t, now, &until, &why), PL_CONFIRM_WAIT);
            }
    }
}

int main(void)
{
    RUN(test_table);
    RUN(test_wait);
    RUN(test_wait_covers_two_retransmissions);
    RUN(test_never_retry_in_flight_before_the_wait);
    return unit_finish();
}
