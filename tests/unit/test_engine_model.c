/* test_engine_model.c -- the engine against a model: random parks,
 * deliveries, disconnects, expiries and caps, every callback and the
 * ledger compared with what the model says. */
#include "engine_fixture.h"

/* ---- randomized model test ---------------------------------------------- */

#define M_KEYS 6
#define M_IDS 10
#define M_WANT (M_IDS * M_KEYS + 2) /* settlements one step can cause */
#define M_STEPS 4000

/* Each model key, written two ways that must mean the same key. */
static const struct {
    const char *dep, *ver, *cpu[2], *mem[2];
} mkeys[M_KEYS] = {
    {"dep-a", "v1", {"1", "1.0"}, {"512", "5.12e2"}},
    {"dep-a", "v1", {"2", "2e0"}, {"512", "512.00"}},
    {"dep-a", "v2", {"1", "10e-1"}, {"512", "512"}},
    {"dep-b", "v1", {"0.5", "5e-1"}, {"1024", "1024.0"}},
    {"ab", "c", {"1", "1"}, {"1", "1"}},
    {"a", "bc", {"1", "1"}, {"1", "1"}},
};

/* Builds model key <i> in caller-provided fresh buffers, so that only
 * content can make two keys equal. */
static pl_key mkey(int i, unsigned variant, char dep[32], char ver[32])
{
    pl_key k;
    const char *cpu = mkeys[i].cpu[variant & 1];
    const char *mem = mkeys[i].mem[(variant >> 1) & 1];

    snprintf(dep, 32, "%s", mkeys[i].dep);
    snprintf(ver, 32, "%s", mkeys[i].ver);
    k = key(dep, ver, 0, 0);
    CHECK_EQ(pl_key_parse_number(cpu, strlen(cpu), &k.cpu), 0);
    CHECK_EQ(pl_key_parse_number(mem, strlen(mem), &k.memory), 0);
    return k;
}

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
    /* xorshift64*: fixed sequence for a seed on every platform. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ULL) >> 33) % n;
}

typedef struct {
    pl_order order;
    uint32_t max, per_key;
    uint64_t timeout;
    /* per-key queues, oldest first; ids are unique among the live waiters
     * of one deployment, so no queue holds more than M_IDS (and all of
     * them together at most M_IDS per deployment: M_WANT bounds both) */
    owner_t *q[M_KEYS][M_IDS];
    size_t n[M_KEYS];
    uint64_t total, settled[PL_OUTCOME__COUNT];
    /* the callbacks the current step should cause */
    struct {
        owner_t *owner;
        pl_outcome outcome;
    } want[M_WANT];
    size_t nwant;
} model;

static owner_t m_owners[M_STEPS];
static uint64_t m_seen[PL_OUTCOME__COUNT]; /* over all runs */

static void m_remove(model *m, int k, size_t pos, pl_outcome outcome)
{
    owner_t *o = m->q[k][pos];

    memmove(&m->q[k][pos], &m->q[k][pos + 1],
            (m->n[k] - pos - 1) * sizeof(m->q[k][0]));
    m->n[k]--;
    m->settled[outcome]++;
    m->want[m->nwant].owner = o;
    m->want[m->nwant].outcome = outcome;
    m->nwant++;
}

static size_t m_live(const model *m)
{
    size_t sum = 0;

    for (int k = 0; k < M_KEYS; k++)
        sum += m->n[k];
    return sum;
}

/* The model's pl_engine_park(). Returns the expected return code. */
static int m_park(model *m, owner_t *o)
{
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k]; i++)
            if (m->q[k][i]->id == o->id && !m->q[k][i]->held &&
                strcmp(mkeys[k].dep, mkeys[o->key].dep) == 0) {
                m_remove(m, k, i, PL_OUTCOME_REPLACED);
                k = M_KEYS;
                break;
            }
    m->total++;
    if ((m->max && m_live(m) >= m->max) ||
        (m->per_key && m->n[o->key] >= m->per_key)) {
        m->settled[PL_OUTCOME_REJECTED]++;
        m->want[m->nwant].owner = o;
        m->want[m->nwant].outcome = PL_OUTCOME_REJECTED;
        m->nwant++;
        return PL_EREJECTED;
    }
    m->q[o->key][m->n[o->key]++] = o;
    return 0;
}

/* The model's pl_engine_deliver(): returns the owner that takes it. */
static owner_t *m_deliver(model *m, int k)
{
    for (;;) {
        size_t pos, i;
        owner_t *o;

        for (i = 0; i < m->n[k] && m->q[k][m->order == PL_ORDER_FIFO ? i : m->n[k] - 1 - i]->held;
             i++)
            ;
        if (i == m->n[k])
            break;
        pos = m->order == PL_ORDER_FIFO ? i : m->n[k] - 1 - i;
        o = m->q[k][pos];

        if (o->refuse) {
            /* offered MATCHED, refused: counted as a disconnect */
            m_remove(m, k, pos, PL_OUTCOME_MATCHED);
            m->settled[PL_OUTCOME_MATCHED]--;
            m->settled[PL_OUTCOME_DISCONNECT]++;
            continue;
        }
        m_remove(m, k, pos, PL_OUTCOME_MATCHED);
        return o;
    }
    return NULL;
}

static size_t m_expire(model *m, uint64_t now)
{
    size_t n = 0;

    if (m->timeout == 0)
        return 0;
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k];)
            if (m->q[k][i]->parked_at + m->timeout <= now && !m->q[k][i]->held) {
                m_remove(m, k, i, PL_OUTCOME_TIMEOUT);
                n++;
            } else {
                i++;
            }
    return n;
}

static void m_drain(model *m)
{
    for (int k = 0; k < M_KEYS; k++)
        while (m->n[k] > 0)
            m_remove(m, k, 0, PL_OUTCOME_SHUTDOWN);
}

/* The newest live waiter not held: of key <k>, or of any key (k < 0). */
static int m_newest(const model *m, int k, int *kk, size_t *pos)
{
    const owner_t *best = NULL;

    for (int j = k < 0 ? 0 : k; j < (k < 0 ? M_KEYS : k + 1); j++)
        for (size_t i = 0; i < m->n[j]; i++)
            if (!m->q[j][i]->held && (best == NULL || m->q[j][i] > best)) {
                best = m->q[j][i]; /* owners are taken in park order */
                *kk = j;
                *pos = i;
            }
    return best != NULL;
}

/* The model's pl_engine_enforce_caps(). */
static void m_enforce_caps(model *m)
{
    int kk = 0;
    size_t pos = 0;

    for (int k = 0; k < M_KEYS && m->per_key > 0; k++)
        while (m->n[k] > m->per_key && m_newest(m, k, &kk, &pos))
            m_remove(m, kk, pos, PL_OUTCOME_REJECTED);
    while (m->max > 0 && m_live(m) > m->max && m_newest(m, -1, &kk, &pos))
        m_remove(m, kk, pos, PL_OUTCOME_REJECTED);
}


static void m_revoke(model *m, pl_outcome outcome)
{
    for (int k = 0; k < M_KEYS; k++)
        for (size_t i = 0; i < m->n[k];) {
            owner_t *o = m->q[k][i];
            if (!o->held && o->tag == m_bad_tag) {
                m_remove(m, k, i, outcome);
                continue;
            }
            if (!o->held)
                o->tag = (o->tag + 1) % 4;
            i++;
        }
}

static int by_owner(const void *a, const void *b)
{
    const owner_t *x = *(owner_t *const *)a, *y = *(owner_t *const *)b;
    return x < y ? -1 : x > y;
}

/* The engine's index by deployment against the model: what
 * pl_engine_nearest() counts for each model key. */
static void m_check_nearest(const model *m, const pl_engine *e, unsigned variant)
{
    char dep[32], ver[32];

    for (int k = 0; k < M_KEYS; k++) {
        pl_key key_k = mkey(k, variant + (unsigned)k, dep, ver);
        size_t on_dep = 0, on_ver = 0;
        pl_engine_near n;

        for (int j = 0; j < M_KEYS; j++) {
            if (strcmp(mkeys[j].dep, mkeys[k].dep) != 0)
                continue;
            on_dep += m->n[j];
            on_ver += strcmp(mkeys[j].ver, mkeys[k].ver) == 0 ? m->n[j] : 0;
        }
        pl_engine_nearest(e, &key_k, M_KEYS, &n);
        CHECK_EQ(n.deployment_parked, on_dep);
        CHECK_EQ(n.version_parked, on_ver);
        CHECK_EQ(n.key_parked, m->n[k]);
        CHECK_EQ(n.found, on_dep > m->n[k]);
    }
}

/* Checks the callbacks since log_reset() are exactly the model's
 * expected settlements (in any order), then the engine's counters. */
static void m_check(const model *m, const pl_engine *e, const void *payload,
                    unsigned variant)
{
    owner_t *got[LOG_MAX], *want[M_WANT];
    char dep[32], ver[32];
    size_t live = 0, keys = 0;
    uint64_t oldest = UINT64_MAX, dl = 0;

    CHECK_EQ(log_len, m->nwant);
    for (size_t i = 0; i < log_len && i < m->nwant; i++) {
        got[i] = settle_log[i].owner;
        want[i] = m->want[i].owner;
    }
    if (log_len == m->nwant) {
        qsort(got, log_len, sizeof(got[0]), by_owner);
        qsort(want, log_len, sizeof(want[0]), by_owner);
        for (size_t i = 0; i < log_len; i++)
            CHECK(got[i] == want[i]);
        for (size_t i = 0; i < m->nwant; i++) {
            const owner_t *o = m->want[i].owner;
            pl_outcome w = m->want[i].outcome;
            CHECK_EQ(o->calls, 1);
            CHECK_EQ(o->outcome, w);
            if (w == PL_OUTCOME_MATCHED)
                CHECK(o->arg == payload);
            else if (w == PL_OUTCOME_REJECTED)
                CHECK(o->arg != NULL && *(const char *)o->arg != '\0');
            else if (w == PL_OUTCOME_REVOKED || w == PL_OUTCOME_MOVED)
                CHECK(o->arg == (o->tag & 1 ? (const void *)o : NULL));
            else
                CHECK(o->arg == NULL);
        }
    }
    CHECK_EQ(double_settles, 0);

    for (int k = 0; k < M_KEYS; k++) {
        pl_key key_k = mkey(k, variant + (unsigned)k, dep, ver);
        CHECK_EQ(pl_engine_waiting(e, &key_k), m->n[k]);
        live += m->n[k];
        keys += m->n[k] > 0;
        for (size_t i = 0; i < m->n[k]; i++) {
            CHECK_EQ(m->q[k][i]->calls, 0);
            if (!m->q[k][i]->held && m->q[k][i]->parked_at < oldest)
                oldest = m->q[k][i]->parked_at;
        }
    }
    CHECK_EQ(pl_engine_key_count(e), keys);
    m_check_nearest(m, e, variant);

    const pl_ledger *l = pl_engine_ledger(e);
    CHECK_EQ(l->parked_now, live);
    CHECK_EQ(l->parked_total, m->total);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        CHECK_EQ(l->settled[i], m->settled[i]);
    CHECK(ledger_balanced(l));

    if (m->timeout && oldest != UINT64_MAX) {
        CHECK_EQ(pl_engine_next_deadline(e, &dl), 0);
        CHECK_EQ(dl, oldest + m->timeout);
    } else {
        CHECK_EQ(pl_engine_next_deadline(e, &dl), -ENOENT);
    }
}

static const char *op_names[] = {"park", "deliver", "disconnect", "expire",
                                 "drain", "revoke", "caps", "hold"};

/* Returns 0 when the run matched the model throughout. */
static int model_run(uint64_t seed, pl_order order, uint32_t max,
                     uint32_t per_key, uint64_t timeout)
{
    static model m;
    pl_engine *e = engine(order, max, per_key, timeout);
    uint64_t now = 1000;
    size_t nowners = 0;
    int payload[1];
    unsigned long fail0 = unit_failures;
    int step;

    memset(&m, 0, sizeof(m));
    memset(m_owners, 0, sizeof(m_owners));
    m.order = order;
    m.max = max;
    m.per_key = per_key;
    m.timeout = timeout;
    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    double_settles = 0;

    for (step = 0; step < M_STEPS; step++) {
        uint32_t r = rnd(1000);
        int op = r < 430 ? 0 : r < 680 ? 1 : r < 780 ? 2 : r < 940 ? 3 : r < 945 ? 4
                 : r < 960 ? 5 : r < 970 ? 6 : 7;
        unsigned variant = rnd(4);
        char dep[32], ver[32];
        const void *offered = NULL;

        now += rnd(15);
        log_reset();
        m.nwant = 0;
        if (op == 0) {
            owner_t *o = &m_owners[nowners++];
            pl_key k;
            int want_rc, rc;

            o->key = (int)rnd(M_KEYS);
            o->id = (int)rnd(M_IDS);
            o->refuse = rnd(5) == 0;
            o->parked_at = now;
            o->tag = rnd(4);
            /* A held waiter is never replaced, so a poll of its id would
             * park beside it; which of two the next one replaces is then
             * the index's business: the model parks none such. */
            for (int kk = 0; kk < M_KEYS; kk++)
                for (size_t i = 0; i < m.n[kk]; i++)
                    if (m.q[kk][i]->held && m.q[kk][i]->id == o->id &&
                        strcmp(mkeys[kk].dep, mkeys[o->key].dep) == 0)
                        o->id = -1;
            if (o->id < 0) {
                memset(o, 0, sizeof(*o));
                nowners--;
                m_check(&m, e, NULL, variant);
                continue;
            }
            k = mkey(o->key, variant, dep, ver);
            char id[16];
            snprintf(id, sizeof(id), "ctl-%d", o->id);
            want_rc = m_park(&m, o);
            rc = park(e, &k, id, o, now);
            CHECK_EQ(rc, want_rc);
            CHECK((rc == 0) == (o->w != NULL));
            if (rc == 0)
                pl_engine_set_tag(o->w, o->tag);
        } else if (op == 1) {
            int ki = (int)rnd(M_KEYS);
            pl_key k = mkey(ki, variant, dep, ver);
            owner_t *want = m_deliver(&m, ki);
            uint64_t waited = 424242;
            int rc = deliver(e, &k, payload, now, &waited);

            offered = payload;
            CHECK_EQ(rc, want != NULL);
            if (want != NULL && rc == 1)
                CHECK_EQ(waited, now - want->parked_at);
            else
                CHECK_EQ(waited, 424242);
        } else if (op == 2) {
            size_t live = m_live(&m);
            if (live > 0) {
                size_t pick = rnd((uint32_t)live);
                for (int k = 0; k < M_KEYS; k++) {
                    if (pick < m.n[k]) {
                        owner_t *o = m.q[k][pick];
                        /* a client leaving, or (an upgrade) its socket
                         * handed to a new process: the same exit */
                        pl_outcome oc = variant & 1 ? PL_OUTCOME_HANDED_OVER
                                                    : PL_OUTCOME_DISCONNECT;
                        m_remove(&m, k, pick, oc);
                        pl_engine_settle(e, o->w, oc);
                        break;
                    }
                    pick -= m.n[k];
                }
            }
        } else if (op == 3) {
            now += rnd(40);
            CHECK_EQ(pl_engine_expire(e, now), m_expire(&m, now));
        } else if (op == 4) {
            m_drain(&m);
            pl_engine_drain(e);
        } else if (op == 5) {
            /* a reload's judge, or the ring's */
            pl_outcome oc = rnd(2) ? PL_OUTCOME_REVOKED : PL_OUTCOME_MOVED;
            size_t n;
            m_bad_tag = rnd(4);
            n = pl_engine_settle_if(e, oc, judge_tag, NULL); /* judged on the tags before */
            m_revoke(&m, oc);
            CHECK_EQ(n, m.nwant);
        } else if (op == 6) {
            static const uint32_t maxes[] = {0, 2, 5, 9, 30};
            pl_engine_opts opts = {order, maxes[rnd(5)], maxes[rnd(4)], timeout, settle_cb};
            m.max = opts.max_waiters;
            m.per_key = opts.max_waiters_per_key;
            pl_engine_set_opts(e, &opts);
            m_enforce_caps(&m);
            CHECK_EQ(pl_engine_enforce_caps(e), m.nwant);
        } else {
            size_t live = m_live(&m), pick = live ? rnd((uint32_t)live) : 0;
            int release = rnd(3) == 0;
            for (int k = 0; k < M_KEYS; k++)
                for (size_t i = 0; i < m.n[k]; i++, pick--) {
                    owner_t *o = m.q[k][i];
                    if (release ? o->held : pick == 0) {
                        o->held = !release;
                        pl_engine_hold(e, o->w, !release);
                    }
                }
        }
        m_check(&m, e, offered, variant);
        if (unit_failures != fail0) {
            fprintf(stderr,
                    "  model: seed=%llu order=%s max=%u per_key=%u "
                    "timeout=%llu: diverged at step %d (%s)\n",
                    (unsigned long long)seed,
                    order == PL_ORDER_FIFO ? "fifo" : "lifo", max, per_key,
                    (unsigned long long)timeout, step, op_names[op]);
            break;
        }
    }

    /* Freeing settles the rest; then every owner was settled once. */
    log_reset();
    m.nwant = 0;
    m_drain(&m);
    pl_engine_free(e);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        m_seen[i] += m.settled[i];
    if (unit_failures == fail0) {
        CHECK_EQ(log_len, m.nwant);
        for (size_t i = 0; i < nowners; i++)
            CHECK_EQ(m_owners[i].calls, 1);
        CHECK_EQ(double_settles, 0);
    }
    return unit_failures != fail0;
}

static void test_model(void)
{
    static const uint64_t seeds[] = {1, 2, 3, 20240611};
    static const uint32_t caps[][2] = {{0, 0}, {7, 3}};
    static const uint64_t timeouts[] = {0, 60};

    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++)
        for (int order = 0; order < 2; order++)
            for (int c = 0; c < 2; c++)
                for (int t = 0; t < 2; t++)
                    model_run(seeds[s], (pl_order)order, caps[c][0],
                              caps[c][1], timeouts[t]);
    /* The random steps reached every outcome, refusals included, but the
     * one a pending delivery alone ends in (test_pending_delivery_aborted). */
    for (int i = 0; i < PL_OUTCOME__COUNT; i++) {
        if (i == PL_OUTCOME_ABORTED)
            continue;
        if (m_seen[i] < 100)
            fprintf(stderr, "  model: only %llu %s\n",
                    (unsigned long long)m_seen[i],
                    pl_outcome_name((pl_outcome)i));
        CHECK(m_seen[i] >= 100);
    }
}

/* A delivery left pending stays counted as parked, out of every queue,
 * until pl_engine_confirm() says how it ended. */

int main(void)
{
    RUN(test_model);
    return unit_finish();
}
