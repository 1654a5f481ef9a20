/* test_diag.c -- what dispatches came to lately, and why each miss missed:
 * the minute windows as time passes, the keys kept and the ones let go,
 * the nearest parked key of each miss with a real engine, token refusals,
 * run ids, the words. Time is passed in: minutes go by in microseconds. */
#include "engine_fixture.h"
#include "pilotlight/diag.h"
#include "pilotlight/hash.h"
#include "pilotlight/pool.h"
#include "pilotlight/token.h"

#define MIN 60000

static pl_diag_dispatch disp(const pl_key *k, pl_dispatch_result result, uint64_t now,
                             const char *payload)
{
    pl_diag_dispatch x;

    memset(&x, 0, sizeof(x));
    x.key = k;
    x.result = result;
    x.now = now;
    x.took_ns = 1500;
    x.waited_ms = 7;
    x.payload = payload;
    x.payload_len = payload ? strlen(payload) : 0;
    return x;
}

static int record(pl_diag *d, const pl_key *k, pl_dispatch_result result, uint64_t now)
{
    pl_diag_dispatch x = disp(k, result, now, NULL);

    return pl_diag_dispatched(d, &x);
}

/* The same through the engine's spot, as the broker gives it. */
static int record_found(pl_diag *d, const pl_engine *e, const pl_key *k,
                        pl_dispatch_result result, uint64_t now, const char *payload)
{
    pl_engine_spot spot;
    pl_diag_dispatch x = disp(k, result, now, payload);

    pl_engine_find(e, k, &spot);
    x.spot = &spot;
    return pl_diag_dispatched(d, &x);
}

static pl_diag_window key_window(const pl_diag *d, const pl_key *k, uint64_t now, int *kept)
{
    unsigned char enc[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(k, enc);
    pl_diag_window w;

    *kept = pl_diag_key_window(d, enc, len, pl_hash(enc, len, 0), now, &w);
    return w;
}

static void test_windows_roll_by_the_minute(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    pl_diag_window w;
    int kept;

    record(d, &KA, PL_DISPATCH_HIT, 5 * MIN + 10);
    record(d, &KA, PL_DISPATCH_HIT, 5 * MIN + 20);
    record(d, &KA, PL_DISPATCH_UNCONFIRMED, 6 * MIN);
    record(d, &KB, PL_DISPATCH_ABANDONED, 8 * MIN + 1);
    pl_diag_window_all(d, 8 * MIN + 2, &w);
    CHECK_EQ(w.total_hits, 2);
    CHECK_EQ(w.total_misses, 2);
    CHECK_EQ(w.hits[PL_DIAG_MINUTES - 4], 2); /* minute 5, three before 8 */
    CHECK_EQ(w.misses[PL_DIAG_MINUTES - 3], 1);
    CHECK_EQ(w.misses[PL_DIAG_MINUTES - 1], 1);
    w = key_window(d, &KA, 8 * MIN, &kept);
    CHECK(kept);
    CHECK_EQ(w.total_hits, 2);
    CHECK_EQ(w.total_misses, 1);
    /* ten minutes on, minute 5 has left the window; minute 6 the next */
    w = key_window(d, &KA, 15 * MIN + 59999, &kept);
    CHECK_EQ(w.total_hits, 0);
    CHECK_EQ(w.total_misses, 1);
    CHECK_EQ(w.misses[0], 1);
    w = key_window(d, &KA, 16 * MIN, &kept);
    CHECK(kept);
    CHECK_EQ(w.total_hits + w.total_misses, 0);
    /* counting after a long quiet starts afresh */
    record(d, &KA, PL_DISPATCH_HIT, 40 * MIN);
    w = key_window(d, &KA, 40 * MIN, &kept);
    CHECK_EQ(w.total_hits, 1);
    CHECK_EQ(w.total_misses, 0);
    CHECK_EQ(w.hits[PL_DIAG_MINUTES - 1], 1);
    /* early in the clock's life: no minute before 0 */
    pl_diag_free(d);
    d = pl_diag_new(e);
    record(d, &KA, PL_DISPATCH_HIT, 10);
    pl_diag_window_all(d, 20, &w);
    CHECK_EQ(w.total_hits, 1);
    CHECK_EQ(w.hits[PL_DIAG_MINUTES - 1], 1);
    pl_diag_free(d);
    pl_engine_free(e);
}

static size_t counted;

static void count_key(const pl_key *k, const pl_diag_window *w, void *arg)
{
    (void)k, (void)w, (void)arg;
    counted++;
}

/* Keys named by kept events stay; the least recently dispatched-to other
 * one makes room. */
static void test_keys_kept_and_let_go(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    char deps[PL_DIAG_KEYS + PL_DIAG_LAST + 8][16];
    pl_key k[PL_DIAG_KEYS + PL_DIAG_LAST + 8];
    size_t n = sizeof(k) / sizeof(k[0]);
    int kept;

    for (size_t i = 0; i < n; i++) {
        snprintf(deps[i], sizeof(deps[i]), "dep-%zu", i);
        k[i] = key(deps[i], "v1", 1, 1);
    }
    /* PL_DIAG_LAST misses on the first keys pin them */
    for (size_t i = 0; i < PL_DIAG_LAST; i++)
        CHECK_EQ(record(d, &k[i], PL_DISPATCH_MISS, 1000 + i), PL_NEAREST_NONE);
    /* then hits on all the others, more than there is room for */
    for (size_t i = PL_DIAG_LAST; i < n; i++)
        CHECK_EQ(record(d, &k[i], PL_DISPATCH_HIT, 2000 + i), -1);
    for (size_t i = 0; i < PL_DIAG_LAST; i++) {
        key_window(d, &k[i], 3000, &kept);
        CHECK(kept); /* pinned by the misses kept */
    }
    /* the oldest of the hits went first; the newest stay */
    key_window(d, &k[PL_DIAG_LAST], 3000, &kept);
    CHECK(!kept);
    key_window(d, &k[n - 1], 3000, &kept);
    CHECK(kept);
    CHECK_EQ(pl_diag_each_key(d, 3000, count_key, NULL), PL_DIAG_KEYS);
    pl_diag_free(d);
    pl_engine_free(e);
}

/* ---- the nearest parked key of a miss ---- */

static pl_diag_event last_miss;

static void keep_first(const pl_diag_event *ev, void *arg)
{
    int *n = arg;

    if ((*n)++ == 0)
        last_miss = *ev;
}

/* The newest false answer kept, and its words in <why>. */
static const pl_diag_event *newest(const pl_diag *d, char *why, size_t cap)
{
    int n = 0;

    pl_diag_each_event(d, 1, keep_first, &n);
    CHECK(n > 0);
    pl_diag_why(&last_miss, why, cap);
    return &last_miss;
}

static void test_nearest_in_order(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    pl_key a_small = key("dep-a", "v1", 1, 1024), a_big = key("dep-a", "v1", 4, 8192);
    pl_key a_v2 = key("dep-a", "v2", 1, 1024), b = key("dep-b", "v1", 1, 1024);
    const pl_diag_event *ev;
    owner_t o[6];
    char why[2048];

    memset(o, 0, sizeof(o));
    CHECK_EQ(record_found(d, e, &a_big, PL_DISPATCH_MISS, 1, NULL), PL_NEAREST_NONE);
    ev = newest(d, why, sizeof(why));
    CHECK_STR(why, "no controller was parked on this instance at all");
    CHECK_EQ(park(e, &b, "b0", &o[0], 2), 0);
    CHECK_EQ(record_found(d, e, &a_big, PL_DISPATCH_MISS, 3, NULL), PL_NEAREST_DEPLOYMENT);
    newest(d, why, sizeof(why));
    CHECK_STR(why, "nothing is parked for this deployment; 1 controller is parked for "
                   "others");
    CHECK_EQ(park(e, &a_v2, "a0", &o[1], 4), 0);
    CHECK_EQ(park(e, &a_v2, "a1", &o[2], 5), 0);
    CHECK_EQ(record_found(d, e, &a_big, PL_DISPATCH_MISS, 6, NULL), PL_NEAREST_VERSION);
    ev = newest(d, why, sizeof(why));
    CHECK(ev->has_near && ev->near.version_len == 2 && memcmp(ev->near.version, "v2", 2) == 0);
    CHECK_STR(why, "2 controllers are parked for this deployment on version v2; the run is v1");
    CHECK_EQ(park(e, &a_small, "a2", &o[3], 7), 0);
    CHECK_EQ(record_found(d, e, &a_big, PL_DISPATCH_MISS, 8, NULL), PL_NEAREST_MACHINE);
    newest(d, why, sizeof(why));
    CHECK_STR(why, "1 controller is parked for this deployment and version on 1 vCPU, 1024 GB; "
                   "the run needs 4 vCPU, 8192 GB");
    /* the key's own polls were offered the run, and none took it */
    {
        pl_diag_dispatch x = disp(&a_big, PL_DISPATCH_MISS, 9, NULL);
        x.offered = 1;
        CHECK_EQ(pl_diag_dispatched(d, &x), PL_NEAREST_KEY);
        newest(d, why, sizeof(why));
        CHECK(strstr(why, "parked for this very key") != NULL);
    }
    /* false answers that are no miss are kept, not classified */
    CHECK_EQ(record_found(d, e, &a_big, PL_DISPATCH_UNCONFIRMED, 10, NULL), -1);
    newest(d, why, sizeof(why));
    CHECK(strstr(why, "TCP could not tell") != NULL);
    pl_diag_free(d);
    pl_engine_free(e);
}

static void test_token_refusals(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    pl_key want = key("dep-t", "v2", 1, 1), refused = key("dep-t", "v2", 1, 1);
    pl_key other_ver = key("dep-t", "v1", 1, 1), nodep = key("", "v2", 1, 1);
    const pl_diag_event *ev;
    owner_t o = {0};
    char why[2048];

    CHECK_EQ(park(e, &other_ver, "c", &o, 1), 0);
    /* nothing refused: another version is nearest */
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 2, NULL), PL_NEAREST_VERSION);
    /* a poll for the very key refused: that is nearer */
    pl_diag_token_refused(d, &refused, PL_TOKEN_INVALID, 1, 10);
    pl_diag_token_refused(d, &refused, PL_TOKEN_INVALID, 1, 1000);
    pl_diag_token_refused(d, &nodep, PL_TOKEN_INVALID, 1, 1000); /* no deployment: not kept */
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 13000, NULL), PL_NEAREST_TOKEN);
    ev = newest(d, why, sizeof(why));
    CHECK(ev->has_refusal && ev->refusal.count == 2 && ev->refusal.enforced);
    CHECK_STR(why, "2 polls for this deployment came with an invalid deployment token (the "
                   "last 12 s before the dispatch): refused 401 (token_mode = enforce); is "
                   "token_secret the supervisor's WORKLOAD_TOKEN_SECRET?");
    /* refused for another version: the parked version is nearer... */
    want = key("dep-t", "v3", 1, 1);
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 14000, NULL), PL_NEAREST_VERSION);
    /* ... until it has gone */
    pl_engine_settle(e, o.w, PL_OUTCOME_DISCONNECT);
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 15000, NULL), PL_NEAREST_TOKEN);
    newest(d, why, sizeof(why));
    CHECK(strstr(why, "(version v2) came with an invalid deployment token") != NULL);
    /* a refusal older than the window explains nothing */
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 1000 + PL_DIAG_MINUTES * MIN + 1,
                          NULL),
             PL_NEAREST_NONE);
    /* logged, not refused; a bare id */
    want = key("dep-l", "v1", 1, 1);
    pl_diag_token_refused(d, &want, PL_TOKEN_LEGACY, 0, 20 * MIN);
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 20 * MIN, NULL), PL_NEAREST_TOKEN);
    newest(d, why, sizeof(why));
    CHECK(strstr(why, "a bare deployment id where a signed token is required") != NULL);
    CHECK(strstr(why, "token_mode = log") != NULL);
    /* more deployments refused than are kept: the oldest make room */
    for (int i = 0; i < PL_DIAG_TOKENS + 4; i++) {
        char dep[16];
        pl_key k;
        snprintf(dep, sizeof(dep), "dep-r%d", i);
        k = key(dep, "v1", 1, 1);
        pl_diag_token_refused(d, &k, PL_TOKEN_INVALID, 1, 21 * MIN + (uint64_t)i);
    }
    CHECK_EQ(record_found(d, e, &want, PL_DISPATCH_MISS, 22 * MIN, NULL), PL_NEAREST_NONE);
    {
        pl_key k = key("dep-r19", "v1", 1, 1);
        CHECK_EQ(record_found(d, e, &k, PL_DISPATCH_MISS, 22 * MIN, NULL), PL_NEAREST_TOKEN);
    }
    pl_diag_free(d);
    pl_engine_free(e);
}

static void test_run_ids(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    char why[2048], payload[512];
    const pl_diag_event *ev;

    record_found(d, e, &KA, PL_DISPATCH_MISS, 1,
                 "{\"run\":{\"id\":\"x\",\"friendlyId\":\"run_\\u0041b<\"},"
                 "\"friendlyId\":\"no\"}");
    ev = newest(d, why, sizeof(why));
    CHECK_STR(ev->run, "run_Ab<");
    CHECK(!ev->run_cut);
    record_found(d, e, &KA, PL_DISPATCH_MISS, 2, "{\"run\":{\"friendlyId\":7}}");
    CHECK_STR(newest(d, why, sizeof(why))->run, "");
    record_found(d, e, &KA, PL_DISPATCH_MISS, 3, NULL);
    CHECK_STR(newest(d, why, sizeof(why))->run, "");
    /* a NUL is no text */
    record_found(d, e, &KA, PL_DISPATCH_MISS, 4, "{\"run\":{\"friendlyId\":\"a\\u0000b\"}}");
    CHECK_STR(newest(d, why, sizeof(why))->run, "");
    /* cut at a character's end: 63 ASCII bytes, then a two-byte one */
    snprintf(payload, sizeof(payload), "{\"run\":{\"friendlyId\":\"%063d\xc3\xa9tail\"}}", 0);
    record_found(d, e, &KA, PL_DISPATCH_MISS, 5, payload);
    ev = newest(d, why, sizeof(why));
    CHECK_EQ(strlen(ev->run), 63);
    CHECK(ev->run_cut);
    /* hits keep how long their poll waited, and no run id */
    record_found(d, e, &KB, PL_DISPATCH_HIT, 6, payload);
    {
        int n = 0;
        pl_diag_each_event(d, 0, keep_first, &n);
        CHECK_EQ(n, 1);
        CHECK_EQ(last_miss.waited_ms, 7);
        CHECK_STR(last_miss.run, "");
        CHECK_EQ(last_miss.key.cpu, KB.cpu);
        CHECK_EQ(last_miss.key.memory, KB.memory);
    }
    pl_diag_free(d);
    pl_engine_free(e);
}

/* A key found by the engine (its encoding) and a confirmed delivery's (its
 * fields) are one key; numbers as numbers. */
static void test_one_key_either_way(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    pl_key same = key("dep-a", "v1", 1, 1024), zero = key("dep-z", "v1", 0, 1);
    pl_key minus = key("dep-z", "v1", -0.0, 1);
    pl_diag_window w;
    int kept;

    CHECK_EQ(record_found(d, e, &KA, PL_DISPATCH_HIT, 1, NULL), -1);
    CHECK_EQ(record(d, &same, PL_DISPATCH_HIT, 2), -1);
    CHECK_EQ(record(d, &zero, PL_DISPATCH_HIT, 3), -1);
    CHECK_EQ(record_found(d, e, &minus, PL_DISPATCH_HIT, 4, NULL), -1);
    counted = 0;
    CHECK_EQ(pl_diag_each_key(d, 5, count_key, NULL), 2);
    w = key_window(d, &KA, 5, &kept);
    CHECK(kept && w.total_hits == 2);
    w = key_window(d, &zero, 5, &kept);
    CHECK(kept && w.total_hits == 2);
    pl_diag_free(d);
    pl_engine_free(e);
}

/* A dispatch's answer names its key by the tag the key's spot took before
 * the delivery (kept with the key by the engine: the next tagging is a
 * compare); one whose key was let go meanwhile, by the key itself. */
static void test_tags(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    char deps[PL_DIAG_KEYS + 1][16];
    pl_engine_spot spot;
    pl_diag_dispatch x;
    pl_diag_window w;
    uint32_t tag;
    int kept;

    pl_engine_find(e, &KA, &spot);
    pl_diag_tag(d, &spot, 1);
    tag = spot.note;
    CHECK(tag != 0);
    pl_diag_tag(d, &spot, 1); /* tagged already: the same */
    CHECK_EQ(spot.note, tag);
    x = disp(&KB, PL_DISPATCH_HIT, 2, NULL); /* the tag wins over the key */
    x.tag = tag;
    CHECK_EQ(pl_diag_dispatched(d, &x), -1);
    w = key_window(d, &KA, 3, &kept);
    CHECK(kept && w.total_hits == 1);
    key_window(d, &KB, 3, &kept);
    CHECK(!kept);
    /* let KA go: every slot taken by newer keys */
    for (int i = 0; i < PL_DIAG_KEYS; i++) {
        pl_key k;
        snprintf(deps[i], sizeof(deps[i]), "dep-x%d", i);
        k = key(deps[i], "v1", 1, 1);
        record(d, &k, PL_DISPATCH_HIT, 10 + (uint64_t)i);
    }
    key_window(d, &KA, 100, &kept);
    CHECK(!kept);
    x = disp(&KC, PL_DISPATCH_HIT, 100, NULL);
    x.tag = tag; /* stale: its slot holds another key now */
    CHECK_EQ(pl_diag_dispatched(d, &x), -1);
    w = key_window(d, &KC, 101, &kept);
    CHECK(kept && w.total_hits == 1);
    /* a spot whose note went stale is tagged anew, for its own key */
    pl_engine_find(e, &KA, &spot);
    spot.note = tag;
    pl_diag_tag(d, &spot, 102);
    CHECK(spot.note != 0 && spot.note != tag);
    x = disp(&KB, PL_DISPATCH_HIT, 102, NULL);
    x.tag = spot.note;
    CHECK_EQ(pl_diag_dispatched(d, &x), -1);
    w = key_window(d, &KA, 103, &kept);
    CHECK(kept && w.total_hits == 1);
    /* every hit is still counted in all, the keys let go too */
    pl_diag_window_all(d, 101, &w);
    CHECK_EQ(w.total_hits, 3 + PL_DIAG_KEYS);
    pl_diag_free(d);
    pl_engine_free(e);
}

/* Every allocation failing: dispatches are still classified, nothing is
 * kept, nothing leaks (the pools count). */
static void test_out_of_memory(void)
{
    pl_engine *e = engine(PL_ORDER_FIFO, 0, 0, 0);
    pl_diag *d = pl_diag_new(e);
    int n = 0;

    pl_mem_fail_after(1, 1);
    CHECK_EQ(record(d, &KA, PL_DISPATCH_MISS, 1), PL_NEAREST_NONE);
    CHECK_EQ(record(d, &KB, PL_DISPATCH_HIT, 2), -1);
    pl_diag_token_refused(d, &KC, PL_TOKEN_INVALID, 1, 3);
    pl_mem_fail_after(0, 0);
    pl_diag_each_event(d, 1, keep_first, &n);
    CHECK_EQ(n, 0);
    CHECK_EQ(pl_diag_each_key(d, 3, count_key, NULL), 0);
    pl_diag_free(d);
    pl_engine_free(e);
    CHECK_EQ(pl_pool_in_use_total(), 0);
}

int main(void)
{
    RUN(test_windows_roll_by_the_minute);
    RUN(test_keys_kept_and_let_go);
    RUN(test_nearest_in_order);
    RUN(test_token_refusals);
    RUN(test_run_ids);
    RUN(test_one_key_either_way);
    RUN(test_tags);
    RUN(test_out_of_memory);
    return unit_finish();
}
