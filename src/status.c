/* status.c -- /metrics and /debug/waiters: what the broker is doing. */
#include <string.h>

#include <cJSON.h>

#include "pilotlight/mem.h"
#include "pilotlight/proc.h"
#include "pilotlight/status.h"

#define METRICS_BUFFER_SIZE 32768

/* /debug/waiters lists at most this many keys. */
#define DEBUG_KEYS_MAX 1000

struct pl_status {
    uv_loop_t *loop;
    const pl_engine *engine;
    pl_metrics *m;
    const pl_config *cfg;
    const pl_http *https[2];
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
    return st;
}

void pl_status_attach(pl_status *st, const pl_http *h)
{
    st->https[st->https[0] != NULL] = h;
}

void pl_status_free(pl_status *st)
{
    pl_free(st);
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

static void waiters_key(const pl_key_info *info, void *arg)
{
    waiters_out *o = arg;
    char dep[PL_KEY_FIELD_MAX + 1], ver[PL_KEY_FIELD_MAX + 1];
    cJSON *k = cJSON_CreateObject();

    /* Key strings hold no NUL (a header cannot, a body's is refused). */
    memcpy(dep, info->key.deployment, info->key.deployment_len);
    dep[info->key.deployment_len] = '\0';
    memcpy(ver, info->key.version, info->key.version_len);
    ver[info->key.version_len] = '\0';
    if (k == NULL || !cJSON_AddItemToArray(o->keys, k) ||
        cJSON_AddStringToObject(k, "deployment", dep) == NULL ||
        cJSON_AddStringToObject(k, "version", ver) == NULL ||
        cJSON_AddNumberToObject(k, "cpu", info->key.cpu) == NULL ||
        cJSON_AddNumberToObject(k, "memory", info->key.memory) == NULL ||
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
