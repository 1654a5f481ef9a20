/* test_engine_handover.c -- a binary upgrade's side of the engine: waiters
 * handed between two engines, held while they go, adopted per tenant; and
 * options changed live (caps, order). */
#include "engine_fixture.h"

/* ---- binary upgrade: hand-over between two engines; live options -------- */

typedef struct {
    pl_waiter_info info[16];
    char ids[16][16];
    char deps[16][16];
    size_t n;
} collected;

static void collect(const pl_waiter_info *info, void *arg)
{
    collected *c = arg;

    if (c->n >= 16)
        return;
    c->info[c->n] = *info;
    snprintf(c->ids[c->n], 16, "%s", info->id);
    snprintf(c->deps[c->n], 16, "%.*s", (int)info->key.deployment_len, info->key.deployment);
    c->n++;
}

static int balanced_with_adopted(const pl_ledger *l)
{
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        sum += l->settled[i];
    return sum == l->parked_total + l->adopted;
}

static void test_hand_over_between_engines(void)
{
    pl_engine *old = engine(PL_ORDER_FIFO, 0, 0, 100), *neu = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a[5] = {{0}}, b[5] = {{0}};
    const pl_key *keys[5] = {&KA, &KB, &KA, &KC, &KA};
    char id[32];
    collected c = {.n = 0};
    int payload = 7;

    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "ctl-%d", i);
        CHECK_EQ(park(old, keys[i], id, &a[i], 10 + (uint64_t)i), 0);
    }
    CHECK_EQ(pl_engine_each_waiter(old, collect, &c), 5);
    for (size_t i = 0; i < c.n; i++) {
        pl_key k = c.info[i].key;
        snprintf(id, sizeof(id), "ctl-%zu", i);
        CHECK_STR(c.ids[i], id); /* oldest first */
        CHECK(c.info[i].owner == &a[i] && c.info[i].w == a[i].w);
        CHECK_EQ(c.info[i].parked_at, 10 + i);
        k.deployment = c.deps[i];
        CHECK_EQ(pl_engine_adopt(neu, &k, c.ids[i], strlen(c.ids[i]), &b[i],
                                 c.info[i].parked_at, &b[i].w), 0);
    }
    /* the same controller id cannot be adopted twice */
    owner_t dup = {0};
    CHECK_EQ(pl_engine_adopt(neu, &KA, "ctl-0", 5, &dup, 50, &dup.w), PL_EEXIST);
    CHECK(dup.w == NULL && dup.calls == 0);
    for (int i = 0; i < 5; i++)
        pl_engine_settle(old, a[i].w, PL_OUTCOME_HANDED_OVER);
    const pl_ledger *lo = pl_engine_ledger(old), *ln = pl_engine_ledger(neu);
    CHECK_EQ(lo->parked_total, 5);
    CHECK_EQ(lo->parked_now, 0);
    CHECK_EQ(lo->settled[PL_OUTCOME_HANDED_OVER], 5);
    CHECK(balanced_with_adopted(lo));
    CHECK_EQ(ln->parked_total, 0);
    CHECK_EQ(ln->adopted, 5);
    CHECK_EQ(ln->parked_now, 5);
    CHECK(balanced_with_adopted(ln));
    for (int i = 0; i < 5; i++)
        CHECK(a[i].calls == 1 && a[i].outcome == PL_OUTCOME_HANDED_OVER);
    CHECK_EQ(pl_engine_waiting(neu, &KA), 3);
    CHECK_EQ(pl_engine_key_count(neu), 3);
    /* the queue order came along: fifo still gives the oldest */
    CHECK_EQ(deliver(neu, &KA, &payload, 20, NULL), PL_DELIVERED);
    CHECK(b[0].calls == 1 && b[0].outcome == PL_OUTCOME_MATCHED);
    /* and the deadlines: parked at 11..14, timeout 100 */
    uint64_t due = 0;
    CHECK_EQ(pl_engine_next_deadline(neu, &due), 0);
    CHECK_EQ(due, 111);
    CHECK_EQ(pl_engine_expire(neu, 111), 1);
    CHECK(b[1].outcome == PL_OUTCOME_TIMEOUT);
    /* a parked_at older than the newest waiter's keeps the list sorted */
    owner_t late = {0};
    CHECK_EQ(pl_engine_adopt(neu, &KC, "ctl-late", 8, &late, 1, &late.w), 0);
    pl_engine_free(neu); /* settles the rest as shutdown */
    CHECK(late.calls == 1 && late.outcome == PL_OUTCOME_SHUTDOWN);
    CHECK_EQ(pl_engine_adopt(old, &(pl_key){"", 0, "v", 1, 1, 1}, "x", 1, &late, 1, &late.w),
             PL_EINVAL);
    pl_engine_free(old);
}

/* Adoption keys on the controller id and deployment, as parking does. */
static void test_adopt_is_per_tenant(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t v = {0}, a = {0}, v2 = {0}, v3 = {0};

    CHECK_EQ(pl_engine_adopt(e, &KA, "ctl", 3, &v, 1, &v.w), 0);
    CHECK_EQ(pl_engine_adopt(e, &KC, "ctl", 3, &a, 2, &a.w), 0);    /* dep-c */
    CHECK_EQ(pl_engine_adopt(e, &KB, "ctl", 3, &v2, 3, &v2.w), PL_EEXIST); /* dep-a */
    CHECK(v2.w == NULL && v2.calls == 0);
    /* the controller's next poll replaces its own adopted waiter only */
    CHECK_EQ(park(e, &KA, "ctl", &v3, 4), 0);
    CHECK(v.calls == 1 && v.outcome == PL_OUTCOME_REPLACED);
    CHECK_EQ(a.calls, 0);
    pl_engine_free(e);
    CHECK(a.calls == 1 && v3.calls == 1);
}

static void test_set_opts_applies_from_the_next_park(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 3, 0);
    owner_t o[4] = {{0}};
    pl_engine_opts opts = {PL_ORDER_LIFO, 0, 1, 0, settle_cb};
    int payload = 1;

    CHECK_EQ(park(e, &KA, "a", &o[0], 1), 0);
    CHECK_EQ(park(e, &KA, "b", &o[1], 2), 0);
    pl_engine_set_opts(e, &opts);
    CHECK(o[0].calls == 0 && o[1].calls == 0); /* a lower cap closes nothing */
    CHECK_EQ(park(e, &KA, "c", &o[2], 3), PL_EREJECTED);
    CHECK_EQ(o[2].outcome, PL_OUTCOME_REJECTED);
    CHECK_EQ(deliver(e, &KA, &payload, 4, NULL), PL_DELIVERED);
    CHECK(o[1].calls == 1 && o[0].calls == 0); /* lifo now: the newest */
    pl_engine_free(e);
}

/* A waiter held for a hand-over: the other process holds its socket, so
 * nothing here may answer it until the verdict; released, it is as before. */
static void test_hold_for_a_hand_over(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 100);
    owner_t a = {0}, b = {0}, a2 = {0}, c = {0}, d = {0};
    int payload = 3;
    uint64_t due = 0;

    CHECK_EQ(park(e, &KA, "a", &a, 10), 0);
    CHECK_EQ(park(e, &KA, "b", &b, 20), 0);
    pl_engine_hold(e, a.w, 1);
    pl_engine_hold(e, a.w, 1); /* twice is once */
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 120); /* b's: a's waits */
    CHECK_EQ(pl_engine_expire(e, 115), 0);
    CHECK_EQ(a.calls, 0);
    /* fifo skips the held oldest; a newer poll of its id parks beside it */
    CHECK_EQ(deliver(e, &KA, &payload, 30, NULL), PL_DELIVERED);
    CHECK(b.calls == 1 && b.outcome == PL_OUTCOME_MATCHED && a.calls == 0);
    CHECK_EQ(deliver(e, &KA, &payload, 31, NULL), 0); /* only a: held */
    CHECK_EQ(park(e, &KA, "a", &a2, 40), 0);
    CHECK_EQ(a.calls, 0);
    CHECK_EQ(pl_engine_waiting(e, &KA), 2);
    /* no cap and no judge ends it */
    pl_engine_set_opts(e, &(pl_engine_opts){PL_ORDER_LIFO, 1, 1, 100, settle_cb});
    CHECK_EQ(pl_engine_enforce_caps(e), 1);
    CHECK(a2.calls == 1 && a2.outcome == PL_OUTCOME_REJECTED && a.calls == 0);
    CHECK_EQ(pl_engine_settle_if(e, PL_OUTCOME_REVOKED, judge_tag, NULL), 0);
    CHECK_EQ(pl_engine_next_deadline(e, &due), -ENOENT);
    /* released: its deadline (passed) and its place come back */
    pl_engine_hold(e, a.w, 0);
    CHECK_EQ(pl_engine_next_deadline(e, &due), 0);
    CHECK_EQ(due, 110);
    CHECK_EQ(pl_engine_expire(e, 200), 1);
    CHECK(a.calls == 1 && a.outcome == PL_OUTCOME_TIMEOUT);
    /* lifo skips a held newest; a drain ends held waiters too */
    CHECK_EQ(park(e, &KC, "c", &c, 300), 0);
    CHECK_EQ(park(e, &KC, "d", &d, 301), PL_EREJECTED); /* max_waiters 1 */
    pl_engine_hold(e, c.w, 1);
    CHECK_EQ(deliver(e, &KC, &payload, 302, NULL), 0);
    pl_engine_drain(e);
    CHECK(c.calls == 1 && c.outcome == PL_OUTCOME_SHUTDOWN);
    CHECK(ledger_balanced(pl_engine_ledger(e)));
    pl_engine_free(e);
}

/* A lower cap applied to what is parked: the newest go, per key first. */
static void test_enforce_caps_takes_the_newest(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    owner_t o[6] = {{0}};
    const pl_key *keys[6] = {&KA, &KA, &KA, &KB, &KC, &KC};
    char id[8];

    for (int i = 0; i < 6; i++) {
        snprintf(id, sizeof(id), "c%d", i);
        CHECK_EQ(park(e, keys[i], id, &o[i], (uint64_t)i), 0);
    }
    CHECK_EQ(pl_engine_enforce_caps(e), 0); /* no cap: nothing */
    pl_engine_set_opts(e, &(pl_engine_opts){PL_ORDER_FIFO, 3, 2, 0, settle_cb});
    CHECK_EQ(pl_engine_enforce_caps(e), 3);
    /* KA over its cap of 2: its newest (o[2]); then 5 > 3 in all: o[5], o[4] */
    for (int i = 0; i < 6; i++)
        CHECK_EQ(o[i].calls, i == 2 || i >= 4);
    CHECK(o[2].outcome == PL_OUTCOME_REJECTED && o[4].outcome == PL_OUTCOME_REJECTED);
    CHECK_STR(o[2].arg, "too many parked polls for this deployment and machine");
    CHECK_STR(o[5].arg, "too many parked polls on this server");
    CHECK_EQ(pl_engine_ledger(e)->parked_now, 3);
    CHECK(ledger_balanced(pl_engine_ledger(e)));
    pl_engine_free(e);
}

int main(void)
{
    RUN(test_hand_over_between_engines);
    RUN(test_adopt_is_per_tenant);
    RUN(test_set_opts_applies_from_the_next_park);
    RUN(test_hold_for_a_hand_over);
    RUN(test_enforce_caps_takes_the_newest);
    return unit_finish();
}
