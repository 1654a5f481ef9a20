/* test_reclaim.c -- when memory goes back to the system (reclaim.h): the
 * policy alone (pl_reclaim_due), then the process-wide count driving real
 * trims on a libuv loop, seen through a pool's chunks. */
#include <stdint.h>
#include <stdio.h>

#include <uv.h>

#include "pilotlight/pool.h"
#include "pilotlight/reclaim.h"
#include "unit.h"

typedef struct {
    uint64_t open, peak, low;
    int due;
    const char *why;
} row;

static const row rows[] = {
    /* a handful of connections never trims: they would come back */
    {0, 0, 0, 0, "nothing ever open"},
    {0, 15, 0, 0, "below the least peak, all gone"},
    {1, 15, 0, 0, "below the least peak"},
    /* a crowd trims once it has fallen to an eighth of its peak */
    {2, 16, 0, 1, "the least peak, at an eighth"},
    {3, 16, 0, 0, "the least peak, above an eighth"},
    {0, 16, 0, 1, "the least peak, all gone"},
    {125, 1000, 0, 1, "an eighth of 1000"},
    {126, 1000, 0, 0, "one above an eighth of 1000"},
    {12, 100, 0, 1, "an eighth of 100, rounded down"},
    {13, 100, 0, 0, "above an eighth of 100"},
    {500, 1000, 0, 0, "half the crowd still there"},
    /* after a trim at <low>, every lower count trims again */
    {11, 12, 12, 1, "a new low"},
    {12, 12, 12, 0, "the same low"},
    {13, 13, 12, 0, "above the low"},
    {0, 1, 1, 1, "the last one gone"},
    {4, 5, 5, 1, "a new low with a peak below the least"},
    /* a new crowd since the last trim: its eighth counts again */
    {100, 1000, 50, 1, "an eighth of a new crowd, above the last low"},
    {200, 1000, 50, 0, "above an eighth of a new crowd and the last low"},
};

static void test_policy_table(void)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const row *r = &rows[i];
        int got = pl_reclaim_due(r->open, r->peak, r->low);
        CHECK_EQ(got != 0, r->due);
        if ((got != 0) != r->due)
            fprintf(stderr, "  row \"%s\": open %llu, peak %llu, low %llu\n", r->why,
                    (unsigned long long)r->open, (unsigned long long)r->peak,
                    (unsigned long long)r->low);
    }
}

/* A trim is seen in a pool of two empty chunks: it keeps one and gives the
 * other's pages back. */
static pl_pool probe = PL_POOL_INIT("reclaim_probe", 512);

static void arm(void)
{
    void *objs[4096];
    uint32_t n;

    objs[0] = pl_pool_get(&probe); /* sets per_chunk */
    n = probe.per_chunk + 1;
    CHECK(n <= sizeof(objs) / sizeof(objs[0]));
    for (uint32_t i = 1; i < n; i++)
        objs[i] = pl_pool_get(&probe);
    for (uint32_t i = 0; i < n; i++)
        pl_pool_put(&probe, objs[i]);
    CHECK_EQ(probe.chunks, 2);
}

static int trimmed(void)
{
    return probe.chunks == 1;
}

static void opened(int n)
{
    while (n-- > 0)
        pl_reclaim_opened();
}

static void closed(int n)
{
    while (n-- > 0)
        pl_reclaim_closed();
}

static void test_counted_connections_trim(void)
{
    uv_loop_t loop;

    CHECK_EQ(uv_loop_init(&loop), 0);
    pl_reclaim_start(&loop);
    arm();

    /* a crowd of 32 falls to 5: not yet an eighth */
    opened(32);
    closed(27);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(!trimmed());
    /* to 4, then 3 in the same turn: one trim, as the loop is about to wait */
    closed(1);
    CHECK(!trimmed()); /* not from inside the close */
    closed(1);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(trimmed());
    /* each new low after that trims again */
    arm();
    closed(1);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(trimmed());
    /* a few coming and going above the low do not */
    arm();
    opened(3);
    closed(3);
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(!trimmed());
    /* a new crowd: its eighth, not the old low, decides */
    opened(40); /* 42 open */
    closed(36); /* 6: above an eighth, above the low of 2 */
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(!trimmed());
    closed(1);  /* 5: an eighth of 42 */
    uv_run(&loop, UV_RUN_NOWAIT);
    CHECK(trimmed());
    closed(5);

    pl_reclaim_stop();
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ(uv_loop_close(&loop), 0);
}

int main(void)
{
    RUN(test_policy_table);
    RUN(test_counted_connections_trim);
    return unit_finish();
}
