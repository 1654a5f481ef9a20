/* broker.c -- the endpoints of PROTOCOL.md, on top of the engine. */
#include <stdio.h>
#include <string.h>

#include <llhttp.h>

#include "pilotlight/broker.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/token.h"

#define CONTROLLER_ID_MAX 256
#define METRICS_BUFFER_SIZE 16384

static const char json_type[] = "application/json";

struct pl_broker {
    uv_loop_t *loop;
    const pl_config *cfg;
    const pl_http *http;
    pl_engine *engine;
    uv_timer_t timer; /* the engine's next park timeout */
    pl_metrics metrics;
    int draining, closing;
    size_t connect_len;
    char connect_body[96];
    char metrics_buf[METRICS_BUFFER_SIZE];
};

static void reply_error(pl_conn *c, int status, const char *msg)
{
    char body[256];
    int n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}", msg);

    pl_conn_respond(c, status, json_type, NULL, body, (size_t)n);
}

static void reply_json(pl_conn *c, int status, const char *body)
{
    pl_conn_respond(c, status, json_type, NULL, body, strlen(body));
}

/* The engine's settle callback: the one place a parked poll is answered. */
static int on_settle(void *owner, pl_outcome outcome, const void *arg)
{
    pl_conn *c = owner;
    const pl_message *m = arg;

    pl_conn_set_data(c, NULL); /* the waiter is gone after this call */
    switch (outcome) {
    case PL_OUTCOME_MATCHED:
        return pl_conn_respond(c, 200, json_type, NULL, m->payload, m->payload_len);
    case PL_OUTCOME_TIMEOUT:
        pl_conn_respond(c, 204, NULL, NULL, NULL, 0);
        break;
    case PL_OUTCOME_REPLACED:
        reply_error(c, 409, "replaced by a newer poll from the same controller");
        break;
    case PL_OUTCOME_REJECTED:
        reply_error(c, 503, arg);
        break;
    case PL_OUTCOME_SHUTDOWN:
        pl_conn_close(c); /* no answer: the controller re-polls elsewhere */
        break;
    case PL_OUTCOME_DISCONNECT:
    case PL_OUTCOME__COUNT:
        break;
    }
    return 0;
}

static void timer_cb(uv_timer_t *t);

static void timer_arm(pl_broker *b)
{
    uint64_t due, now = uv_now(b->loop);

    if (pl_engine_next_deadline(b->engine, &due) == 0)
        uv_timer_start(&b->timer, timer_cb, due > now ? due - now : 0, 0);
}

static void timer_cb(uv_timer_t *t)
{
    pl_broker *b = (pl_broker *)((char *)t - offsetof(pl_broker, timer));

    pl_engine_expire(b->engine, uv_now(b->loop));
    timer_arm(b);
}

pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg)
{
    pl_engine_opts opts = {
        .order = cfg->match_order,
        .max_waiters = (uint32_t)cfg->max_waiters,
        .max_waiters_per_key = (uint32_t)cfg->max_waiters_per_key,
        .park_timeout_ms = cfg->park_timeout_ms,
        .settle = on_settle,
    };
    pl_broker *b = pl_malloc(sizeof(*b));

    if (b == NULL)
        return NULL;
    memset(b, 0, offsetof(pl_broker, metrics_buf));
    b->engine = pl_engine_new(&opts);
    if (b->engine == NULL) {
        pl_free(b);
        return NULL;
    }
    b->loop = loop;
    b->cfg = cfg;
    pl_metrics_init(&b->metrics);
    b->connect_len = (size_t)snprintf(b->connect_body, sizeof(b->connect_body),
                                      "{\"connectionTimeoutMs\":%llu,\"keepaliveMs\":%llu}",
                                      (unsigned long long)cfg->connection_timeout_ms,
                                      (unsigned long long)cfg->keepalive_ms);
    uv_timer_init(loop, &b->timer);
    return b;
}

void pl_broker_attach(pl_broker *b, const pl_http *h)
{
    b->http = h;
}

/* ---- GET /warm-start: park ---- */

static const char *const header_names[PL_HDR__COUNT] = {
    "x-trigger-workload-controller-id", "x-trigger-deployment-id",
    "x-trigger-deployment-version", "x-trigger-machine-cpu",
    "x-trigger-machine-memory", "authorization",
};

/* Fills <key> from the poll's headers; <dep> receives a token's deployment
 * claim. Returns NULL, or the error message for a 400 in <msg>. */
static const char *key_from_headers(const pl_request *req, pl_key *key,
                                    char *dep, char *msg, size_t msglen)
{
    static const pl_header required[] = {
        PL_HDR_CONTROLLER_ID, PL_HDR_DEPLOYMENT_ID, PL_HDR_DEPLOYMENT_VERSION,
        PL_HDR_MACHINE_CPU, PL_HDR_MACHINE_MEMORY,
    };
    const char *id = req->header[PL_HDR_DEPLOYMENT_ID];
    size_t id_len = req->header_len[PL_HDR_DEPLOYMENT_ID];

    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        pl_header h = required[i];
        if (req->header[h] == NULL || req->header_len[h] == 0) {
            snprintf(msg, msglen, "missing header %s", header_names[h]);
            return msg;
        }
    }
    if (req->header_len[PL_HDR_CONTROLLER_ID] > CONTROLLER_ID_MAX)
        return "x-trigger-workload-controller-id is too long";
    if (pl_token_is_jwt(id, id_len)) {
        long n = pl_token_deployment(id, id_len, dep, PL_KEY_FIELD_MAX + 1);
        if (n < 0)
            return "x-trigger-deployment-id is a token without a deployment claim";
        id = dep;
        id_len = (size_t)n;
    }
    if (id_len > PL_KEY_FIELD_MAX)
        return "x-trigger-deployment-id is too long";
    if (req->header_len[PL_HDR_DEPLOYMENT_VERSION] > PL_KEY_FIELD_MAX)
        return "x-trigger-deployment-version is too long";
    key->deployment = id;
    key->deployment_len = id_len;
    key->version = req->header[PL_HDR_DEPLOYMENT_VERSION];
    key->version_len = req->header_len[PL_HDR_DEPLOYMENT_VERSION];
    if (pl_key_parse_number(req->header[PL_HDR_MACHINE_CPU],
                            req->header_len[PL_HDR_MACHINE_CPU], &key->cpu) != 0)
        return "x-trigger-machine-cpu must be a number";
    if (pl_key_parse_number(req->header[PL_HDR_MACHINE_MEMORY],
                            req->header_len[PL_HDR_MACHINE_MEMORY], &key->memory) != 0)
        return "x-trigger-machine-memory must be a number";
    return NULL;
}

static void handle_park(pl_broker *b, pl_conn *c, const pl_request *req)
{
    char dep[PL_KEY_FIELD_MAX + 1], msg[96];
    const char *err;
    pl_waiter *w;
    pl_key key;
    int rc;

    err = key_from_headers(req, &key, dep, msg, sizeof(msg));
    if (err != NULL) {
        reply_error(c, 400, err);
        return;
    }
    if (b->closing) {
        pl_conn_close(c); /* as if it had parked just before the drain */
        return;
    }
    rc = pl_engine_park(b->engine, &key, req->header[PL_HDR_CONTROLLER_ID],
                        req->header_len[PL_HDR_CONTROLLER_ID], c,
                        uv_now(b->loop), &w);
    if (rc == PL_ENOMEM) {
        reply_error(c, 503, "out of memory");
    } else if (rc == PL_EINVAL) {
        reply_error(c, 400, "x-trigger-deployment-id or -version is empty or too long");
    } else if (rc == 0) {
        pl_conn_set_data(c, w);
        if (!uv_is_active((uv_handle_t *)&b->timer))
            timer_arm(b);
    }
}

/* ---- POST /warm-start: dispatch ---- */

static void handle_dispatch(pl_broker *b, pl_conn *c, const pl_request *req)
{
    uint64_t start = uv_hrtime(), waited_ms = 0;
    const char *err = NULL;
    pl_message m;
    int rc, hit;

    rc = pl_message_parse(req->body, req->body_len, &m, &err);
    if (rc == PL_MESSAGE_EINVAL) {
        b->metrics.dispatch[PL_DISPATCH_INVALID]++;
        reply_error(c, 400, err);
        return;
    }
    if (rc == PL_MESSAGE_ENOMEM) {
        reply_error(c, 503, "out of memory");
        return;
    }
    hit = pl_engine_deliver(b->engine, &m.key, &m, uv_now(b->loop), &waited_ms);
    pl_message_release(&m);
    reply_json(c, 200, hit ? "{\"didWarmStart\":true}" : "{\"didWarmStart\":false}");
    b->metrics.dispatch[hit ? PL_DISPATCH_HIT : PL_DISPATCH_MISS]++;
    if (hit)
        pl_metrics_observe(&b->metrics.wait_seconds, (double)waited_ms / 1e3);
    pl_metrics_observe(&b->metrics.dispatch_seconds, (double)(uv_hrtime() - start) / 1e9);
}

/* ---- the rest ---- */

static void handle_metrics(pl_broker *b, pl_conn *c)
{
    size_t len;

    b->metrics.connections_open = b->http ? pl_http_connections(b->http) : 0;
    len = pl_metrics_render(&b->metrics, pl_engine_ledger(b->engine),
                            pl_engine_key_count(b->engine), b->metrics_buf,
                            sizeof(b->metrics_buf));
    if (len == 0)
        reply_error(c, 500, "metrics do not fit their buffer");
    else
        pl_conn_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL,
                        b->metrics_buf, len);
}

static int path_is(const pl_request *req, const char *path)
{
    size_t len = strlen(path);
    return req->path_len == len && memcmp(req->path, path, len) == 0;
}

void pl_broker_on_request(void *app, pl_conn *c, const pl_request *req)
{
    pl_broker *b = app;
    int get = req->method == HTTP_GET || req->method == HTTP_HEAD;

    if (path_is(req, "/warm-start")) {
        pl_conn_set_tag(c, req->method == HTTP_POST ? PL_ROUTE_DISPATCH : PL_ROUTE_PARK);
        if (req->method == HTTP_GET)
            handle_park(b, c, req);
        else if (req->method == HTTP_POST)
            handle_dispatch(b, c, req);
        else
            pl_conn_respond(c, 405, json_type, "Allow: GET, POST\r\n",
                            "{\"error\":\"method not allowed\"}", 30);
        return;
    }
    if (path_is(req, "/connect"))
        pl_conn_set_tag(c, PL_ROUTE_CONNECT);
    else if (path_is(req, "/healthz"))
        pl_conn_set_tag(c, PL_ROUTE_HEALTHZ);
    else if (path_is(req, "/readyz"))
        pl_conn_set_tag(c, PL_ROUTE_READYZ);
    else if (path_is(req, "/metrics"))
        pl_conn_set_tag(c, PL_ROUTE_METRICS);
    else {
        reply_error(c, 404, "not found");
        return;
    }
    if (!get) {
        pl_conn_respond(c, 405, json_type, "Allow: GET\r\n",
                        "{\"error\":\"method not allowed\"}", 30);
    } else if (path_is(req, "/connect")) {
        pl_conn_respond(c, 200, json_type, NULL, b->connect_body, b->connect_len);
    } else if (path_is(req, "/healthz")) {
        reply_json(c, 200, "{\"status\":\"ok\"}");
    } else if (path_is(req, "/readyz")) {
        if (b->draining)
            reply_json(c, 503, "{\"status\":\"draining\"}");
        else
            reply_json(c, 200, "{\"status\":\"ready\"}");
    } else {
        handle_metrics(b, c);
    }
}

void pl_broker_on_close(void *app, pl_conn *c)
{
    pl_broker *b = app;
    pl_waiter *w = pl_conn_data(c);

    if (w != NULL)
        pl_engine_settle(b->engine, w, PL_OUTCOME_DISCONNECT);
}

void pl_broker_on_response(void *app, unsigned tag, int status)
{
    pl_broker *b = app;

    if (tag < PL_ROUTE__COUNT)
        pl_metrics_count_http(&b->metrics, (pl_route)tag, status);
}

void pl_broker_set_draining(pl_broker *b)
{
    b->draining = 1;
}

void pl_broker_close_parked(pl_broker *b)
{
    b->draining = 1;
    b->closing = 1;
    pl_engine_drain(b->engine);
}

void pl_broker_stop(pl_broker *b)
{
    uv_close((uv_handle_t *)&b->timer, NULL);
}

void pl_broker_free(pl_broker *b)
{
    if (b == NULL)
        return;
    pl_engine_free(b->engine);
    pl_free(b);
}
