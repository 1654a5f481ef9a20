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

/* What a connection's data pointer holds (pl_conn_set_data kinds). */
enum { DATA_WAITER = 1, DATA_CONFIRM, DATA_DISPATCH };

/* A dispatch whose payload was written to a controller and waits for that
 * controller's TCP acknowledgement (delivery = confirm). It owns a copy of
 * the key and payload, so it can offer them to the next poll. */
typedef struct confirm confirm;
struct confirm {
    confirm *prev, *next;
    pl_waiter *w;          /* the engine's waiter, pending confirmation */
    pl_conn *controller;   /* holds DATA_CONFIRM -> this */
    pl_conn *dispatcher;   /* holds DATA_DISPATCH -> this; NULL once gone */
    uint64_t deadline, start_ns, waited_ms;
    int in_grace;
    pl_message msg;        /* views into data[] */
    char data[];
};

struct pl_broker {
    uv_loop_t *loop;
    const pl_config *cfg;
    const pl_http *http;
    pl_engine *engine;
    uv_timer_t timer;         /* the engine's next park timeout */
    uv_timer_t confirm_timer; /* polls pending confirmations */
    confirm *confirms;
    pl_conn *taken_conn;      /* set by on_settle for a pending delivery */
    pl_waiter *taken_waiter;
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
    pl_broker *b = pl_conn_app(c);
    unsigned kind;
    pl_waiter *w = pl_conn_data(c, &kind);

    /* The waiter leaves the connection first, so a failing write that
     * closes it finds nothing to settle again. */
    pl_conn_set_data(c, NULL, 0);
    switch (outcome) {
    case PL_OUTCOME_MATCHED:
        if (pl_conn_respond(c, 200, json_type, NULL, m->payload, m->payload_len) != 0)
            return -1;
        if (b->cfg->delivery != PL_DELIVERY_CONFIRM)
            return 0;
        b->taken_conn = c;
        b->taken_waiter = w;
        return PL_SETTLE_PENDING;
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
        .order = (pl_order)cfg->match_order,
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
    uv_timer_init(loop, &b->confirm_timer);
    b->confirm_timer.data = b;
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
        pl_conn_set_data(c, w, DATA_WAITER);
        pl_conn_detect_dead_peer(c, (unsigned)b->cfg->tcp_keepalive_idle_s,
                                 (unsigned)b->cfg->tcp_keepalive_interval_s,
                                 (unsigned)b->cfg->tcp_keepalive_count,
                                 (unsigned)b->cfg->tcp_user_timeout_ms);
        if (!uv_is_active((uv_handle_t *)&b->timer))
            timer_arm(b);
    }
}

/* ---- POST /warm-start: dispatch ---- */

static void count_dispatch(pl_broker *b, int hit, uint64_t waited_ms, uint64_t start_ns)
{
    b->metrics.dispatch[hit ? PL_DISPATCH_HIT : PL_DISPATCH_MISS]++;
    if (hit)
        pl_metrics_observe(&b->metrics.wait_seconds, (double)waited_ms / 1e3);
    pl_metrics_observe(&b->metrics.dispatch_seconds,
                       (double)(uv_hrtime() - start_ns) / 1e9);
}

static void answer_dispatch(pl_broker *b, pl_conn *c, int hit,
                            uint64_t waited_ms, uint64_t start_ns)
{
    reply_json(c, 200, hit ? "{\"didWarmStart\":true}" : "{\"didWarmStart\":false}");
    count_dispatch(b, hit, waited_ms, start_ns);
}

static void confirm_tick(uv_timer_t *t);

/* Takes the pending delivery on_settle just left into <rec>. */
static void confirm_attach(pl_broker *b, confirm *rec)
{
    rec->w = b->taken_waiter;
    rec->controller = b->taken_conn;
    pl_conn_set_data(rec->controller, rec, DATA_CONFIRM);
}

static void confirm_finish(pl_broker *b, confirm *rec, int delivered)
{
    if (rec->w != NULL) {
        pl_conn_set_data(rec->controller, NULL, 0);
        pl_engine_confirm(b->engine, rec->w, delivered);
    }
    if (rec->dispatcher != NULL) {
        pl_conn_set_data(rec->dispatcher, NULL, 0);
        answer_dispatch(b, rec->dispatcher, delivered, rec->waited_ms, rec->start_ns);
    } else {
        count_dispatch(b, delivered, rec->waited_ms, rec->start_ns);
    }
    if (rec->prev)
        rec->prev->next = rec->next;
    else
        b->confirms = rec->next;
    if (rec->next)
        rec->next->prev = rec->prev;
    if (b->confirms == NULL)
        uv_timer_stop(&b->confirm_timer);
    pl_free(rec);
}

/* Checks <rec>'s controller. Acknowledged: true. Failed, or unacknowledged
 * past the deadline: that controller is reset and counted a disconnect, and
 * the run goes to the key's next poll (after the deadline, one more poll
 * gets a short grace); with none, false. */
static void confirm_check(pl_broker *b, confirm *rec, uint64_t now, int closing)
{
    int state = pl_conn_acknowledged(rec->controller);
    uint64_t grace = b->cfg->confirm_timeout_ms / 10 > 10 ? b->cfg->confirm_timeout_ms / 10 : 10;

    if (state == 1) {
        confirm_finish(b, rec, 1);
        return;
    }
    if (state == 0 && now < rec->deadline && !closing)
        return;
    PL_LOG(PL_LOG_DEBUG, "delivery not confirmed", "\"failed\":%d", state < 0);
    pl_conn_set_data(rec->controller, NULL, 0);
    pl_conn_abort(rec->controller); /* nothing stale may arrive later */
    pl_engine_confirm(b->engine, rec->w, 0);
    rec->w = NULL;
    if (now >= rec->deadline) {
        if (rec->in_grace) {
            confirm_finish(b, rec, 0);
            return;
        }
        rec->in_grace = 1;
        rec->deadline = now + grace;
    }
    if (pl_engine_deliver(b->engine, &rec->msg.key, &rec->msg, now, &rec->waited_ms) == 0)
        confirm_finish(b, rec, 0);
    else
        confirm_attach(b, rec);
}

static void confirm_tick(uv_timer_t *t)
{
    pl_broker *b = t->data;
    uint64_t now = uv_now(b->loop);
    confirm *rec = b->confirms, *next;

    for (; rec != NULL; rec = next) {
        next = rec->next;
        confirm_check(b, rec, now, 0);
    }
}

/* The delivery on_settle left pending becomes a confirmation record; the
 * dispatcher's answer waits for it. */
static void confirm_start(pl_broker *b, pl_conn *dispatcher, const pl_message *m,
                          uint64_t waited_ms, uint64_t start_ns)
{
    size_t dl = m->key.deployment_len, vl = m->key.version_len;
    confirm *rec = pl_malloc(sizeof(*rec) + m->payload_len + dl + vl);

    if (rec == NULL) {
        /* Written but cannot be watched: answer as delivery = written. */
        pl_engine_confirm(b->engine, b->taken_waiter, 1);
        answer_dispatch(b, dispatcher, 1, waited_ms, start_ns);
        return;
    }
    memset(rec, 0, sizeof(*rec));
    memcpy(rec->data, m->payload, m->payload_len);
    memcpy(rec->data + m->payload_len, m->key.deployment, dl);
    memcpy(rec->data + m->payload_len + dl, m->key.version, vl);
    rec->msg.key = m->key;
    rec->msg.payload = rec->data;
    rec->msg.payload_len = m->payload_len;
    rec->msg.key.deployment = rec->data + m->payload_len;
    rec->msg.key.version = rec->data + m->payload_len + dl;
    rec->dispatcher = dispatcher;
    rec->deadline = uv_now(b->loop) + b->cfg->confirm_timeout_ms;
    rec->start_ns = start_ns;
    rec->waited_ms = waited_ms;
    confirm_attach(b, rec);
    pl_conn_set_data(dispatcher, rec, DATA_DISPATCH);
    rec->next = b->confirms;
    if (b->confirms)
        b->confirms->prev = rec;
    b->confirms = rec;
    if (!uv_is_active((uv_handle_t *)&b->confirm_timer))
        uv_timer_start(&b->confirm_timer, confirm_tick, 1, 1);
}

static void handle_dispatch(pl_broker *b, pl_conn *c, const pl_request *req)
{
    uint64_t start = uv_hrtime(), waited_ms = 0;
    const char *err = NULL;
    pl_message m;
    int rc;

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
    rc = pl_engine_deliver(b->engine, &m.key, &m, uv_now(b->loop), &waited_ms);
    if (rc == PL_DELIVERY_PENDING)
        confirm_start(b, c, &m, waited_ms, start);
    else
        answer_dispatch(b, c, rc == PL_DELIVERED, waited_ms, start);
    pl_message_release(&m);
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
    unsigned kind;
    confirm *rec = pl_conn_data(c, &kind);

    /* A controller speaking again on the connection its run went out on is
     * alive and reading: its delivery counts as confirmed. */
    if (kind == DATA_CONFIRM)
        confirm_finish(b, rec, 1);

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
    unsigned kind;
    void *data = pl_conn_data(c, &kind);

    if (kind == DATA_CONFIRM) {
        confirm_check(b, data, uv_now(b->loop), 1); /* the socket is still open */
        return;
    }
    pl_conn_set_data(c, NULL, 0);
    if (kind == DATA_WAITER)
        pl_engine_settle(b->engine, data, PL_OUTCOME_DISCONNECT);
    else if (kind == DATA_DISPATCH)
        ((confirm *)data)->dispatcher = NULL;
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
    uv_close((uv_handle_t *)&b->confirm_timer, NULL);
}

void pl_broker_free(pl_broker *b)
{
    if (b == NULL)
        return;
    pl_engine_free(b->engine);
    pl_free(b);
}
