/* broker.c -- the endpoints of docs/protocol.md, on top of the engine. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <cJSON.h>
#include <utlist.h>

#include "pilotlight/broker.h"
#include "pilotlight/buf.h"
#include "pilotlight/cluster.h"
#include "pilotlight/confirm.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/poll.h"
#include "pilotlight/pool.h"
#include "pilotlight/token.h"

#define METRICS_BUFFER_SIZE 32768

/* A dispatch read at most this long after it arrived: its sender cannot
 * have waited long enough to give up on it. A busy loop then asks the
 * kernel nothing about its dispatchers; a quiet or stalled one does. */
#define STALE_MS 50

struct pl_broker {
    uv_loop_t *loop;
    const pl_config *cfg;
    const pl_http *https[2];
    pl_broker_view views[2];
    pl_engine *engine;
    pl_confirm *confirm;         /* the deliveries awaiting their ACK */
    pl_token_verifier *verifier; /* NULL when token_mode is disabled */
    uv_timer_t timer;            /* the engine's next park timeout */
    pl_cluster cluster;          /* the key ring, when there is one */
    uint32_t ring_view;          /* which view of it: 1, 2, ... (0 marks no key) */
    uint64_t joined_at;          /* when this instance last became a member */
    uv_timer_t sweep;            /* moves polls parked here for another's key */
    pl_metrics metrics;
    int draining, closing;
    size_t connect_len;
    char connect_body[96];
    char metrics_buf[METRICS_BUFFER_SIZE];
};

static pl_broker *conn_broker(const pl_conn *c)
{
    return ((pl_broker_view *)pl_conn_app(c))->broker;
}

/* A parked poll's connection closing: its poll ends as a disconnect. */
static void waiter_conn_closed(void *obj, pl_conn *c)
{
    pl_engine_settle(conn_broker(c)->engine, obj, PL_OUTCOME_DISCONNECT);
}

static pl_conn_owner waiter_owner = {waiter_conn_closed, NULL, 0};

/* The engine's settle callback: the one place a parked poll is answered. */
static int on_settle(void *owner, pl_outcome outcome, const void *arg)
{
    pl_conn *c = owner;
    const pl_message *m = arg;
    pl_broker *b = conn_broker(c);
    int rc;

    /* The waiter leaves the connection first, so a failing write that
     * closes it finds nothing to settle again. */
    pl_conn_set_owner(c, NULL, NULL);
    switch (outcome) {
    case PL_OUTCOME_MATCHED:
        if (b->cfg->delivery == PL_DELIVERY_CONFIRM && pl_confirm_busy(b->confirm))
            pl_conn_skip_ack_report(c);
        if ((rc = pl_conn_respond(c, 200, "application/json", NULL, m->payload,
                                  m->payload_len)) != 0)
            return rc;
        return b->cfg->delivery == PL_DELIVERY_CONFIRM ? PL_SETTLE_PENDING : 0;
    case PL_OUTCOME_TIMEOUT:
        pl_conn_respond(c, 204, NULL, NULL, NULL, 0);
        break;
    case PL_OUTCOME_REPLACED:
        /* A controller that hung up and polled again on another connection
         * can be read before its hang-up is: that poll was given up, not
         * replaced, and a 409 would go nowhere. */
        if (pl_conn_peer_gone(c)) {
            pl_conn_close(c);
            return -EPIPE;
        }
        pl_conn_respond_error(c, 409, "replaced by a newer poll from the same controller");
        break;
    case PL_OUTCOME_REJECTED:
        pl_conn_respond_error(c, 503, arg);
        break;
    case PL_OUTCOME_SHUTDOWN:
        pl_conn_close(c); /* no answer: the controller re-polls elsewhere */
        break;
    case PL_OUTCOME_HANDED_OVER:
        pl_conn_close(c); /* our descriptor only: the new process holds another */
        break;
    case PL_OUTCOME_REVOKED:
        /* Refused by a reload's token rules: 401 as a new poll would get;
         * with no verdict to be had here (arg NULL), closed unanswered, so
         * that its controller polls again and is judged then. */
        if (arg != NULL)
            pl_conn_respond_error(c, 401, arg);
        else
            pl_conn_close(c);
        break;
    case PL_OUTCOME_MOVED: {
        /* Its key went to another instance: a redirect, which a controller
         * follows at once (a closed poll would cost it a back-off). */
        char loc[PL_CLUSTER_LOCATION_MAX];
        if (pl_cluster_location(loc, arg, 0, "/warm-start", 0, NULL, NULL, 0, 0) > 0)
            pl_conn_respond(c, 307, NULL, loc, NULL, 0);
        else
            pl_conn_close(c);
        break;
    }
    case PL_OUTCOME_DISCONNECT:
    case PL_OUTCOME_ABORTED:
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

static pl_engine_opts engine_opts(const pl_config *cfg)
{
    pl_engine_opts opts = {
        .order = (pl_order)cfg->match_order,
        .max_waiters = (uint32_t)cfg->max_waiters,
        .max_waiters_per_key = (uint32_t)cfg->max_waiters_per_key,
        .park_timeout_ms = cfg->park_timeout_ms,
        .settle = on_settle,
    };
    return opts;
}

/* Sets *out to a verifier for <cfg>'s secrets, or NULL when tokens are
 * disabled. Returns 0, or -1 when out of memory. */
static int make_verifier(const pl_config *cfg, pl_token_verifier **out)
{
    const char *cur = cfg->token_secret, *prev = cfg->token_secret_previous;

    *out = NULL;
    if (cfg->token_mode == PL_TOKEN_MODE_DISABLED)
        return 0;
    *out = pl_token_verifier_new((const unsigned char *)cur, strlen(cur));
    if (*out != NULL && *prev != '\0' &&
        pl_token_verifier_set_previous(*out, (const unsigned char *)prev, strlen(prev)) != 0) {
        pl_token_verifier_free(*out);
        *out = NULL;
    }
    return *out != NULL ? 0 : -ENOMEM;
}

static void set_connect_body(pl_broker *b, const pl_config *cfg)
{
    b->connect_len = (size_t)snprintf(b->connect_body, sizeof(b->connect_body),
                                      "{\"connectionTimeoutMs\":%llu,\"keepaliveMs\":%llu}",
                                      (unsigned long long)cfg->connection_timeout_ms,
                                      (unsigned long long)cfg->keepalive_ms);
}

static pl_confirm_opts confirm_opts(const pl_config *cfg)
{
    pl_confirm_opts opts = {cfg->confirm_timeout_ms, cfg->confirm_wait_max_ms};
    return opts;
}

static void answer_dispatch(void *arg, pl_conn *c, pl_dispatch_result result,
                            uint64_t waited_ms, uint64_t start_ns);

pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg)
{
    pl_engine_opts opts = engine_opts(cfg);
    pl_confirm_opts copts = confirm_opts(cfg);
    pl_broker *b = pl_malloc(sizeof(*b));

    if (b == NULL)
        return NULL;
    memset(b, 0, offsetof(pl_broker, metrics_buf));
    b->engine = pl_engine_new(&opts);
    if (b->engine == NULL || make_verifier(cfg, &b->verifier) != 0) {
        pl_engine_free(b->engine);
        pl_free(b);
        return NULL;
    }
    b->loop = loop;
    b->cfg = cfg;
    pl_metrics_init(&b->metrics);
    set_connect_body(b, cfg);
    b->confirm = pl_confirm_new(loop, b->engine, &b->metrics, &copts, answer_dispatch, b);
    if (b->confirm == NULL) {
        pl_engine_free(b->engine);
        pl_token_verifier_free(b->verifier);
        pl_free(b);
        return NULL;
    }
    uv_timer_init(loop, &b->timer);
    uv_timer_init(loop, &b->sweep);
    b->sweep.data = b;
    pl_cluster_init(&b->cluster);
    return b;
}

/* Applies a reload's tighter rules to what is parked: token mode and
 * secrets, then lower caps. Each poll refused is answered as a new one
 * would be and counted (revoked, rejected). */
static void apply_to_parked(pl_broker *b, const pl_config *next)
{
    const pl_config *old = b->cfg;
    pl_poll_rejudge r;
    size_t revoked = 0, rejected = 0;

    if (pl_poll_rejudge_init(&r, old, next))
        revoked = pl_engine_settle_if(b->engine, PL_OUTCOME_REVOKED, pl_poll_rejudge_one, &r);
    if (next->max_waiters < old->max_waiters ||
        next->max_waiters_per_key < old->max_waiters_per_key)
        rejected = pl_engine_enforce_caps(b->engine);
    if (revoked + rejected > 0)
        PL_LOG(PL_LOG_WARN, "reload: parked polls refused under the new settings",
               "\"revoked\":%zu,\"rejected\":%zu", revoked, rejected);
}

int pl_broker_reconfigure(pl_broker *b, const pl_config *next)
{
    pl_engine_opts opts = engine_opts(next);
    pl_confirm_opts copts = confirm_opts(next);
    pl_token_verifier *v;
    int rc;

    if ((rc = make_verifier(next, &v)) != 0) {
        b->metrics.reloads[1]++;
        return rc;
    }
    /* A fresh verifier also forgets tokens cached under a dropped secret. */
    pl_token_verifier_free(b->verifier);
    b->verifier = v;
    pl_engine_set_opts(b->engine, &opts);
    pl_confirm_set_opts(b->confirm, &copts);
    set_connect_body(b, next);
    apply_to_parked(b, next);
    uv_timer_stop(&b->timer);
    timer_arm(b);
    b->metrics.reloads[0]++;
    return 0;
}

void pl_broker_count_reload_error(pl_broker *b)
{
    b->metrics.reloads[1]++;
}

void pl_broker_count_upgrade(pl_broker *b, pl_upgrade_result result)
{
    if ((unsigned)result < PL_UPGRADE__COUNT)
        b->metrics.upgrades[result]++;
}

pl_broker_view *pl_broker_view_of(pl_broker *b, unsigned serves)
{
    pl_broker_view *v = &b->views[serves == PL_SERVE_DISPATCH ? 1 : 0];

    v->broker = b;
    v->serves = serves;
    return v;
}

void pl_broker_attach(pl_broker *b, const pl_http *h)
{
    b->https[b->https[0] != NULL] = h;
}

/* ---- the key ring ---- */

/* pl_engine_settle_if's judge for the ring: a poll whose key another
 * instance owns is moved there. */
static int judge_owner(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    const pl_cluster *cl = arg;

    (void)tag;
    if (pl_cluster_owns(cl, &info->key))
        return 0;
    *why = cl->ring.m[pl_cluster_owner(cl, &info->key)].name;
    return 1;
}

static void move_foreign(pl_broker *b)
{
    size_t n = pl_engine_settle_if(b->engine, PL_OUTCOME_MOVED, judge_owner, &b->cluster);

    if (n > 0)
        PL_LOG(PL_LOG_INFO, "ring: parked polls sent to their keys' owners", "\"moved\":%zu", n);
}

static void sweep_cb(uv_timer_t *t)
{
    move_foreign(t->data);
}

void pl_broker_ring_changed(pl_broker *b, const pl_ring *ring, int self)
{
    if (self >= 0 && b->cluster.self < 0)
        b->joined_at = uv_now(b->loop);
    b->cluster.ring = *ring;
    b->cluster.self = self;
    /* Every key's "owned here" mark (sent_elsewhere) was of the old view. */
    if (++b->ring_view == 0)
        b->ring_view = 1;
    b->cluster.on = 1;
    b->metrics.ring_on = 1;
    /* Not a member (left to drain, or not yet among ring_dns's addresses):
     * 0, so a sum or count over instances leaves it out. */
    b->metrics.ring_members = self >= 0 ? ring->n : 0;
    b->metrics.ring_changes++;
    if (!b->closing)
        move_foreign(b);
}

/* What the ring said of a request served here. */
typedef struct {
    pl_hop hop;
    int foreign; /* another instance owns its key */
} ring_note;

/* Answers <req> with a 307 to member <to>. Returns whether it did. */
static int redirect(pl_broker *b, pl_conn *c, const pl_request *req, int to, unsigned hops,
                    int dispatch)
{
    char loc[PL_CLUSTER_LOCATION_MAX];
    uint16_t port = dispatch && b->cfg->dispatch_listen.host[0] != '\0'
                        ? b->cfg->dispatch_listen.port : 0;

    if (pl_cluster_location(loc, b->cluster.ring.m[to].name, port, "/warm-start", hops,
                            dispatch ? b->cfg->dispatch_token : NULL, req->body, req->body_len,
                            (uint64_t)time(NULL)) < 0)
        return 0; /* cannot be: names are short */
    pl_conn_respond(c, 307, NULL, loc, NULL, 0);
    b->metrics.ring_redirects[dispatch]++;
    return 1;
}

/* Whether a request for the key at <spot> is served here without asking
 * the ring: there is none, or the key is known to be this instance's in
 * the current view and the request carries no hop mark to read. What a
 * key's owner is in a view is kept with the key in the engine (the spot's
 * mark) while it has parked polls, so the polls and dispatches of a key
 * served here cost no hash of the ring. */
static inline int served_here(const pl_broker *b, const pl_request *req,
                              const pl_engine_spot *spot)
{
    return !b->cluster.on || (spot->mark == b->ring_view && req->query_len == 0);
}

/* Otherwise: answers a request for <key> that is not to be served here
 * with a 307 to the key's owner, or a 400 for a malformed hop mark.
 * Returns whether it did; if not, *note (zeroed by the caller) says what
 * the ring said. A poll served here for another's key (views of the ring
 * disagree) is sent on a check period later, when they should agree. */
static int sent_elsewhere(pl_broker *b, pl_conn *c, const pl_request *req, const pl_key *key,
                          pl_engine_spot *spot, int dispatch, ring_note *note)
{
    int owner;

    if (req->query_len > 0 && pl_cluster_read_hop(req->query, req->query_len, &note->hop) != 0) {
        pl_conn_respond_error(c, 400, "malformed pl_hop, pl_exp or pl_sig");
        return 1;
    }
    if (spot->mark == b->ring_view)
        return 0;
    owner = pl_cluster_route(&b->cluster, key, note->hop.hops, &note->foreign);
    if (owner >= 0)
        return redirect(b, c, req, owner, note->hop.hops, dispatch);
    if (!note->foreign)
        spot->mark = b->ring_view;
    b->metrics.ring_hop_served[dispatch] += (uint64_t)note->foreign;
    if (note->foreign && !dispatch && !uv_is_active((uv_handle_t *)&b->sweep))
        uv_timer_start(&b->sweep, sweep_cb, b->cfg->ring_check_ms, 0);
    return 0;
}

/* A dispatch that found nobody parked here: where the ring says a poll
 * may still be, while views of it disagree (pl_cluster_after_miss), it is
 * sent on rather than answered false. Returns whether it was. */
static int sent_after_miss(pl_broker *b, pl_conn *c, const pl_request *req, const pl_key *key,
                           const ring_note *note)
{
    /* The others see a new member within a check of it, and a check may
     * take its timeout. */
    uint64_t window = 2 * b->cfg->ring_check_ms + b->cfg->ring_check_timeout_ms;
    int to;

    if (!b->cluster.on)
        return 0;
    to = pl_cluster_after_miss(&b->cluster, key, note->hop.hops, note->foreign,
                               uv_now(b->loop) - b->joined_at < window);
    return to >= 0 && redirect(b, c, req, to, note->hop.hops, 1);
}

/* ---- GET /warm-start: park ---- */

static double wall_seconds(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* What the connection of a parked waiter gets, whether the poll parked
 * here or was adopted from an older process (whose setting of the socket
 * this connection does not know). */
static void hold_waiter(pl_broker *b, pl_conn *c, pl_waiter *w)
{
    pl_conn_set_owner(c, w, &waiter_owner);
    if (pl_conn_watch_acks(c, b->cfg->delivery == PL_DELIVERY_CONFIRM) != 0)
        b->metrics.ack_events_refused++;
    if (!uv_is_active((uv_handle_t *)&b->timer))
        timer_arm(b);
}

void pl_broker_park(pl_broker *b, pl_conn *c, const pl_request *req)
{
    pl_token_claims claims;
    char msg[96];
    const char *err;
    pl_engine_spot spot;
    pl_waiter *w;
    ring_note ring = {0};
    pl_key key;
    int rc, token;

    rc = pl_poll_key(req, b->verifier, b->cfg->token_mode == PL_TOKEN_MODE_ENFORCE,
                     wall_seconds(), &key, &claims, &token, &err, msg, sizeof(msg));
    if (token != PL_TOKEN_UNCHECKED)
        b->metrics.token[token]++;
    if (token == PL_TOKEN_VALID)
        b->metrics.token_secret[claims.previous != 0]++;
    if (rc != 0) {
        pl_conn_respond_error(c, rc == -EACCES ? 401 : 400, err);
        return;
    }
    if (pl_engine_find(b->engine, &key, &spot) == PL_EINVAL) {
        pl_conn_respond_error(c, 400, "x-trigger-deployment-id or -version is empty or too long");
        return;
    }
    if (!served_here(b, req, &spot) && sent_elsewhere(b, c, req, &key, &spot, 0, &ring))
        return;
    if (b->closing) {
        pl_conn_close(c); /* as if it had parked just before the drain */
        return;
    }
    rc = pl_engine_park_at(b->engine, &spot, &key, req->header[PL_HDR_CONTROLLER_ID],
                           req->header_len[PL_HDR_CONTROLLER_ID], c, uv_now(b->loop), &w);
    if (rc == PL_ENOMEM) {
        pl_conn_respond_error(c, 503, "out of memory");
    } else if (rc == 0) {
        pl_engine_set_tag(w, pl_poll_trust(token, &claims, &key, req));
        hold_waiter(b, c, w);
        pl_conn_detect_dead_peer(c, (unsigned)b->cfg->tcp_keepalive_idle_s,
                                 (unsigned)b->cfg->tcp_keepalive_interval_s,
                                 (unsigned)b->cfg->tcp_keepalive_count,
                                 (unsigned)b->cfg->tcp_user_timeout_ms);
    }
}

/* ---- POST /warm-start: dispatch ---- */

static void count_dispatch(pl_broker *b, pl_dispatch_result result, uint64_t waited_ms,
                           uint64_t start_ns)
{
    b->metrics.dispatch[result]++;
    if (result == PL_DISPATCH_HIT)
        pl_histogram_observe(&b->metrics.wait_seconds, (double)waited_ms / 1e3);
    pl_histogram_observe(&b->metrics.dispatch_seconds,
                       (double)(uv_hrtime() - start_ns) / 1e9);
}

/* Answers the dispatcher <c> (NULL: it went away; counted only). */
static void answer_dispatch(void *arg, pl_conn *c, pl_dispatch_result result,
                            uint64_t waited_ms, uint64_t start_ns)
{
    pl_broker *b = arg;

    if (c != NULL)
        pl_conn_respond_json(c, 200, result == PL_DISPATCH_HIT ? "{\"didWarmStart\":true}"
                                                     : "{\"didWarmStart\":false}");
    count_dispatch(b, result, waited_ms, start_ns);
}

typedef struct {
    pl_broker *b;
    pl_conn *dispatcher;
    int asked;
} dispatch_vet;

/* Before the run goes to its first poll: a dispatcher that has gone (its
 * FIN or reset read, or waiting in a socket whose request may have waited
 * long) gave up, and will cold-start the run itself. Then, under confirm,
 * the polls known to be suspect go last. */
static int vet_poll(void *owner, void *arg)
{
    dispatch_vet *v = arg;
    pl_broker *b = v->b;

    if (!v->asked) {
        v->asked = 1;
        if (pl_conn_peer_eof(v->dispatcher) ||
            (pl_conn_read_delay_max(v->dispatcher) > STALE_MS &&
             pl_conn_peer_gone(v->dispatcher)))
            return PL_VET_STOP;
    }
    if (b->cfg->delivery == PL_DELIVERY_CONFIRM)
        return pl_confirm_vet(b->confirm, owner);
    return PL_VET_OFFER;
}

void pl_broker_dispatch(pl_broker *b, pl_conn *c, const pl_request *req)
{
    uint64_t start = uv_hrtime();
    dispatch_vet vet = {b, c, 0};
    pl_delivery d = {.vet = vet_poll, .vet_arg = &vet};
    const char *err = NULL;
    pl_engine_spot spot;
    ring_note ring = {0};
    pl_message m;
    int rc;

    if (b->cfg->delivery == PL_DELIVERY_CONFIRM)
        pl_confirm_note_dispatch(b->confirm, start);
    rc = pl_message_parse(req->body, req->body_len, &m, &err);
    if (rc == PL_MESSAGE_EINVAL) {
        b->metrics.dispatch[PL_DISPATCH_INVALID]++;
        pl_conn_respond_error(c, 400, err);
        return;
    }
    if (rc == PL_MESSAGE_ENOMEM) {
        pl_conn_respond_error(c, 503, "out of memory");
        return;
    }
    /* The message's key is checked as the engine's (never PL_EINVAL). */
    pl_engine_find(b->engine, &m.key, &spot);
    if (!served_here(b, req, &spot) && sent_elsewhere(b, c, req, &m.key, &spot, 1, &ring)) {
        pl_message_release(&m);
        return;
    }
    d.payload = &m;
    rc = pl_engine_deliver_at(b->engine, &spot, uv_now(b->loop), &d);
    if (rc == 0 && sent_after_miss(b, c, req, &m.key, &ring))
        ; /* nothing was delivered here: the run is offered there */
    else if (rc == PL_DELIVERY_PENDING)
        pl_confirm_start(b->confirm, c, &m, &d, start);
    else
        answer_dispatch(b, c, rc == PL_DELIVERED ? PL_DISPATCH_HIT
                              : rc == PL_DELIVERY_STOPPED ? PL_DISPATCH_ABANDONED
                                                          : PL_DISPATCH_MISS,
                        d.waited_ms, start);
    pl_message_release(&m);
}

/* ---- a binary upgrade ---- */

typedef struct {
    void (*fn)(pl_conn *c, const pl_waiter_info *info, void *arg);
    void *arg;
} each_parked;

static void parked_one(const pl_waiter_info *info, void *arg)
{
    each_parked *ep = arg;

    ep->fn(info->owner, info, ep->arg);
}

void pl_broker_each_parked(pl_broker *b,
                           void (*fn)(pl_conn *c, const pl_waiter_info *info, void *arg),
                           void *arg)
{
    each_parked ep = {fn, arg};

    pl_engine_each_waiter(b->engine, parked_one, &ep);
}

pl_metrics *pl_broker_metrics(pl_broker *b)
{
    return &b->metrics;
}

const char *pl_broker_connect_body(const pl_broker *b, size_t *len)
{
    *len = b->connect_len;
    return b->connect_body;
}

int pl_broker_draining(const pl_broker *b)
{
    return b->draining;
}

size_t pl_broker_metrics_text(pl_broker *b, const char **text)
{
    b->metrics.max_waiters = b->cfg->max_waiters;
    b->metrics.max_waiters_per_key = b->cfg->max_waiters_per_key;
    b->metrics.max_connections = b->cfg->max_connections;
    b->metrics.connections_open = 0;
    memset(b->metrics.refused, 0, sizeof(b->metrics.refused));
    for (int i = 0; i < 2; i++) {
        if (b->https[i] == NULL)
            continue;
        b->metrics.connections_open += pl_http_connections(b->https[i]);
        for (unsigned r = 0; r < PL_HTTP_REFUSED__COUNT; r++)
            b->metrics.refused[r] += pl_http_refused(b->https[i], r);
    }
    b->metrics.proc_ok = pl_proc_read(&b->metrics.proc) == 0;
    *text = b->metrics_buf;
    return pl_metrics_render(&b->metrics, pl_engine_ledger(b->engine),
                             pl_engine_key_count(b->engine), b->metrics_buf,
                             sizeof(b->metrics_buf));
}

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

char *pl_broker_waiters_json(const pl_broker *b, size_t max)
{
    waiters_out o = {NULL, uv_now(b->loop), 0};
    cJSON *root = cJSON_CreateObject();
    size_t total = 0;
    char *text = NULL;

    if (root != NULL && (o.keys = cJSON_AddArrayToObject(root, "keys")) != NULL) {
        total = pl_engine_each_key(b->engine, max, waiters_key, &o);
        if (!o.failed &&
            cJSON_AddNumberToObject(root, "total_keys", (double)total) != NULL &&
            cJSON_AddNumberToObject(root, "parked",
                                    (double)pl_engine_ledger(b->engine)->parked_now) != NULL &&
            cJSON_AddBoolToObject(root, "truncated", total > max) != NULL)
            text = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    return text;
}

const pl_config *pl_broker_config(const pl_broker *b)
{
    return b->cfg;
}

unsigned pl_broker_conn_serves(const pl_conn *c)
{
    return ((const pl_broker_view *)pl_conn_app(c))->serves;
}

void pl_broker_hold(pl_broker *b, pl_waiter *w, int on)
{
    pl_engine_hold(b->engine, w, on);
    if (on)
        return;
    /* Its deadline may be the next, or past: look at once. A ring change
     * while it was held passed it over: look at that too. */
    uv_timer_start(&b->timer, timer_cb, 0, 0);
    if (b->cluster.on && !b->closing)
        uv_timer_start(&b->sweep, sweep_cb, 0, 0);
}

void pl_broker_hand_over(pl_broker *b, pl_waiter *w)
{
    pl_engine_settle(b->engine, w, PL_OUTCOME_HANDED_OVER);
}

int pl_broker_adopt(pl_broker *b, pl_conn *c, const pl_key *key, const char *id,
                    size_t id_len, uint64_t age_ms)
{
    uint64_t now = uv_now(b->loop);
    pl_waiter *w;
    int rc = pl_engine_adopt(b->engine, key, id, id_len, c,
                             now > age_ms ? now - age_ms : 0, &w);

    if (rc != 0)
        return rc;
    pl_conn_set_tag(c, PL_ROUTE_PARK);
    hold_waiter(b, c, w);
    return 0;
}

void pl_broker_log_ledger(const pl_broker *b)
{
    const pl_ledger *l = pl_engine_ledger(b->engine);
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
    uv_close((uv_handle_t *)&b->sweep, NULL);
    pl_confirm_stop(b->confirm);
}

void pl_broker_free(pl_broker *b)
{
    if (b == NULL)
        return;
    pl_confirm_free(b->confirm);
    pl_engine_free(b->engine);
    pl_token_verifier_free(b->verifier);
    pl_free(b);
}

const char *pl_broker_serves_name(unsigned serves)
{
    return serves == PL_SERVE_DISPATCH ? "dispatch"
           : serves == PL_SERVE_CONTROLLERS ? "controllers" : "all";
}
