/* broker.c -- the endpoints of PROTOCOL.md, on top of the engine. */
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <llhttp.h>
#include <openssl/crypto.h>
#include <utlist.h>

#include "pilotlight/broker.h"
#include "pilotlight/lag.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/poll.h"
#include "pilotlight/pool.h"
#include "pilotlight/token.h"

#define METRICS_BUFFER_SIZE 32768
#define LAG_PERIOD_MS 100 /* event-loop lag samples: ten a second */

static const char json_type[] = "application/json";

/* What a connection's data pointer holds (pl_conn_set_data kinds). */
enum { DATA_WAITER = 1, DATA_CONFIRM, DATA_DISPATCH };

/* A dispatch whose payload was written to a controller and waits for that
 * controller's TCP acknowledgement (delivery = confirm). It owns the key and
 * payload, so it can offer them to the next poll: the payload in the
 * dispatch request's own bytes, taken over (a copy only where they cannot
 * be), the key strings copied. */
typedef struct confirm confirm;
struct confirm {
    confirm *prev, *next;
    pl_waiter *w;          /* the engine's waiter, pending confirmation */
    pl_conn *controller;   /* holds DATA_CONFIRM -> this */
    pl_conn *dispatcher;   /* holds DATA_DISPATCH -> this; NULL once gone */
    uint64_t deadline;     /* of the whole confirmation (loop ms) */
    uint64_t due;          /* of this attempt (loop ms) */
    uint64_t start_ns, sent_ns, waited_ms;
    uint64_t since;        /* this attempt began (loop ms) */
    uint64_t poll_from;    /* a polled attempt's next look (loop ms) */
    confirm *fprev, *fnext; /* in the broker's fresh list, while in it */
    uint64_t turn;          /* the loop turn its payload was written in */
    unsigned in_grace : 1;
    unsigned polling : 1;  /* no ACK report comes: ask the kernel */
    unsigned rides : 1;    /* its next request is to bring the ACK */
    unsigned swept : 1;    /* no report asked for: the busy loop looks itself,
                              in the fresh list until it is polled */
    pl_buf request;        /* the dispatch request's bytes, or none */
    pl_message msg;        /* views into request or data[] */
    char data[];
};

/* A record's bytes: the payload follows it unless the request's bytes were
 * taken, then the key strings. */
static size_t confirm_size(const confirm *rec)
{
    return sizeof(*rec) + (rec->request.data != NULL ? 0 : rec->msg.payload_len) +
           rec->msg.key.deployment_len + rec->msg.key.version_len;
}

/* An attempt lasts at least this long before the run moves on to another
 * poll: above Linux's shortest delayed ACK (40 ms), so a live controller
 * whose ACK was merely delayed is not reset. */
#define CONFIRM_ATTEMPT_MIN_MS 50

/* A controller whose ACK comes with its next request is asked for it only
 * once that request is this late, then each time its wait has doubled: a
 * prompt one costs no syscall at all, a stalled crowd few. */
#define CONFIRM_RIDE_MS 10

/* A busy broker looks for a controller's ACK itself on the loop's next
 * turns (SIOCOUTQ) instead of asking the kernel for a report: a report
 * wakes the loop on its own, which costs more than the look in a turn that
 * comes anyway (docs/benchmarks.md). Busy: dispatches closer together than
 * this, on average (an EWMA of their gaps, each counted at most as
 * SWEEP_GAP_MAX_NS so that one quiet spell is forgotten as quickly). */
#define SWEEP_GAP_NS 500000
#define SWEEP_GAP_MAX_NS 10000000

/* A swept delivery no turn has confirmed this long after its write is
 * polled as one without reports (each millisecond), and the timer that
 * ends the window makes sure a loop with nothing else to do looks. */
#define SWEEP_WINDOW_MS 20

/* One listener's view of the broker: the <app> of its pl_http. */
typedef struct {
    pl_broker *b;
    unsigned serves; /* PL_SERVE_* */
} side;

struct pl_broker {
    uv_loop_t *loop;
    const pl_config *cfg;
    const pl_http *https[2];
    side sides[2];
    pl_engine *engine;
    pl_token_verifier *verifier; /* NULL when token_mode is disabled */
    uv_timer_t timer;         /* the engine's next park timeout */
    uv_timer_t confirm_timer; /* the next attempt due; 1 ms while polling */
    uint64_t confirm_due;     /* when confirm_timer fires */
    confirm *confirms;
    confirm *fresh;           /* swept records in their window, oldest first */
    uv_check_t sweep;         /* looks at them after each turn's I/O */
    uv_timer_t sweep_timer;   /* ends the oldest one's window */
    uint64_t turns;           /* loop turns swept, to skip a record's own */
    uint64_t dispatch_ns, dispatch_gap_ns; /* the last dispatch; the gaps' EWMA */
    uint64_t ack_srtt_ns, ack_rttvar_ns; /* ACK times seen, as TCP's RTO */
    pl_conn *taken_conn;      /* set by on_settle for a pending delivery */
    pl_waiter *taken_waiter;
    pl_metrics metrics;
    pl_lag *lag;
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

static int confirm_sweeps(const pl_broker *b)
{
    return b->dispatch_gap_ns < SWEEP_GAP_NS;
}

/* Only confirm asks whether the broker is busy, so only it keeps count. */
static void note_dispatch_gap(pl_broker *b, uint64_t start)
{
    uint64_t gap = start - b->dispatch_ns;

    b->dispatch_ns = start;
    gap = gap < SWEEP_GAP_MAX_NS ? gap : SWEEP_GAP_MAX_NS;
    b->dispatch_gap_ns = (7 * b->dispatch_gap_ns + gap) / 8;
}

/* The engine's settle callback: the one place a parked poll is answered. */
static int on_settle(void *owner, pl_outcome outcome, const void *arg)
{
    pl_conn *c = owner;
    const pl_message *m = arg;
    pl_broker *b = ((side *)pl_conn_app(c))->b;
    unsigned kind;
    pl_waiter *w = pl_conn_data(c, &kind);

    /* The waiter leaves the connection first, so a failing write that
     * closes it finds nothing to settle again. */
    pl_conn_set_data(c, NULL, 0);
    switch (outcome) {
    case PL_OUTCOME_MATCHED:
        if (b->cfg->delivery == PL_DELIVERY_CONFIRM && confirm_sweeps(b))
            pl_conn_skip_ack_report(c);
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
        /* A controller that hung up and polled again on another connection
         * can be read before its hang-up is: that poll was given up, not
         * replaced, and a 409 would go nowhere. */
        if (pl_conn_peer_gone(c)) {
            pl_conn_close(c);
            return -1;
        }
        reply_error(c, 409, "replaced by a newer poll from the same controller");
        break;
    case PL_OUTCOME_REJECTED:
        reply_error(c, 503, arg);
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
            reply_error(c, 401, arg);
        else
            pl_conn_close(c);
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
    return *out != NULL ? 0 : -1;
}

static void set_connect_body(pl_broker *b, const pl_config *cfg)
{
    b->connect_len = (size_t)snprintf(b->connect_body, sizeof(b->connect_body),
                                      "{\"connectionTimeoutMs\":%llu,\"keepaliveMs\":%llu}",
                                      (unsigned long long)cfg->connection_timeout_ms,
                                      (unsigned long long)cfg->keepalive_ms);
}

pl_broker *pl_broker_new(uv_loop_t *loop, const pl_config *cfg)
{
    pl_engine_opts opts = engine_opts(cfg);
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
    uv_timer_init(loop, &b->timer);
    uv_timer_init(loop, &b->confirm_timer);
    b->confirm_timer.data = b;
    uv_check_init(loop, &b->sweep);
    b->sweep.data = b;
    uv_timer_init(loop, &b->sweep_timer);
    b->sweep_timer.data = b;
    b->dispatch_gap_ns = SWEEP_GAP_MAX_NS;
    b->lag = pl_lag_start(loop, &b->metrics.loop_lag, LAG_PERIOD_MS);
    return b;
}

/* What a poll's deployment id was found to be as it parked, kept as its
 * waiter's tag: a reload that tightens the token rules judges the poll by
 * it, as the token itself is not kept. UNKNOWN (0) is also what a poll
 * adopted from an older process has: the hand-over does not carry it. */
enum { TRUST_UNKNOWN = 0, TRUST_BARE, TRUST_INVALID, TRUST_CURRENT, TRUST_PREVIOUS };

/* A reload's view of the parked polls' tags: they name the secrets of
 * <old>, the configuration in force until now. */
typedef struct {
    const pl_config *old, *next;
    int remap;   /* the secrets changed */
    int enforce; /* enforce's rules apply anew */
} rejudge;

/* Which of <next>'s secrets <secret> is, as a tag; INVALID once dropped. */
static unsigned secret_now(const char *secret, const pl_config *next)
{
    if (*secret != '\0' && strcmp(secret, next->token_secret) == 0)
        return TRUST_CURRENT;
    if (*secret != '\0' && strcmp(secret, next->token_secret_previous) == 0)
        return TRUST_PREVIOUS;
    return TRUST_INVALID;
}

/* pl_engine_revoke's judge: what a new poll with the same deployment id
 * would get under <next>, as far as the tag tells. Expiry is not judged
 * again: a token is checked when its poll parks. */
static int judge_poll(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    const rejudge *r = arg;

    (void)info;
    if (r->remap) {
        if (*tag == TRUST_CURRENT)
            *tag = secret_now(r->old->token_secret, r->next);
        else if (*tag == TRUST_PREVIOUS)
            *tag = secret_now(r->old->token_secret_previous, r->next);
        else if (*tag == TRUST_INVALID)
            *tag = TRUST_UNKNOWN; /* a new secret may verify it */
    }
    if (!r->enforce || *tag == TRUST_CURRENT || *tag == TRUST_PREVIOUS)
        return 0;
    *why = *tag == TRUST_BARE      ? "a signed deployment token is required"
           : *tag == TRUST_INVALID ? "invalid deployment token"
                                   : NULL; /* never verified here: asked again */
    return 1;
}

/* Applies a reload's tighter rules to what is parked: token mode and
 * secrets, then lower caps. Each poll refused is answered as a new one
 * would be and counted (revoked, rejected). */
static void apply_to_parked(pl_broker *b, const pl_config *next)
{
    const pl_config *old = b->cfg;
    rejudge r = {old, next, 0, 0};
    size_t revoked = 0, rejected = 0;

    r.remap = strcmp(old->token_secret, next->token_secret) != 0 ||
              strcmp(old->token_secret_previous, next->token_secret_previous) != 0;
    r.enforce = next->token_mode == PL_TOKEN_MODE_ENFORCE &&
                (old->token_mode != PL_TOKEN_MODE_ENFORCE || r.remap);
    if (r.remap || r.enforce)
        revoked = pl_engine_revoke(b->engine, judge_poll, &r);
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
    pl_token_verifier *v;

    if (make_verifier(next, &v) != 0) {
        b->metrics.reloads[1]++;
        return -1;
    }
    /* A fresh verifier also forgets tokens cached under a dropped secret. */
    pl_token_verifier_free(b->verifier);
    b->verifier = v;
    pl_engine_set_opts(b->engine, &opts);
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

void *pl_broker_side(pl_broker *b, unsigned serves)
{
    side *sd = &b->sides[serves == PL_SERVE_DISPATCH ? 1 : 0];

    sd->b = b;
    sd->serves = serves;
    return sd;
}

void pl_broker_attach(pl_broker *b, const pl_http *h)
{
    b->https[b->https[0] != NULL] = h;
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
    pl_conn_set_data(c, w, DATA_WAITER);
    if (pl_conn_watch_acks(c, b->cfg->delivery == PL_DELIVERY_CONFIRM) != 0)
        b->metrics.ack_events_refused++;
    if (!uv_is_active((uv_handle_t *)&b->timer))
        timer_arm(b);
}

/* The tag of a poll parked with the deployment-id header of <req>. */
static unsigned trust_of(int token, const pl_token_claims *claims, const pl_key *key,
                         const pl_request *req)
{
    if (token == PL_TOKEN_VALID)
        return claims->previous ? TRUST_PREVIOUS : TRUST_CURRENT;
    if (token == PL_TOKEN_INVALID)
        return TRUST_INVALID;
    /* Legacy, or not verified: a bare id is the header itself (poll.h),
     * a token's claim is not. */
    return key->deployment == req->header[PL_HDR_DEPLOYMENT_ID] ? TRUST_BARE : TRUST_UNKNOWN;
}

static void handle_park(pl_broker *b, pl_conn *c, const pl_request *req)
{
    pl_token_claims claims;
    char msg[96];
    const char *err;
    pl_waiter *w;
    pl_key key;
    int rc, token;

    rc = pl_poll_key(req, b->verifier, b->cfg->token_mode == PL_TOKEN_MODE_ENFORCE,
                     wall_seconds(), &key, &claims, &token, &err, msg, sizeof(msg));
    if (token >= 0)
        b->metrics.token[token]++;
    if (token == PL_TOKEN_VALID)
        b->metrics.token_secret[claims.previous != 0]++;
    if (rc != 0) {
        reply_error(c, rc, err);
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
        pl_engine_set_tag(w, trust_of(token, &claims, &key, req));
        hold_waiter(b, c, w);
        pl_conn_detect_dead_peer(c, (unsigned)b->cfg->tcp_keepalive_idle_s,
                                 (unsigned)b->cfg->tcp_keepalive_interval_s,
                                 (unsigned)b->cfg->tcp_keepalive_count,
                                 (unsigned)b->cfg->tcp_user_timeout_ms);
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

/* Fires confirm_timer at <due> unless it fires sooner already; it may fire
 * early (the record it was armed for settled), then re-arms. */
static void confirm_arm(pl_broker *b, uint64_t due)
{
    uint64_t now = uv_now(b->loop);

    if (uv_is_active((uv_handle_t *)&b->confirm_timer) && b->confirm_due <= due)
        return;
    b->confirm_due = due;
    uv_timer_start(&b->confirm_timer, confirm_tick, due > now ? due - now : 0, 0);
}

/* How long one controller gets to acknowledge before the run may move on:
 * what ACKs take here (mean + 4 deviations, as TCP's retransmit timer), but
 * at least CONFIRM_ATTEMPT_MIN_MS. */
static uint64_t confirm_budget(const pl_broker *b)
{
    uint64_t ms = (b->ack_srtt_ns + 4 * b->ack_rttvar_ns) / 1000000 + 1;

    return ms > CONFIRM_ATTEMPT_MIN_MS ? ms : CONFIRM_ATTEMPT_MIN_MS;
}

static void confirm_learn(pl_broker *b, uint64_t ns)
{
    uint64_t d;

    if (b->ack_srtt_ns == 0) {
        b->ack_srtt_ns = ns;
        b->ack_rttvar_ns = ns / 2;
        return;
    }
    d = ns > b->ack_srtt_ns ? ns - b->ack_srtt_ns : b->ack_srtt_ns - ns;
    b->ack_rttvar_ns = (3 * b->ack_rttvar_ns + d) / 4;
    b->ack_srtt_ns = (7 * b->ack_srtt_ns + ns) / 8;
}

/* When an attempt starting at <now> runs out: its budget, within <rec>'s
 * deadline. */
static uint64_t attempt_due(const pl_broker *b, const confirm *rec, uint64_t now)
{
    uint64_t due = now + confirm_budget(b);

    return due < rec->deadline ? due : rec->deadline;
}

/* When <rec> is next to be looked at, seen at <now>: its attempt's end, or
 * the next poll. */
static uint64_t confirm_next(const confirm *rec, uint64_t now)
{
    uint64_t at = rec->poll_from > now ? rec->poll_from : now + 1;

    if (!rec->polling)
        return rec->due;
    return at < rec->due ? at : rec->due;
}

static void confirm_acked(pl_broker *b, confirm *rec, pl_confirm_method how);
static void sweep_cb(uv_check_t *check);
static void sweep_timer_cb(uv_timer_t *t);

/* <rec>, written in this turn, is looked at from the next one on. The
 * window timer is started once and left to run out, not moved for every
 * delivery: it is there for a loop with nothing else to wake it. */
static void fresh_join(pl_broker *b, confirm *rec)
{
    rec->turn = b->turns;
    DL_APPEND2(b->fresh, rec, fprev, fnext);
    if (rec == b->fresh)
        uv_check_start(&b->sweep, sweep_cb);
    if (!uv_is_active((uv_handle_t *)&b->sweep_timer))
        uv_timer_start(&b->sweep_timer, sweep_timer_cb, SWEEP_WINDOW_MS, 0);
}

static void fresh_leave(pl_broker *b, confirm *rec)
{
    if (!rec->swept || rec->polling)
        return;
    DL_DELETE2(b->fresh, rec, fprev, fnext);
    if (b->fresh == NULL)
        uv_check_stop(&b->sweep);
}

/* Looks at the fresh records written before this turn: an acknowledged
 * one is confirmed, one past its window is polled from now on. */
static void sweep(pl_broker *b)
{
    uint64_t now = uv_now(b->loop);
    confirm *rec, *after;

    for (rec = b->fresh; rec != NULL && rec->turn != b->turns; rec = after) {
        int state = pl_conn_acknowledged(rec->controller);
        after = rec->fnext;
        if (state == 1) {
            confirm_acked(b, rec, PL_CONFIRM_BY_NEXT_TURN);
        } else if (state < 0 || now - rec->since >= SWEEP_WINDOW_MS) {
            fresh_leave(b, rec);
            rec->polling = 1;
            rec->poll_from = now + (state < 0 ? 0 : 1);
            confirm_arm(b, confirm_next(rec, now));
        }
    }
}

static void sweep_cb(uv_check_t *check)
{
    pl_broker *b = check->data;

    sweep(b);
    b->turns++;
}

static void sweep_timer_cb(uv_timer_t *t)
{
    pl_broker *b = t->data;
    uint64_t now = uv_now(b->loop), due;

    sweep(b);
    if (b->fresh != NULL) {
        due = b->fresh->since + SWEEP_WINDOW_MS;
        uv_timer_start(t, sweep_timer_cb, due > now ? due - now : 1, 0);
    }
}

/* Takes the pending delivery on_settle just left into <rec>: a new attempt,
 * watched by the controller's ACK report where it gives one, else by its
 * next request or by polling. */
static void confirm_attach(pl_broker *b, confirm *rec, uint64_t now)
{
    int how;

    fresh_leave(b, rec);
    rec->w = b->taken_waiter;
    rec->controller = b->taken_conn;
    pl_conn_set_data(rec->controller, rec, DATA_CONFIRM);
    how = pl_conn_expect_ack(rec->controller);
    if (how == PL_CONN_ACK_REFUSED)
        b->metrics.ack_events_refused++; /* set on the socket, refused per write */
    if (how == PL_CONN_ACK_REPORT)
        rec->sent_ns = uv_hrtime();
    rec->swept = how == PL_CONN_ACK_POLL && confirm_sweeps(b);
    rec->polling = how != PL_CONN_ACK_REPORT && !rec->swept;
    rec->rides = how == PL_CONN_ACK_NEXT_REQUEST;
    rec->since = now;
    if (rec->swept)
        fresh_join(b, rec);
    rec->poll_from = now + (rec->rides ? CONFIRM_RIDE_MS : 1);
    rec->due = rec->in_grace ? rec->deadline : attempt_due(b, rec, now);
    confirm_arm(b, confirm_next(rec, now));
}

static void confirm_finish(pl_broker *b, confirm *rec, int delivered)
{
    size_t size;

    fresh_leave(b, rec);
    if (rec->w != NULL) {
        pl_conn_release(rec->controller);
        pl_engine_confirm(b->engine, rec->w, delivered);
    }
    if (delivered)
        b->metrics.confirm[PL_CONFIRM_ACKED]++;
    if (rec->dispatcher != NULL) {
        pl_conn_set_data(rec->dispatcher, NULL, 0);
        answer_dispatch(b, rec->dispatcher, delivered, rec->waited_ms, rec->start_ns);
    } else {
        count_dispatch(b, delivered, rec->waited_ms, rec->start_ns);
    }
    /* With nothing left to watch the timer stops: left armed, it would cut
     * the loop's sleeps short as it counts down, and on a VM a sleep of a
     * millisecond or two costs more CPU than a wake-up (docs/benchmarks.md). */
    DL_DELETE(b->confirms, rec);
    if (b->confirms == NULL)
        uv_timer_stop(&b->confirm_timer);
    size = confirm_size(rec); /* before the request it counts is freed */
    pl_buf_free(&rec->request);
    pl_pool_free(rec, size);
}

static void confirm_acked(pl_broker *b, confirm *rec, pl_confirm_method how)
{
    b->metrics.confirm_method[how]++;
    confirm_finish(b, rec, 1);
}

/* <rec>'s controller failed (<why> reset) or did not acknowledge in its
 * time (timeout): it is reset, counted a disconnect, and the run goes to
 * the key's next poll. Past the deadline one more poll gets a short grace;
 * with none left, false. */
static void confirm_fail(pl_broker *b, confirm *rec, uint64_t now, pl_confirm_outcome why)
{
    uint64_t grace = b->cfg->confirm_timeout_ms / 10 > 10 ? b->cfg->confirm_timeout_ms / 10 : 10;

    PL_LOG(PL_LOG_DEBUG, "delivery not confirmed", "\"failed\":%d", why == PL_CONFIRM_RESET);
    b->metrics.confirm[why]++;
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
    if (pl_engine_deliver(b->engine, &rec->msg.key, &rec->msg, now, &rec->waited_ms) == 0) {
        confirm_finish(b, rec, 0);
    } else {
        b->metrics.confirm[PL_CONFIRM_REDELIVERED]++;
        confirm_attach(b, rec, now);
    }
}

/* An attempt that ran out of time while nobody else waits for the key goes
 * on, up to the deadline: resetting it would gain nothing. Returns 1 when
 * it does. */
static int confirm_extend(pl_broker *b, confirm *rec, uint64_t now)
{
    if (now >= rec->deadline || pl_engine_waiting(b->engine, &rec->msg.key) > 0)
        return 0;
    rec->due = attempt_due(b, rec, now);
    return 1;
}

/* Looks at <rec> on a timer tick or as its controller closes (<closing>:
 * the socket is still open). A polled controller is asked at its
 * poll_from; any other is asked once, before its connection would be
 * reset. */
static void confirm_check(pl_broker *b, confirm *rec, uint64_t now, int closing)
{
    int state;

    if (!rec->polling && !closing && (now < rec->due || confirm_extend(b, rec, now)))
        return;
    if (rec->polling && !closing && now < rec->poll_from && now < rec->due)
        return;
    state = pl_conn_acknowledged(rec->controller);
    if (state == 1) {
        if (rec->rides && !closing)
            pl_conn_report_acks(rec->controller); /* it stopped re-polling at once */
        confirm_acked(b, rec, rec->swept ? PL_CONFIRM_BY_NEXT_TURN : PL_CONFIRM_BY_POLL);
        return;
    }
    /* Only a polled controller gets here with its attempt not yet judged. */
    if (state == 0 && rec->polling && !closing) {
        rec->poll_from = now + (rec->rides ? now - rec->since : 1);
        if (now < rec->due || confirm_extend(b, rec, now))
            return;
    }
    confirm_fail(b, rec, now, state < 0 || closing ? PL_CONFIRM_RESET : PL_CONFIRM_TIMEOUT);
}

static void confirm_tick(uv_timer_t *t)
{
    pl_broker *b = t->data;
    uint64_t now = uv_now(b->loop), next = UINT64_MAX;
    confirm *rec, *after;

    for (rec = b->confirms; rec != NULL; rec = after) {
        after = rec->next;
        confirm_check(b, rec, now, 0);
    }
    /* A record left can only be one still waiting (a settled one is freed,
     * a redelivered one re-armed the timer already). */
    for (rec = b->confirms; rec != NULL; rec = rec->next) {
        uint64_t due = confirm_next(rec, now);
        if (due < next)
            next = due;
    }
    if (next != UINT64_MAX) {
        uv_timer_stop(t);
        confirm_arm(b, next);
    }
}

/* The controller's ACK report arrived for everything written to it. */
static void confirm_on_acked(pl_broker *b, confirm *rec)
{
    uint64_t ns = uv_hrtime() - rec->sent_ns;

    pl_metrics_observe(&b->metrics.confirm_ack_seconds, (double)ns / 1e9);
    confirm_learn(b, ns);
    confirm_acked(b, rec, PL_CONFIRM_BY_ACK_EVENT);
}

/* The delivery on_settle left pending becomes a confirmation record; the
 * dispatcher's answer waits for it. */
static void confirm_start(pl_broker *b, pl_conn *dispatcher, const pl_message *m,
                          uint64_t now, uint64_t waited_ms, uint64_t start_ns)
{
    size_t dl = m->key.deployment_len, vl = m->key.version_len, pl = 0;
    pl_buf request = {0};
    confirm *rec;

    /* The payload is a view into the request's bytes: keeping them saves a
     * copy of it for every delivery. */
    if (pl_conn_take_request(dispatcher, &request) != 0)
        pl = m->payload_len;
    rec = pl_pool_alloc(sizeof(*rec) + pl + dl + vl, NULL);
    if (rec == NULL) {
        /* Written but cannot be watched: answer as delivery = written. */
        pl_buf_free(&request);
        pl_engine_confirm(b->engine, b->taken_waiter, 1);
        answer_dispatch(b, dispatcher, 1, waited_ms, start_ns);
        return;
    }
    memset(rec, 0, sizeof(*rec));
    rec->request = request;
    memcpy(rec->data, m->payload, pl);
    memcpy(rec->data + pl, m->key.deployment, dl);
    memcpy(rec->data + pl + dl, m->key.version, vl);
    rec->msg.key = m->key;
    rec->msg.payload = request.data != NULL ? m->payload : rec->data;
    rec->msg.payload_len = m->payload_len;
    rec->msg.key.deployment = rec->data + pl;
    rec->msg.key.version = rec->data + pl + dl;
    rec->dispatcher = dispatcher;
    rec->deadline = now + b->cfg->confirm_timeout_ms;
    rec->start_ns = start_ns;
    rec->waited_ms = waited_ms;
    DL_PREPEND(b->confirms, rec);
    confirm_attach(b, rec, now);
    pl_conn_set_data(dispatcher, rec, DATA_DISPATCH);
    pl_conn_hold_on_eof(dispatcher); /* it may half-close as it waits */
}

static void handle_dispatch(pl_broker *b, pl_conn *c, const pl_request *req)
{
    uint64_t start = uv_hrtime(), now, waited_ms = 0;
    const char *err = NULL;
    pl_message m;
    int rc;

    if (b->cfg->delivery == PL_DELIVERY_CONFIRM)
        note_dispatch_gap(b, start);
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
    now = uv_now(b->loop);
    rc = pl_engine_deliver(b->engine, &m.key, &m, now, &waited_ms);
    if (rc == PL_DELIVERY_PENDING)
        confirm_start(b, c, &m, now, waited_ms, start);
    else
        answer_dispatch(b, c, rc == PL_DELIVERED, waited_ms, start);
    pl_message_release(&m);
}

/* ---- the rest ---- */

static void handle_connect(pl_broker *b, pl_conn *c, const pl_request *req)
{
    (void)req;
    pl_conn_respond(c, 200, json_type, NULL, b->connect_body, b->connect_len);
}

static void handle_healthz(pl_broker *b, pl_conn *c, const pl_request *req)
{
    (void)b, (void)req;
    reply_json(c, 200, "{\"status\":\"ok\"}");
}

static void handle_readyz(pl_broker *b, pl_conn *c, const pl_request *req)
{
    (void)req;
    if (b->draining)
        reply_json(c, 503, "{\"status\":\"draining\"}");
    else
        reply_json(c, 200, "{\"status\":\"ready\"}");
}

static void handle_metrics(pl_broker *b, pl_conn *c, const pl_request *req)
{
    size_t len;

    (void)req;
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
    len = pl_metrics_render(&b->metrics, pl_engine_ledger(b->engine),
                            pl_engine_key_count(b->engine), b->metrics_buf,
                            sizeof(b->metrics_buf));
    if (len == 0)
        reply_error(c, 500, "metrics do not fit their buffer");
    else
        pl_conn_respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", NULL,
                        b->metrics_buf, len);
}

#define DEBUG_KEYS_MAX 1000

typedef struct {
    pl_buf buf;
    uint64_t now;
    int first, failed;
} json_out;

static void out_put(json_out *o, const char *s, size_t n)
{
    if (!o->failed && pl_buf_append(&o->buf, s, n) != 0)
        o->failed = 1;
}

static void out_key(const pl_key_info *info, void *arg)
{
    json_out *o = arg;
    char dep[PL_KEY_FIELD_MAX * 6 + 1], ver[PL_KEY_FIELD_MAX * 6 + 1], line[256];
    int n;

    pl_log_escape(dep, sizeof(dep), info->key.deployment, info->key.deployment_len);
    pl_log_escape(ver, sizeof(ver), info->key.version, info->key.version_len);
    out_put(o, o->first ? "" : ",", o->first ? 0 : 1);
    o->first = 0;
    out_put(o, "{\"deployment\":\"", 15);
    out_put(o, dep, strlen(dep));
    out_put(o, "\",\"version\":\"", 13);
    out_put(o, ver, strlen(ver));
    n = snprintf(line, sizeof(line),
                 "\",\"cpu\":%.17g,\"memory\":%.17g,\"parked\":%zu,\"oldest_wait_ms\":%llu}",
                 info->key.cpu, info->key.memory, info->parked,
                 (unsigned long long)(o->now - info->oldest_parked_at));
    out_put(o, line, (size_t)n);
}

/* GET /debug/waiters: what is parked, per key; no payloads, at most
 * DEBUG_KEYS_MAX keys. */
static void handle_debug_waiters(pl_broker *b, pl_conn *c, const pl_request *req)
{
    json_out o = {{NULL, 0, 0}, uv_now(b->loop), 1, 0};
    size_t total;
    char tail[128];
    int n;

    (void)req;
    out_put(&o, "{\"keys\":[", 9);
    total = pl_engine_each_key(b->engine, DEBUG_KEYS_MAX, out_key, &o);
    n = snprintf(tail, sizeof(tail), "],\"total_keys\":%zu,\"parked\":%llu,\"truncated\":%s}",
                 total, (unsigned long long)pl_engine_ledger(b->engine)->parked_now,
                 total > DEBUG_KEYS_MAX ? "true" : "false");
    out_put(&o, tail, (size_t)n);
    if (o.failed)
        reply_error(c, 503, "out of memory");
    else
        pl_conn_respond(c, 200, json_type, NULL, o.buf.data, o.buf.len);
    pl_buf_free(&o.buf);
}

typedef void (*handler)(pl_broker *b, pl_conn *c, const pl_request *req);

static const struct route {
    const char *path;
    int method;      /* HTTP_GET also takes HEAD */
    pl_route tag;
    unsigned serves; /* PL_SERVE_* */
    int bearer;      /* needs dispatch_token when one is set */
    handler fn;
} routes[] = {
    {"/warm-start", HTTP_GET, PL_ROUTE_PARK, PL_SERVE_CONTROLLERS, 0, handle_park},
    {"/warm-start", HTTP_POST, PL_ROUTE_DISPATCH, PL_SERVE_DISPATCH, 1, handle_dispatch},
    {"/connect", HTTP_GET, PL_ROUTE_CONNECT, PL_SERVE_CONTROLLERS, 0, handle_connect},
    {"/healthz", HTTP_GET, PL_ROUTE_HEALTHZ, PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH, 0, handle_healthz},
    {"/readyz", HTTP_GET, PL_ROUTE_READYZ, PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH, 0, handle_readyz},
    {"/metrics", HTTP_GET, PL_ROUTE_METRICS, PL_SERVE_DISPATCH, 0, handle_metrics},
    {"/debug/waiters", HTTP_GET, PL_ROUTE_DEBUG, PL_SERVE_DISPATCH, 1, handle_debug_waiters},
};

#define NROUTES (sizeof(routes) / sizeof(routes[0]))

static int path_is(const pl_request *req, const char *path)
{
    size_t len = strlen(path);
    return req->path_len == len && memcmp(req->path, path, len) == 0;
}

/* Compares "Bearer <token>" with dispatch_token in constant time. */
static int bearer_ok(const pl_broker *b, const pl_request *req)
{
    const char *want = b->cfg->dispatch_token, *got = req->header[PL_HDR_AUTHORIZATION];
    size_t wlen = strlen(want), glen = req->header_len[PL_HDR_AUTHORIZATION];

    if (got == NULL || glen != wlen + 7 || strncasecmp(got, "Bearer ", 7) != 0)
        return 0;
    return CRYPTO_memcmp(got + 7, want, wlen) == 0;
}

static void reply_405(pl_conn *c, const pl_request *req)
{
    int post = 0;

    for (size_t i = 0; i < NROUTES; i++)
        if (path_is(req, routes[i].path) && routes[i].method == HTTP_POST)
            post = 1;
    pl_conn_respond(c, 405, json_type, post ? "Allow: GET, POST\r\n" : "Allow: GET, HEAD\r\n",
                    "{\"error\":\"method not allowed\"}", 30);
}

void pl_broker_on_request(void *app, pl_conn *c, const pl_request *req)
{
    side *sd = app;
    pl_broker *b = sd->b;
    int method = req->method == HTTP_HEAD ? HTTP_GET : req->method, known = 0;
    unsigned kind;
    confirm *rec = pl_conn_data(c, &kind);

    /* A controller speaking again on the connection its run went out on is
     * alive and reading: its delivery counts as confirmed. */
    if (kind == DATA_CONFIRM)
        confirm_acked(b, rec, PL_CONFIRM_BY_NEXT_REQUEST);
    for (size_t i = 0; i < NROUTES; i++) {
        const struct route *r = &routes[i];
        if (!path_is(req, r->path))
            continue;
        known = 1;
        if (r->method != method || (req->method == HTTP_HEAD && r->fn == handle_park))
            continue;
        pl_conn_set_tag(c, r->tag);
        if (!(r->serves & sd->serves))
            reply_error(c, 403, "not served on this listener");
        else if (r->bearer && b->cfg->dispatch_token[0] != '\0' && !bearer_ok(b, req))
            pl_conn_respond(c, 401, json_type, "WWW-Authenticate: Bearer\r\n",
                            "{\"error\":\"missing or wrong bearer token\"}", 41);
        else
            r->fn(b, c, req);
        return;
    }
    if (known)
        reply_405(c, req);
    else
        reply_error(c, 404, "not found");
}

void pl_broker_on_close(void *app, pl_conn *c)
{
    pl_broker *b = ((side *)app)->b;
    unsigned kind;
    void *data = pl_conn_data(c, &kind);

    if (kind == DATA_CONFIRM) {
        /* Reset before its ACK was seen, with the whole payload sent: taken
         * as delivered, as written would. Offering the run again could run
         * it twice where the peer read it and reset (HAProxy's server side
         * does); a reset that crossed the payload in flight needs a peer
         * closing abortively at that instant. */
        if (pl_conn_reset_after_write(c))
            confirm_acked(b, data, PL_CONFIRM_BY_RESET);
        else
            confirm_check(b, data, uv_now(b->loop), 1); /* the socket is still open */
        return;
    }
    pl_conn_set_data(c, NULL, 0);
    if (kind == DATA_WAITER)
        pl_engine_settle(b->engine, data, PL_OUTCOME_DISCONNECT);
    else if (kind == DATA_DISPATCH)
        ((confirm *)data)->dispatcher = NULL;
}

void pl_broker_on_acked(void *app, pl_conn *c)
{
    unsigned kind;
    confirm *rec = pl_conn_data(c, &kind);

    if (kind == DATA_CONFIRM)
        confirm_on_acked(((side *)app)->b, rec);
}

void pl_broker_on_response(void *app, unsigned tag, int status)
{
    pl_broker *b = ((side *)app)->b;

    if (tag < PL_ROUTE__COUNT)
        pl_metrics_count_http(&b->metrics, (pl_route)tag, status);
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

const pl_config *pl_broker_config(const pl_broker *b)
{
    return b->cfg;
}

unsigned pl_broker_conn_serves(const pl_conn *c)
{
    return ((const side *)pl_conn_app(c))->serves;
}

void pl_broker_hold(pl_broker *b, pl_waiter *w, int on)
{
    pl_engine_hold(b->engine, w, on);
    if (!on) /* its deadline may be the next, or past: look at once */
        uv_timer_start(&b->timer, timer_cb, 0, 0);
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
    uv_close((uv_handle_t *)&b->confirm_timer, NULL);
    uv_close((uv_handle_t *)&b->sweep, NULL);
    uv_close((uv_handle_t *)&b->sweep_timer, NULL);
    pl_lag_stop(b->lag);
}

void pl_broker_free(pl_broker *b)
{
    if (b == NULL)
        return;
    pl_engine_free(b->engine);
    pl_token_verifier_free(b->verifier);
    pl_lag_free(b->lag);
    pl_free(b);
}

const char *pl_broker_serves_name(unsigned serves)
{
    return serves == PL_SERVE_DISPATCH ? "dispatch"
           : serves == PL_SERVE_CONTROLLERS ? "controllers" : "all";
}
