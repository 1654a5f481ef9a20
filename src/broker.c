/* broker.c -- the endpoints of docs/protocol.md, on top of the engine. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "pilotlight/broker.h"
#include "pilotlight/confirm_loop.h"
#include "pilotlight/loop.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/poll.h"
#include "pilotlight/redirect.h"
#include "pilotlight/status.h"
#include "pilotlight/token.h"

struct pl_broker {
    uv_loop_t *loop;
    const pl_config *cfg;
    pl_broker_view views[2];
    pl_engine *engine;
    pl_confirm_loop *confirm_loop; /* the deliveries awaiting their ACK ... */
    pl_confirm *confirm;         /* ... as the broker's hooks see them */
    pl_redirect *ring;           /* the key ring's side of a request */
    pl_status *status;           /* /metrics, /status, /debug/... */
    pl_diag *diag;               /* ... its record of each dispatch */
    pl_token_verifier *verifier; /* NULL when token_mode is disabled */
    uv_timer_t timer;            /* the engine's next park timeout */
    pl_metrics metrics;
    int draining, closing;
    size_t connect_len;
    char connect_body[96];
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
        pl_confirm_writing(b->confirm, c);
        if ((rc = pl_conn_respond(c, 200, "application/json", NULL, m->payload,
                                  m->payload_len)) != 0)
            return rc;
        return pl_confirm_written(b->confirm);
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
    case PL_OUTCOME_MOVED:
        pl_redirect_moved(c, arg); /* its key went to another instance */
        break;
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
    uint64_t due;

    if (pl_engine_next_deadline(b->engine, &due) == 0)
        pl_timer_at(&b->timer, timer_cb, due, 0);
}

static void timer_cb(uv_timer_t *t)
{
    pl_broker *b = container_of(t, pl_broker, timer);

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

/* /connect's body. With warm_starts = off, 0 for both: a controller that
 * reads 0 there exits instead of polling (Trigger.dev's run controller,
 * after each run). */
static void set_connect_body(pl_broker *b, const pl_config *cfg)
{
    int off = cfg->warm_starts == PL_WARM_STARTS_OFF;

    b->connect_len = (size_t)snprintf(b->connect_body, sizeof(b->connect_body),
                                      "{\"connectionTimeoutMs\":%llu,\"keepaliveMs\":%llu}",
                                      off ? 0ULL : (unsigned long long)cfg->connection_timeout_ms,
                                      off ? 0ULL : (unsigned long long)cfg->keepalive_ms);
}

static pl_confirm_opts confirm_opts(const pl_config *cfg)
{
    pl_confirm_opts opts = {cfg->delivery == PL_DELIVERY_CONFIRM, cfg->confirm_timeout_ms,
                            cfg->confirm_wait_max_ms};
    return opts;
}

static void answer_dispatch(void *arg, pl_conn *c, const pl_message *m, uint32_t note,
                            pl_dispatch_result result, uint64_t waited_ms, uint64_t start_ns);
static int poll_ok(void *arg, void *owner, uint64_t parked_at, const pl_message *m);

pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg)
{
    pl_engine_opts opts = engine_opts(cfg);
    pl_confirm_opts copts = confirm_opts(cfg);
    pl_broker *b = pl_malloc(sizeof(*b));

    if (b == NULL)
        return NULL;
    memset(b, 0, sizeof(*b));
    b->loop = loop;
    b->cfg = cfg;
    pl_metrics_init(&b->metrics);
    set_connect_body(b, cfg);
    /* confirm last: the only one to set up handles on the loop, which a
     * failure here could not close. */
    if ((b->engine = pl_engine_new(&opts)) == NULL || pl_poll_verifier_new(cfg, &b->verifier) != 0 ||
        (b->ring = pl_redirect_new(loop, b->engine, cfg, &b->metrics)) == NULL ||
        (b->status = pl_status_new(loop, b->engine, &b->metrics, cfg)) == NULL ||
        (b->confirm_loop = pl_confirm_loop_new(loop, b->engine, &b->metrics.confirm, &copts,
                                               answer_dispatch, poll_ok, b)) == NULL) {
        pl_broker_free(b);
        return NULL;
    }
    b->confirm = pl_confirm_loop_confirm(b->confirm_loop);
    b->diag = pl_status_diag(b->status);
    uv_timer_init(loop, &b->timer);
    return b;
}

int pl_broker_reconfigure(pl_broker *b, const pl_config *next)
{
    pl_engine_opts opts = engine_opts(next);
    pl_confirm_opts copts = confirm_opts(next);
    pl_token_verifier *v;
    int rc;

    if ((rc = pl_poll_verifier_new(next, &v)) != 0) {
        b->metrics.reloads[1]++;
        return rc;
    }
    /* A fresh verifier also forgets tokens cached under a dropped secret. */
    pl_token_verifier_free(b->verifier);
    b->verifier = v;
    pl_engine_set_opts(b->engine, &opts);
    pl_confirm_set_opts(b->confirm, &copts);
    set_connect_body(b, next);
    pl_poll_reload_parked(b->engine, b->cfg, next);
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
    pl_status_attach(b->status, h);
}

void pl_broker_ring_changed(pl_broker *b, const pl_ring *ring, int self, int agreed)
{
    pl_redirect_ring_changed(b->ring, ring, self, agreed, !b->closing);
}

void pl_broker_ring_off(pl_broker *b)
{
    pl_redirect_off(b->ring);
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
    pl_conn_park(c);
    pl_confirm_parked(b->confirm, c);
    if (!uv_is_active((uv_handle_t *)&b->timer))
        timer_arm(b);
}

void pl_broker_park(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    pl_token_claims claims;
    char msg[96];
    const char *err;
    pl_engine_spot spot;
    pl_waiter *w;
    pl_key key;
    int rc, token;

    if (b->cfg->warm_starts == PL_WARM_STARTS_OFF) {
        pl_conn_respond_error(c, 503, PL_POLL_OFF_REASON);
        return;
    }
    rc = pl_poll_key(req, b->verifier, b->cfg->token_mode == PL_TOKEN_MODE_ENFORCE,
                     wall_seconds(), &key, &claims, &token, &err, msg, sizeof(msg));
    if (token != PL_TOKEN_UNCHECKED)
        b->metrics.token[token]++;
    if (token == PL_TOKEN_VALID)
        b->metrics.token_secret[claims.previous != 0]++;
    else if (rc == -EACCES || (rc == 0 && token == PL_TOKEN_INVALID))
        pl_status_token_refused(b->status, &key, token, rc == -EACCES, uv_now(b->loop));
    if (rc != 0) {
        pl_conn_respond_error(c, rc == -EACCES ? 401 : 400, err);
        return;
    }
    if (pl_engine_find(b->engine, &key, &spot) == PL_EINVAL) {
        pl_conn_respond_error(c, 400, "x-trigger-deployment-id or -version is empty or too long");
        return;
    }
    if (pl_redirect_elsewhere(b->ring, c, req, hop, &spot, 0))
        return;
    if (b->closing) {
        pl_conn_close(c); /* as if it had parked just before the drain */
        return;
    }
    rc = pl_engine_park(b->engine, &spot, req->header[PL_HDR_CONTROLLER_ID],
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

/* Answers the dispatcher <c> (NULL: it went away; counted only) with
 * <result>, counts it, and tells the status page of the run <m> (NULL: no
 * key was read): its key, which the engine found at <spot> (NULL: a
 * confirmation's) and pl_diag_tag() tagged <tag> (0: untagged), offered
 * to a poll of its key or not (<offered>), at <now>. */
static void answered(pl_broker *b, pl_conn *c, const pl_message *m, const pl_engine_spot *spot,
                     uint32_t tag, int offered, pl_dispatch_result result,
                     uint64_t waited_ms, uint64_t start_ns, uint64_t now)
{
    uint64_t took = uv_hrtime() - start_ns;
    pl_diag_dispatch x;
    int nearest;

    if (c != NULL)
        pl_conn_respond_json(c, 200, result == PL_DISPATCH_HIT ? "{\"didWarmStart\":true}"
                                                     : "{\"didWarmStart\":false}");
    b->metrics.dispatch[result]++;
    if (result == PL_DISPATCH_HIT)
        pl_histogram_observe(&b->metrics.wait_seconds, (double)waited_ms / 1e3);
    pl_histogram_observe(&b->metrics.dispatch_seconds, (double)took / 1e9);
    if (m == NULL)
        return;
    x = (pl_diag_dispatch){&m->key, spot, tag, m->payload, m->payload_len, result, offered,
                           now, took, waited_ms};
    nearest = pl_diag_dispatched(b->diag, &x);
    if (nearest >= 0) /* a miss, classified */
        b->metrics.miss_nearest[nearest]++;
}

/* The confirmations' answer: every one follows a delivery attempt. The
 * note is the key's tag (pl_diag_tag). */
static void answer_dispatch(void *arg, pl_conn *c, const pl_message *m, uint32_t note,
                            pl_dispatch_result result, uint64_t waited_ms, uint64_t start_ns)
{
    pl_broker *b = arg;

    answered(b, c, m, NULL, note, 1, result, waited_ms, start_ns, uv_now(b->loop));
}

/* Whether the run <m> may go to the poll of <owner> (a connection),
 * parked at <parked_at>: not when its controller is about to give up on it
 * (pl_poll_expiring), which only a poll near its end is asked about. */
static int poll_ok(void *arg, void *owner, uint64_t parked_at, const pl_message *m)
{
    pl_broker *b = arg;
    uint64_t now = uv_now(b->loop), end = parked_at + b->cfg->connection_timeout_ms;
    pl_tcp_facts t;

    (void)m;
    if (now + PL_POLL_NEAR_MS < end)
        return PL_VET_OFFER;
    if (pl_conn_tcp_info(owner, &t) != 0)
        t.rtt_us = t.rttvar_us = 0;
    if (!pl_poll_expiring(parked_at, now, b->cfg->connection_timeout_ms, t.rtt_us, t.rttvar_us))
        return PL_VET_OFFER;
    b->metrics.passed_expiring++;
    return PL_VET_PASS;
}

typedef struct {
    pl_broker *b;
    pl_conn *dispatcher;
    const pl_message *m;
    int asked;
} dispatch_vet;

/* Before the run goes to its first poll: a dispatcher that has gone gave
 * up, and will cold-start the run itself; its end may wait unread in the
 * socket behind its request (one recv, once, and only for a run that has a
 * poll to go to). Then a poll about to be given up on is passed over, and
 * under confirm the polls known to be suspect go last. */
static int vet_poll(void *owner, uint64_t parked_at, void *arg)
{
    dispatch_vet *v = arg;
    pl_broker *b = v->b;
    int rc;

    if (!v->asked) {
        v->asked = 1;
        if (pl_conn_peer_gone(v->dispatcher))
            return PL_VET_STOP;
    }
    if ((rc = poll_ok(b, owner, parked_at, v->m)) != PL_VET_OFFER)
        return rc;
    return pl_confirm_vet(b->confirm, owner);
}

void pl_broker_dispatch(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    uint64_t start = uv_hrtime();
    dispatch_vet vet = {b, c, NULL, 0};
    pl_delivery d = {.vet = vet_poll, .vet_arg = &vet};
    const char *err = NULL;
    pl_engine_spot spot;
    pl_message m;
    uint64_t now;
    int rc;

    if (b->cfg->warm_starts == PL_WARM_STARTS_OFF) {
        answered(b, c, NULL, NULL, 0, 0, PL_DISPATCH_OFF, 0, start, 0); /* no key read */
        return;
    }
    pl_confirm_note_dispatch(b->confirm);
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
    if (pl_redirect_elsewhere(b->ring, c, req, hop, &spot, 1)) {
        pl_message_release(&m);
        return;
    }
    d.payload = &m;
    vet.m = &m;
    now = uv_now(b->loop);
    if (spot.entry != NULL) /* the tag rides with the key: found once */
        pl_diag_tag(b->diag, &spot, now);
    rc = pl_engine_deliver(b->engine, &spot, now, &d);
    if (rc == 0 && pl_redirect_after_miss(b->ring, c, req, hop, &m.key))
        ; /* nothing was delivered here: the run is offered there */
    else if (rc == PL_DELIVERY_PENDING)
        pl_confirm_start(b->confirm, c, &m, &d, start, spot.note);
    else
        answered(b, c, &m, &spot, spot.note, spot.entry != NULL,
                 rc == PL_DELIVERED          ? PL_DISPATCH_HIT
                 : rc == PL_DELIVERY_STOPPED ? PL_DISPATCH_ABANDONED
                                             : PL_DISPATCH_MISS,
                 d.waited_ms, start, now);
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

pl_status *pl_broker_status(pl_broker *b)
{
    return b->status;
}

pl_redirect *pl_broker_ring(pl_broker *b)
{
    return b->ring;
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
    if (!b->closing)
        pl_redirect_recheck(b->ring);
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
    pl_redirect_stop(b->ring);
    pl_confirm_loop_stop(b->confirm_loop);
}

void pl_broker_free(pl_broker *b)
{
    if (b == NULL)
        return;
    pl_status_free(b->status);
    pl_redirect_free(b->ring);
    pl_confirm_loop_free(b->confirm_loop);
    pl_engine_free(b->engine);
    pl_token_verifier_free(b->verifier);
    pl_free(b);
}

const char *pl_broker_serves_name(unsigned serves)
{
    return serves == PL_SERVE_DISPATCH ? "dispatch"
           : serves == PL_SERVE_CONTROLLERS ? "controllers" : "all";
}
