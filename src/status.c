/* status.c -- /metrics, /debug/waiters and /debug/status: what the broker
 * is doing; and what /status shows, gathered (status_page.c writes it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#include "pilotlight/buf.h"
#include "pilotlight/hash.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/proc.h"
#include "pilotlight/status.h"
#include "pilotlight/token.h"
#include "status_view.h"

#define METRICS_BUFFER_SIZE 32768

/* /debug/waiters lists at most this many keys. */
#define DEBUG_KEYS_MAX 1000

struct pl_status {
    uv_loop_t *loop;
    const pl_engine *engine;
    pl_metrics *m;
    const pl_config *cfg;
    const pl_http *https[2];
    const pl_peers *peers;
    pl_diag *diag;
    char metrics_buf[METRICS_BUFFER_SIZE];
};

pl_status *pl_status_new(uv_loop_t *loop, const pl_engine *engine, pl_metrics *m,
                         const pl_config *cfg)
{
    pl_status *st = pl_malloc(sizeof(*st));

    if (st == NULL)
        return NULL;
    memset(st, 0, offsetof(pl_status, metrics_buf));
    st->loop = loop;
    st->engine = engine;
    st->m = m;
    st->cfg = cfg;
    if ((st->diag = pl_diag_new(engine)) == NULL) {
        pl_free(st);
        return NULL;
    }
    return st;
}

void pl_status_attach(pl_status *st, const pl_http *h)
{
    st->https[st->https[0] != NULL] = h;
}

void pl_status_set_peers(pl_status *st, const pl_peers *p)
{
    st->peers = p;
}

void pl_status_log_ledger(const pl_status *st)
{
    const pl_ledger *l = pl_engine_ledger(st->engine);
    char settled[PL_OUTCOME__COUNT * 40], *p = settled;

    if (PL_LOG_INFO > pl_log_threshold)
        return;
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        p += snprintf(p, sizeof(settled) - (size_t)(p - settled), "%s\"%s\":%llu",
                      i ? "," : "", pl_outcome_name((pl_outcome)i),
                      (unsigned long long)l->settled[i]);
    PL_LOG(PL_LOG_INFO, "ledger",
           "\"parked_total\":%llu,\"adopted\":%llu,\"parked_now\":%llu,\"settled\":{%s}",
           (unsigned long long)l->parked_total, (unsigned long long)l->adopted,
           (unsigned long long)l->parked_now, settled);
}

void pl_status_free(pl_status *st)
{
    if (st == NULL)
        return;
    pl_diag_free(st->diag);
    pl_free(st);
}

pl_diag *pl_status_diag(pl_status *st)
{
    return st->diag;
}

void pl_status_token_refused(pl_status *st, const pl_key *key, int token, int enforced,
                             uint64_t now)
{
    pl_diag_token_refused(st->diag, key, token, enforced, now);
}

/* ---- /metrics ---- */

/* The figures read at scrape time: what is in effect, the connections,
 * the process. */
static void refresh(pl_status *st)
{
    pl_metrics *m = st->m;

    m->max_waiters = st->cfg->max_waiters;
    m->max_waiters_per_key = st->cfg->max_waiters_per_key;
    m->max_connections = st->cfg->max_connections;
    m->connections_open = 0;
    memset(m->refused, 0, sizeof(m->refused));
    for (int i = 0; i < 2; i++) {
        if (st->https[i] == NULL)
            continue;
        m->connections_open += pl_http_connections(st->https[i]);
        for (unsigned r = 0; r < PL_HTTP_REFUSED__COUNT; r++)
            m->refused[r] += pl_http_refused(st->https[i], r);
    }
    m->proc_ok = pl_proc_read(&m->proc) == 0;
}

void pl_status_metrics(pl_status *st, pl_conn *c)
{
    size_t len;

    refresh(st);
    len = pl_metrics_render(st->m, pl_engine_ledger(st->engine),
                            pl_engine_key_count(st->engine), st->metrics_buf,
                            sizeof(st->metrics_buf));
    if (len == 0)
        pl_conn_respond_error(c, 500, "metrics do not fit their buffer");
    else
        pl_conn_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL,
                        st->metrics_buf, len);
}

/* ---- /debug/waiters ---- */

typedef struct {
    cJSON *keys;
    uint64_t now;
    int failed;
} waiters_out;

/* Adds <s> (<len> bytes, no NUL: a header cannot hold one, a body's is
 * refused) to <o> as <name>. Returns 0, or -1 when out of memory. */
static int add_text(cJSON *o, const char *name, const char *s, size_t len)
{
    char buf[PL_KEY_FIELD_MAX + 1];

    if (len > PL_KEY_FIELD_MAX)
        len = PL_KEY_FIELD_MAX;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return cJSON_AddStringToObject(o, name, buf) != NULL ? 0 : -1;
}

/* Adds <k>'s four fields to <o>. Returns 0, or -1 when out of memory. */
static int add_key(cJSON *o, const pl_key *k)
{
    return o == NULL || add_text(o, "deployment", k->deployment, k->deployment_len) != 0 ||
                   add_text(o, "version", k->version, k->version_len) != 0 ||
                   cJSON_AddNumberToObject(o, "cpu", k->cpu) == NULL ||
                   cJSON_AddNumberToObject(o, "memory", k->memory) == NULL
               ? -1
               : 0;
}

static void waiters_key(const pl_key_info *info, void *arg)
{
    waiters_out *o = arg;
    cJSON *k = cJSON_CreateObject();

    if (k == NULL || !cJSON_AddItemToArray(o->keys, k) || add_key(k, &info->key) != 0 ||
        cJSON_AddNumberToObject(k, "parked", (double)info->parked) == NULL ||
        cJSON_AddNumberToObject(k, "oldest_wait_ms",
                                (double)(o->now - info->oldest_parked_at)) == NULL)
        o->failed = 1;
}

void pl_status_waiters(pl_status *st, pl_conn *c)
{
    waiters_out o = {NULL, uv_now(st->loop), 0};
    cJSON *root = cJSON_CreateObject();
    size_t total = 0;
    char *text = NULL;

    if (root != NULL && (o.keys = cJSON_AddArrayToObject(root, "keys")) != NULL) {
        total = pl_engine_each_key(st->engine, DEBUG_KEYS_MAX, waiters_key, &o);
        if (!o.failed &&
            cJSON_AddNumberToObject(root, "total_keys", (double)total) != NULL &&
            cJSON_AddNumberToObject(root, "parked",
                                    (double)pl_engine_ledger(st->engine)->parked_now) != NULL &&
            cJSON_AddBoolToObject(root, "truncated", total > DEBUG_KEYS_MAX) != NULL)
            text = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    if (text == NULL)
        pl_conn_respond_error(c, 503, "out of memory");
    else
        pl_conn_respond_json(c, 200, text);
    cJSON_free(text);
}

/* ---- what /status and /debug/status show, gathered once ---- */

static const double quantiles[3] = {0.5, 0.9, 0.99};

/* The <q> quantile of <h>, as Prometheus's histogram_quantile() reads the
 * buckets (linear within one; the highest finite bound past them). */
static double quantile(const pl_histogram *h, double q)
{
    double rank = q * (double)h->count, prev = 0, cum = 0;

    for (size_t i = 0; i < h->nbounds; i++) {
        cum += (double)h->counts[i];
        if (cum >= rank) {
            double lower = i == 0 ? 0 : h->bounds[i - 1];
            return lower + (h->bounds[i] - lower) * (rank - prev) / (double)h->counts[i];
        }
        prev = cum;
    }
    return h->bounds[h->nbounds - 1];
}

static pl_status_row *add_row(pl_status_view *s, const pl_key *k)
{
    pl_status_row *r = &s->rows[s->nrows];

    r->dep = s->text.len;
    r->dep_len = (uint16_t)k->deployment_len;
    r->ver = s->text.len + (uint32_t)k->deployment_len;
    r->ver_len = (uint16_t)k->version_len;
    if (pl_buf_append(&s->text, k->deployment, k->deployment_len) != 0 ||
        pl_buf_append(&s->text, k->version, k->version_len) != 0) {
        s->failed = 1;
        return NULL;
    }
    r->cpu = k->cpu;
    r->memory = k->memory;
    r->parked = 0;
    r->oldest_wait_ms = 0;
    memset(&r->w, 0, sizeof(r->w));
    s->nrows++;
    return r;
}

static void parked_row(const pl_key_info *info, void *arg)
{
    pl_status_view *s = arg;
    unsigned char enc[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(&info->key, enc);
    pl_status_row *r = add_row(s, &info->key);

    if (r == NULL)
        return;
    r->parked = info->parked;
    r->oldest_wait_ms = s->now - info->oldest_parked_at;
    pl_diag_key_window(s->diag, enc, len, pl_hash(enc, len, 0), s->now, &r->w);
}

static void dispatched_row(const pl_key *k, const pl_diag_window *w, void *arg)
{
    pl_status_view *s = arg;
    pl_status_row *r;

    if (pl_engine_waiting(s->engine, k) > 0)
        return; /* a row already, or among the parked keys left out */
    if ((r = add_row(s, k)) != NULL)
        r->w = *w;
}

static int text_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);

    return c != 0 ? c : (alen > blen) - (alen < blen);
}

/* Most parked first, then most dispatched to, then by name (<text>: the
 * rows' strings). */
static int row_cmp(const void *pa, const void *pb, void *text)
{
    const pl_status_row *a = pa, *b = pb;
    const char *sort_text = text;
    uint64_t da = a->w.total_hits + a->w.total_misses, db = b->w.total_hits + b->w.total_misses;
    int c;

    if (a->parked != b->parked)
        return a->parked > b->parked ? -1 : 1;
    if (da != db)
        return da > db ? -1 : 1;
    c = text_cmp(sort_text + a->dep, a->dep_len, sort_text + b->dep, b->dep_len);
    if (c == 0)
        c = text_cmp(sort_text + a->ver, a->ver_len, sort_text + b->ver, b->ver_len);
    if (c == 0)
        c = a->cpu != b->cpu ? (a->cpu < b->cpu ? -1 : 1)
                             : (a->memory > b->memory) - (a->memory < b->memory);
    return c;
}

static void newest_miss(const pl_diag_event *ev, void *arg)
{
    char *buf = arg;

    if (buf[0] == '\0')
        pl_diag_why(ev, buf, PL_STATUS_WORDS_MAX);
}

/* The health line: the first thing that would stop warm starts, else how
 * they go. */
static void health(pl_status_view *s)
{
    const pl_metrics *m = s->m;
    const pl_ledger *l = pl_engine_ledger(s->engine);
    uint64_t polls = l->parked_total + l->adopted, dispatches = 0, refused;
    uint64_t h = s->all.total_hits, n = h + s->all.total_misses;
    char why[PL_STATUS_WORDS_MAX] = "";

    for (int i = 0; i < PL_DISPATCH__COUNT; i++)
        dispatches += m->dispatch[i];
    refused = m->token[PL_TOKEN_INVALID] + m->token[PL_TOKEN_LEGACY] + m->token[PL_TOKEN_ABSENT];
    s->state = "warn";
    if (s->draining) {
        snprintf(s->health, sizeof(s->health),
                 "Draining: this instance is stopping and parks no more polls.");
    } else if (s->cfg->warm_starts == PL_WARM_STARTS_OFF) {
        snprintf(s->health, sizeof(s->health),
                 "Warm starts are off (warm_starts = off): every dispatch is answered false "
                 "at once, and controllers exit at their next /connect.");
    } else if (polls == 0 && refused > 0 && s->cfg->token_mode == PL_TOKEN_MODE_ENFORCE) {
        s->state = "bad";
        snprintf(s->health, sizeof(s->health),
                 "Every poll was refused 401 (%llu): its deployment token did not verify. "
                 "Is token_secret the supervisor's WORKLOAD_TOKEN_SECRET?",
                 (unsigned long long)refused);
    } else if (polls == 0) {
        snprintf(s->health, sizeof(s->health),
                 "No controller has polled this instance yet. Is TRIGGER_WARM_START_URL set "
                 "on the supervisor, and can the run containers reach this address?");
    } else if (dispatches == 0) {
        snprintf(s->health, sizeof(s->health),
                 "Controllers poll, but no dispatch has arrived. Does the supervisor's "
                 "TRIGGER_WARM_START_DISPATCH_URL (or, without it, TRIGGER_WARM_START_URL) "
                 "lead to this instance's dispatch address?");
    } else if (n == 0) {
        s->state = "idle";
        snprintf(s->health, sizeof(s->health),
                 "No dispatch in the last %d minutes; %llu controller%s parked.",
                 PL_DIAG_MINUTES, (unsigned long long)l->parked_now,
                 l->parked_now == 1 ? " is" : "s are");
    } else if (h == 0) {
        s->state = "bad";
        pl_diag_each_event(s->diag, 1, newest_miss, why);
        snprintf(s->health, sizeof(s->health),
                 "Every dispatch in the last %d minutes missed (%llu); the last because %s.",
                 PL_DIAG_MINUTES, (unsigned long long)n, why);
    } else {
        s->state = "ok";
        snprintf(s->health, sizeof(s->health),
                 "Warm starts are happening: %llu of %llu dispatches in the last %d minutes "
                 "hit (%llu %%).",
                 (unsigned long long)h, (unsigned long long)n, PL_DIAG_MINUTES,
                 (unsigned long long)(h * 100 / n));
    }
}

static uint64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int pl__status_view(pl_status *st, int draining, pl_status_view *s)
{
    const pl_histogram *h = &st->m->dispatch_seconds;
    size_t total;

    memset(s, 0, sizeof(*s));
    s->engine = st->engine;
    s->diag = st->diag;
    s->m = st->m;
    s->cfg = st->cfg;
    s->peers = st->peers;
    s->now = uv_now(st->loop);
    s->wall_ms = wall_ms();
    s->draining = draining;
    s->keys = pl_engine_key_count(st->engine);
    pl_diag_window_all(st->diag, s->now, &s->all);
    s->rows = pl_malloc(sizeof(pl_status_row) * (PL_STATUS_PAGE_KEYS + PL_DIAG_KEYS));
    if (s->rows == NULL)
        return -ENOMEM;
    total = pl_engine_each_key(st->engine, PL_STATUS_PAGE_KEYS, parked_row, s);
    s->truncated = total > PL_STATUS_PAGE_KEYS;
    pl_diag_each_key(st->diag, s->now, dispatched_row, s);
    qsort_r(s->rows, s->nrows, sizeof(pl_status_row), row_cmp, s->text.data);
    health(s);
    if ((s->have_q = h->count > 0))
        for (int i = 0; i < 3; i++)
            s->q_us[i] = (uint64_t)(quantile(h, quantiles[i]) * 1e6 + 0.5);
    return s->failed ? -ENOMEM : 0;
}

void pl__status_view_release(pl_status_view *s)
{
    pl_free(s->rows);
    pl_buf_free(&s->text);
}

uint64_t pl__status_wall(const pl_status_view *s, uint64_t at)
{
    return s->wall_ms - (s->now - at);
}

static const char *const result_names[PL_DISPATCH__COUNT] = {
    "hit", "miss", "invalid", "abandoned", "unconfirmed", "off",
};

const char *pl__status_result_name(pl_dispatch_result r)
{
    return (unsigned)r < PL_DISPATCH__COUNT ? result_names[r] : "unknown";
}

static const char *const token_modes[] = {"disabled", "log", "enforce"};

/* ---- /debug/status ---- */

typedef struct {
    const pl_status_view *s;
    cJSON *list;
    int failed;
} json_out;

static cJSON *minutes_json(const pl_diag_window *w)
{
    cJSON *o = cJSON_CreateObject(), *hits, *misses;

    if (o == NULL || (hits = cJSON_AddArrayToObject(o, "hits")) == NULL ||
        (misses = cJSON_AddArrayToObject(o, "misses")) == NULL) {
        cJSON_Delete(o);
        return NULL;
    }
    for (int i = 0; i < PL_DIAG_MINUTES; i++) {
        cJSON *a = cJSON_CreateNumber(w->hits[i]), *b = cJSON_CreateNumber(w->misses[i]);
        int ok = a != NULL && b != NULL;

        if (a != NULL)
            cJSON_AddItemToArray(hits, a);
        if (b != NULL)
            cJSON_AddItemToArray(misses, b);
        if (!ok) {
            cJSON_Delete(o);
            return NULL;
        }
    }
    return o;
}

static int add_ratio(cJSON *o, uint64_t hits, uint64_t misses)
{
    return (hits + misses == 0 ? cJSON_AddNullToObject(o, "hit_ratio")
                               : cJSON_AddNumberToObject(o, "hit_ratio",
                                                         (double)hits / (double)(hits + misses))) !=
                   NULL
               ? 0
               : -1;
}

static int pool_json(const pl_status_view *s, cJSON *root)
{
    cJSON *list = cJSON_AddArrayToObject(root, "pool");

    if (list == NULL)
        return -1;
    for (size_t i = 0; i < s->nrows; i++) {
        const pl_status_row *r = &s->rows[i];
        pl_key k = {s->text.data + r->dep, r->dep_len, s->text.data + r->ver, r->ver_len,
                    r->cpu, r->memory};
        cJSON *o = cJSON_CreateObject(), *mins;

        if (o == NULL || !cJSON_AddItemToArray(list, o) || add_key(o, &k) != 0 ||
            cJSON_AddNumberToObject(o, "parked", (double)r->parked) == NULL ||
            cJSON_AddNumberToObject(o, "oldest_wait_ms", (double)r->oldest_wait_ms) == NULL ||
            cJSON_AddNumberToObject(o, "hits", (double)r->w.total_hits) == NULL ||
            cJSON_AddNumberToObject(o, "misses", (double)r->w.total_misses) == NULL ||
            add_ratio(o, r->w.total_hits, r->w.total_misses) != 0 ||
            (mins = minutes_json(&r->w)) == NULL)
            return -1;
        cJSON_AddItemToObject(o, "minutes", mins);
    }
    return 0;
}

static void event_json(const pl_diag_event *ev, void *arg)
{
    json_out *o = arg;
    cJSON *e = cJSON_CreateObject(), *near;
    char why[PL_STATUS_WORDS_MAX];
    int miss = ev->result != PL_DISPATCH_HIT;

    if (e == NULL || !cJSON_AddItemToArray(o->list, e) ||
        cJSON_AddNumberToObject(e, "time", (double)pl__status_wall(o->s, ev->at)) == NULL ||
        add_key(e, &ev->key) != 0 ||
        cJSON_AddStringToObject(e, "result", result_names[ev->result]) == NULL ||
        cJSON_AddBoolToObject(e, "answer", !miss) == NULL ||
        cJSON_AddNumberToObject(e, "took_us", (double)((ev->took_ns + 500) / 1000)) == NULL) {
        o->failed = 1;
        return;
    }
    if (!miss) {
        if (cJSON_AddNumberToObject(e, "waited_ms", (double)ev->waited_ms) == NULL)
            o->failed = 1;
        return;
    }
    if (cJSON_AddStringToObject(e, "run", ev->run) == NULL ||
        cJSON_AddBoolToObject(e, "run_cut", ev->run_cut) == NULL ||
        (ev->result == PL_DISPATCH_MISS
             ? cJSON_AddStringToObject(e, "nearest", pl_nearest_name(ev->nearest))
             : cJSON_AddNullToObject(e, "nearest")) == NULL ||
        cJSON_AddStringToObject(e, "why", pl_diag_why(ev, why, sizeof(why))) == NULL) {
        o->failed = 1;
        return;
    }
    if (!ev->has_near) {
        if (cJSON_AddNullToObject(e, "nearest_key") == NULL)
            o->failed = 1;
        return;
    }
    near = cJSON_AddObjectToObject(e, "nearest_key");
    if (add_key(near, &ev->near) != 0 ||
        cJSON_AddNumberToObject(near, "parked", (double)ev->near_parked) == NULL)
        o->failed = 1;
}

static int events_json(const pl_status_view *s, cJSON *root, const char *name, int misses)
{
    json_out o = {s, cJSON_AddArrayToObject(root, name), 0};

    if (o.list == NULL)
        return -1;
    pl_diag_each_event(s->diag, misses, event_json, &o);
    return o.failed ? -1 : 0;
}

static void peer_json(const pl_peer_info *p, void *arg)
{
    json_out *o = arg;
    cJSON *e = cJSON_CreateObject();

    if (e == NULL || !cJSON_AddItemToArray(o->list, e) ||
        cJSON_AddStringToObject(e, "name", p->name) == NULL ||
        cJSON_AddStringToObject(e, "state", p->self ? "self" : p->up ? "up" : "down") == NULL ||
        cJSON_AddNumberToObject(e, "failed_checks", p->failed) == NULL)
        o->failed = 1;
}

static int ring_json(const pl_status_view *s, cJSON *root)
{
    json_out o = {s, NULL, 0};
    cJSON *ring;

    if (s->peers == NULL)
        return cJSON_AddNullToObject(root, "ring") != NULL ? 0 : -1;
    if ((ring = cJSON_AddObjectToObject(root, "ring")) == NULL ||
        cJSON_AddNumberToObject(ring, "members", (double)s->m->ring_members) == NULL ||
        (o.list = cJSON_AddArrayToObject(ring, "peers")) == NULL)
        return -1;
    pl_peers_each(s->peers, peer_json, &o);
    return o.failed ? -1 : 0;
}

static int counts_json(const pl_status_view *s, cJSON *root)
{
    const pl_metrics *m = s->m;
    cJSON *d = cJSON_AddObjectToObject(root, "dispatches");
    cJSON *n = cJSON_AddObjectToObject(root, "misses_by_nearest");
    cJSON *t = cJSON_AddObjectToObject(root, "tokens");

    if (d == NULL || n == NULL || t == NULL ||
        cJSON_AddStringToObject(t, "mode", token_modes[s->cfg->token_mode]) == NULL)
        return -1;
    for (int i = 0; i < PL_DISPATCH__COUNT; i++)
        if (cJSON_AddNumberToObject(d, result_names[i], (double)m->dispatch[i]) == NULL)
            return -1;
    for (int i = 0; i < PL_NEAREST__COUNT; i++)
        if (cJSON_AddNumberToObject(n, pl_nearest_name((pl_nearest)i),
                                    (double)m->miss_nearest[i]) == NULL)
            return -1;
    for (int i = 0; i < 4; i++) {
        static const char *const names[4] = {"valid", "invalid", "legacy", "absent"};
        if (cJSON_AddNumberToObject(t, names[i], (double)m->token[i]) == NULL)
            return -1;
    }
    return 0;
}

static int summary_json(const pl_status_view *s, cJSON *root)
{
    cJSON *h = cJSON_AddObjectToObject(root, "health");
    cJSON *w = cJSON_AddObjectToObject(root, "window");
    cJSON *q = cJSON_AddObjectToObject(root, "answer_us"), *mins;

    if (h == NULL || w == NULL || q == NULL ||
        cJSON_AddStringToObject(root, "version", PL_VERSION) == NULL ||
        cJSON_AddNumberToObject(root, "time", (double)s->wall_ms) == NULL ||
        cJSON_AddBoolToObject(root, "draining", s->draining) == NULL ||
        cJSON_AddNumberToObject(root, "parked",
                                (double)pl_engine_ledger(s->engine)->parked_now) == NULL ||
        cJSON_AddNumberToObject(root, "keys", (double)s->keys) == NULL ||
        cJSON_AddBoolToObject(root, "pool_truncated", s->truncated) == NULL ||
        cJSON_AddStringToObject(h, "state", s->state) == NULL ||
        cJSON_AddStringToObject(h, "text", s->health) == NULL ||
        cJSON_AddNumberToObject(w, "minutes", PL_DIAG_MINUTES) == NULL ||
        cJSON_AddNumberToObject(w, "hits", (double)s->all.total_hits) == NULL ||
        cJSON_AddNumberToObject(w, "misses", (double)s->all.total_misses) == NULL ||
        add_ratio(w, s->all.total_hits, s->all.total_misses) != 0 ||
        (mins = minutes_json(&s->all)) == NULL)
        return -1;
    cJSON_AddItemToObject(w, "per_minute", mins);
    for (int i = 0; i < 3; i++) {
        static const char *const names[3] = {"p50", "p90", "p99"};
        if ((s->have_q ? cJSON_AddNumberToObject(q, names[i], (double)s->q_us[i])
                       : cJSON_AddNullToObject(q, names[i])) == NULL)
            return -1;
    }
    return cJSON_AddNumberToObject(q, "count", (double)s->m->dispatch_seconds.count) != NULL
               ? 0
               : -1;
}

void pl_status_json(pl_status *st, pl_conn *c, int draining)
{
    pl_status_view s;
    cJSON *root = NULL;
    char *text = NULL;

    if (pl__status_view(st, draining, &s) == 0 && (root = cJSON_CreateObject()) != NULL &&
        summary_json(&s, root) == 0 && counts_json(&s, root) == 0 && pool_json(&s, root) == 0 &&
        events_json(&s, root, "matches", 0) == 0 && events_json(&s, root, "misses", 1) == 0 &&
        ring_json(&s, root) == 0)
        text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    pl__status_view_release(&s);
    if (text == NULL)
        pl_conn_respond_error(c, 503, "out of memory");
    else
        pl_conn_respond(c, 200, "application/json", "Cache-Control: no-store\r\n", text,
                        strlen(text));
    cJSON_free(text);
}

