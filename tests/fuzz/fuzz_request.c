/* fuzz_request.c -- libFuzzer target: the request path end to end, bytes
 * in, no sockets.
 *
 * The input is a 12-byte header followed by the bytes a client sends:
 *
 *   [0]  options: bit 0 match order (fifo/lifo); bits 1-2 token mode
 *        (0 disabled, 1 log, 2 enforce, 3 disabled); bit 3 delivery =
 *        confirm; bits 4-5 caps (none, 4 waiters, 2 per key, 3 and 1);
 *        bits 6-7 park timeout (never, 1 s, 30 s, 1 ms)
 *   [1]  owners that refuse a payload (their write fails): bit i % 8
 *   [2]  allocation failures: >= 0xc0 makes allocation number
 *        (b & 0x1f) + 1 fail, and every later one too when b & 0x20
 *   [3]  bits 0-1 h1 limits (header/url/body bytes: 4096/1024/8192,
 *        256/64/128, 1024/256/2048, 16384/4096/65536); bit 2 a new
 *        connection (fresh parser) after an error or a request that does
 *        not keep the connection alive, instead of a dead one; bit 3 the
 *        100-continue write fails
 *   [4..6]  where the data is split into four chunks (fractions of 256)
 *   [7..10] what happens after each chunk: bits 0-2 advance the clock (0,
 *        1, 10, 100, 999, 1000, 30000 ms, 1 h); bit 3 pl_engine_expire;
 *        bit 4 a parked controller disconnects, bits 5-7 choose which
 *   [11] owners whose delivery is never acknowledged (confirm mode)
 *
 * The chunks go, each from an exact-size heap copy, through one pl_h1. Each
 * complete request is routed as src/broker.c routes it: GET /warm-start is
 * pl_poll_key() then pl_engine_park() with an owner from a fixed pool; POST
 * /warm-start is pl_message_parse(), pl_engine_deliver(),
 * pl_message_release() (with delivery = confirm, a pending delivery is
 * confirmed or failed and re-offered at the next chunk boundary, as the
 * broker's confirm timer does); anything else is answered without touching
 * the engine. A shadow model predicts every outcome (who is replaced,
 * rejected, matched in which order, timed out) and the settle callback
 * checks each settle against it; the ledger is compared after every
 * operation. At the end the engine is drained and every owner must have
 * been settled exactly once. Any broken expectation calls abort().
 *
 * Build: meson -Dfuzzing=true (tests/fuzz/meson.build); run: tests/fuzz/run.sh. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pilotlight/engine.h"
#include "pilotlight/h1.h"
#include "pilotlight/key.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/poll.h"
#include "pilotlight/token.h"

#define SECRET "fuzz-secret" /* as fuzz_token.c: its corpus tokens fit */
#define NOW_SECONDS 1750000000.0
#define HEADER 12
#define NCHUNKS 4
#define NOWNERS 256
#define NRECORDS 32

#define CHECK(c)                        \
    do {                                \
        if (!(c))                       \
            check_failed(#c, __LINE__); \
    } while (0)

/* -DFUZZ_TRACE prints what each input does (for checking seeds by hand). */
#ifdef FUZZ_TRACE
#define TRACE(...) fprintf(stderr, __VA_ARGS__)
#else
#define TRACE(...) ((void)0)
#endif

static void check_failed(const char *what, int line)
{
    fprintf(stderr, "fuzz_request.c:%d: check failed: %s\n", line, what);
    abort();
}

enum { O_FREE = 0, O_PARKING, O_PARKED, O_PENDING, O_DONE };
enum { OP_NONE = 0, OP_PARK, OP_DELIVER, OP_EXPIRE, OP_DISCONNECT, OP_DRAIN };

typedef struct {
    int state;
    int settles;   /* settle callbacks received */
    int outcome;   /* final outcome, once O_DONE */
    int refuse;    /* the payload write fails */
    int unacked;   /* confirm mode: the delivery is never acknowledged */
    uint64_t parked_at;
    pl_waiter *w;
    size_t id_len, dep_len, ver_len;
    double cpu, memory;
    char id[PL_POLL_CONTROLLER_ID_MAX];
    char dep[PL_KEY_FIELD_MAX];
    char ver[PL_KEY_FIELD_MAX];
} owner;

/* A delivery waiting for its acknowledgement (the broker's confirm record):
 * its own copy of the payload and key, so it can be offered again. */
typedef struct {
    owner *o;
    pl_message msg;
    char *data;
} record;

static struct {
    /* options */
    int confirm, enforce, faults, reinit, fail_continue;
    uint64_t timeout;
    uint32_t max_waiters, max_per_key;
    pl_order order;
    pl_h1_limits limits;
    /* the system under test */
    pl_engine *engine;
    pl_token_verifier *verifier;
    pl_h1 h1;
    int h1_dead;  /* the connection ended and no new one is opened */
    int phase;    /* 0 between requests, 1 after begin, 2 after headers */
    int continue_failed;
    uint64_t now; /* ms */
    /* the shadow model */
    owner owners[NOWNERS];
    size_t nowners;
    uint64_t parked_total, parked_now, settled[PL_OUTCOME__COUNT];
    int op;
    owner *parking, *target, *taken;
    const pl_message *cur_msg;
    owner *expect[NOWNERS];
    size_t nexpect, expect_pos, callbacks;
    record records[NRECORDS];
    size_t nrecords;
} S;

static const uint64_t clock_steps[8] = {0, 1, 10, 100, 999, 1000, 30000, 3600000};

/* ---- the shadow model ---- */

static int key_is(const owner *o, const pl_key *k)
{
    return o->dep_len == k->deployment_len && memcmp(o->dep, k->deployment, o->dep_len) == 0 &&
           o->ver_len == k->version_len && memcmp(o->ver, k->version, o->ver_len) == 0 &&
           o->cpu == k->cpu && o->memory == k->memory;
}

/* A poll replaces an older one of the same controller id and deployment
 * (another tenant's poll with the same id stays). */
static int same_controller(const owner *a, const owner *b)
{
    return a->id_len == b->id_len && memcmp(a->id, b->id, a->id_len) == 0 &&
           a->dep_len == b->dep_len && memcmp(a->dep, b->dep, a->dep_len) == 0;
}

static int same_key(const owner *a, const owner *b)
{
    pl_key k = {b->dep, b->dep_len, b->ver, b->ver_len, b->cpu, b->memory};
    return key_is(a, &k);
}

static void check_ledger(void)
{
    const pl_ledger *l = pl_engine_ledger(S.engine);
    uint64_t sum = l->parked_now;

    for (int i = 0; i < PL_OUTCOME__COUNT; i++) {
        sum += l->settled[i];
        CHECK(l->settled[i] == S.settled[i]);
    }
    CHECK(sum == l->parked_total);
    CHECK(l->parked_total == S.parked_total);
    CHECK(l->parked_now == S.parked_now);
}

/* <o> left the engine's books with <outcome>. */
static void counted(owner *o, pl_outcome outcome)
{
    if (o->state == O_PARKED || o->state == O_PENDING)
        S.parked_now--;
    S.settled[outcome]++;
    o->state = O_DONE;
    o->outcome = (int)outcome;
}

/* The engine's settle callback: checks the settle against the model. */
static int on_settle(void *p, pl_outcome outcome, const void *arg)
{
    owner *o = p;

    CHECK(o >= S.owners && o < S.owners + S.nowners);
    CHECK((unsigned)outcome < PL_OUTCOME__COUNT);
    CHECK(o->settles == 0);
    o->settles++;
    S.callbacks++;
    TRACE("  settle owner %d: %s\n", (int)(o - S.owners), pl_outcome_name(outcome));
    switch (outcome) {
    case PL_OUTCOME_MATCHED: {
        const pl_message *m = arg;
        CHECK(S.op == OP_DELIVER && m == S.cur_msg && o->state == O_PARKED);
        CHECK(S.expect_pos < S.nexpect && S.expect[S.expect_pos] == o);
        S.expect_pos++;
        CHECK(key_is(o, &m->key)); /* never the wrong controller */
        CHECK(m->payload != NULL && m->payload_len >= 2 && m->payload[0] == '{' &&
              m->payload[m->payload_len - 1] == '}');
        if (o->refuse) {
            counted(o, PL_OUTCOME_DISCONNECT);
            return -EPIPE;
        }
        if (S.confirm) {
            o->state = O_PENDING; /* still counted as parked */
            S.taken = o;
            return PL_SETTLE_PENDING;
        }
        break;
    }
    case PL_OUTCOME_TIMEOUT:
        CHECK(S.op == OP_EXPIRE && o->state == O_PARKED && arg == NULL);
        CHECK(S.timeout > 0 && o->parked_at + S.timeout <= S.now);
        break;
    case PL_OUTCOME_DISCONNECT:
        CHECK(S.op == OP_DISCONNECT && o == S.target && o->state == O_PARKED && arg == NULL);
        break;
    case PL_OUTCOME_REPLACED:
        CHECK(S.op == OP_PARK && o != S.parking && o->state == O_PARKED && arg == NULL);
        CHECK(same_controller(o, S.parking));
        break;
    case PL_OUTCOME_SHUTDOWN:
        CHECK(S.op == OP_DRAIN && o->state == O_PARKED && arg == NULL);
        break;
    case PL_OUTCOME_REJECTED:
        CHECK(S.op == OP_PARK && o == S.parking && o->state == O_PARKING && arg != NULL);
        break;
    case PL_OUTCOME_HANDED_OVER: /* only a binary upgrade hands over */
    case PL_OUTCOME_REVOKED:     /* only a reload revokes */
    case PL_OUTCOME_MOVED:       /* only a ring moves polls */
    case PL_OUTCOME_ABORTED:     /* never a callback: pl_engine_confirm's alone */
    case PL_OUTCOME__COUNT:
        CHECK(0);
    }
    counted(o, outcome);
    return 0;
}

/* Offers <m> through the engine, predicting who is tried and who takes it. */
static int deliver(const pl_message *m)
{
    uint64_t waited = UINT64_MAX;
    size_t first = SIZE_MAX;
    int rc;

    S.nexpect = 0;
    for (size_t n = 0; n < S.nowners; n++) {
        owner *o = &S.owners[S.order == PL_ORDER_FIFO ? n : S.nowners - 1 - n];
        if (o->state == O_PARKED && key_is(o, &m->key)) {
            if (first == SIZE_MAX && !o->refuse)
                first = S.nexpect;
            S.expect[S.nexpect++] = o;
        }
    }
    S.expect_pos = 0;
    S.cur_msg = m;
    S.taken = NULL;
    S.op = OP_DELIVER;
    {
        pl_delivery d = {.payload = m};
        pl_engine_spot spot;
        pl_engine_find(S.engine, &m->key, &spot);
        rc = pl_engine_deliver(S.engine, &spot, S.now, &d);
        if (rc == PL_DELIVERED || rc == PL_DELIVERY_PENDING) {
            waited = d.waited_ms;
            CHECK(d.owner == S.taken || !S.confirm);
            CHECK(rc != PL_DELIVERY_PENDING || d.waiter == S.taken->w);
        }
    }
    S.op = OP_NONE;
    TRACE("  deliver: %d (%zu waiters of the key)\n", rc, S.nexpect);
    if (first == SIZE_MAX) {
        CHECK(rc == 0 && S.expect_pos == S.nexpect);
    } else {
        CHECK(rc == (S.confirm ? PL_DELIVERY_PENDING : PL_DELIVERED));
        CHECK(S.expect_pos == first + 1);
        CHECK(waited == S.now - S.expect[first]->parked_at);
        CHECK(!S.confirm || S.taken == S.expect[first]);
    }
    check_ledger();
    return rc;
}

/* ---- delivery = confirm ---- */

static void record_start(const pl_message *m)
{
    size_t dl = m->key.deployment_len, vl = m->key.version_len;
    record *r;
    char *data;

    if (S.nrecords == NRECORDS || (data = pl_malloc(m->payload_len + dl + vl)) == NULL) {
        /* cannot watch it: counted as written, as the broker does */
        pl_engine_confirm(S.engine, S.taken->w, PL_OUTCOME_MATCHED);
        counted(S.taken, PL_OUTCOME_MATCHED);
        check_ledger();
        return;
    }
    r = &S.records[S.nrecords++];
    memcpy(data, m->payload, m->payload_len);
    memcpy(data + m->payload_len, m->key.deployment, dl);
    memcpy(data + m->payload_len + dl, m->key.version, vl);
    r->o = S.taken;
    r->data = data;
    r->msg = *m;
    r->msg.payload = data;
    r->msg.key.deployment = data + m->payload_len;
    r->msg.key.version = data + m->payload_len + dl;
    r->msg.owned = NULL;
}

/* Checks record <i>: acknowledged means delivered; otherwise the controller
 * is dropped and the payload offered to the key's next waiter. Returns 1
 * when the record is finished (and removed). */
static int record_check(size_t i)
{
    record *r = &S.records[i];
    owner *o = r->o;

    CHECK(o->state == O_PENDING);
    if (!o->unacked) {
        pl_engine_confirm(S.engine, o->w, PL_OUTCOME_MATCHED);
        counted(o, PL_OUTCOME_MATCHED);
    } else {
        pl_engine_confirm(S.engine, o->w, PL_OUTCOME_ABORTED);
        counted(o, PL_OUTCOME_ABORTED);
        check_ledger();
        if (deliver(&r->msg) == PL_DELIVERY_PENDING) {
            r->o = S.taken;
            return 0;
        }
    }
    check_ledger();
    pl_free(r->data);
    S.records[i] = S.records[--S.nrecords];
    return 1;
}

/* One tick of the broker's confirm timer: every record is looked at once. */
static void records_tick(void)
{
    size_t n = S.nrecords, i = 0;

    while (n-- > 0) {
        if (!record_check(i))
            i++;
    }
}

/* ---- the routes ---- */

static owner *owner_new(void)
{
    owner *o;

    if (S.nowners == NOWNERS)
        return NULL;
    o = &S.owners[S.nowners];
    memset(o, 0, offsetof(owner, id));
    return o;
}

static void handle_park(const pl_request *req, uint8_t refuse_mask, uint8_t unacked_mask)
{
    pl_token_claims claims;
    char msg[96];
    const char *err = "unset";
    pl_waiter *w = NULL;
    pl_engine_spot spot;
    owner *o, *old = NULL;
    uint64_t parked = S.parked_now;
    uint32_t on_key = 0;
    pl_key key;
    int rc, token = -7, over;

    rc = pl_poll_key(req, S.verifier, S.enforce, NOW_SECONDS + (double)S.now / 1e3, &key,
                     &claims, &token, &err, msg, sizeof(msg));
    CHECK(token >= 0 && token <= PL_TOKEN_UNCHECKED &&
          (S.verifier != NULL || token == PL_TOKEN_UNCHECKED));
    TRACE("  poll key: %d token %d %s\n", rc, token, rc ? err : "");
    if (rc != 0) {
        CHECK(rc == -EINVAL || (rc == -EACCES && S.enforce && S.verifier != NULL));
        CHECK(err != NULL && err[0] != '\0');
        return; /* answered with an error */
    }
    CHECK(err == NULL);
    CHECK(key.deployment_len > 0 && key.deployment_len <= PL_KEY_FIELD_MAX);
    CHECK(key.version_len > 0 && key.version_len <= PL_KEY_FIELD_MAX);
    CHECK(isfinite(key.cpu) && isfinite(key.memory));
    CHECK(req->header_len[PL_HDR_CONTROLLER_ID] > 0 &&
          req->header_len[PL_HDR_CONTROLLER_ID] <= PL_POLL_CONTROLLER_ID_MAX);
    if (S.verifier != NULL && S.enforce)
        CHECK(token == PL_TOKEN_VALID);
    if (token == PL_TOKEN_VALID)
        CHECK(key.deployment == claims.deployment);

    o = owner_new();
    if (o == NULL)
        return; /* the pool is used up: this poll just is not parked */
    o->refuse = (refuse_mask >> (S.nowners & 7)) & 1;
    o->unacked = (unacked_mask >> (S.nowners & 7)) & 1;
    o->id_len = req->header_len[PL_HDR_CONTROLLER_ID];
    memcpy(o->id, req->header[PL_HDR_CONTROLLER_ID], o->id_len);
    o->dep_len = key.deployment_len;
    memcpy(o->dep, key.deployment, o->dep_len);
    o->ver_len = key.version_len;
    memcpy(o->ver, key.version, o->ver_len);
    o->cpu = key.cpu;
    o->memory = key.memory;
    o->parked_at = S.now;
    o->state = O_PARKING;
    S.nowners++;

    /* The model's answer: the same controller's older poll is replaced;
     * over a cap (not counting that one) the new poll is rejected. */
    for (size_t i = 0; i + 1 < S.nowners; i++) {
        owner *q = &S.owners[i];
        if (q->state != O_PARKED)
            continue;
        if (same_controller(q, o)) {
            CHECK(old == NULL);
            old = q;
        }
        if (same_key(q, o))
            on_key++;
    }
    if (old != NULL) {
        parked--;
        if (same_key(old, o))
            on_key--;
    }
    over = (S.max_waiters && parked >= S.max_waiters) ||
           (S.max_per_key && on_key >= S.max_per_key);

    S.op = OP_PARK;
    S.parking = o;
    S.callbacks = 0;
    pl_engine_find(S.engine, &key, &spot);
    rc = pl_engine_park(S.engine, &spot, req->header[PL_HDR_CONTROLLER_ID],
                        req->header_len[PL_HDR_CONTROLLER_ID], o, S.now, &w);
    S.op = OP_NONE;
    TRACE("  park owner %zu: %d\n", S.nowners - 1, rc);
    if (rc == PL_ENOMEM) {
        CHECK(S.faults);
        CHECK(S.callbacks == 0 && w == NULL && o->state == O_PARKING);
        CHECK(old == NULL || old->state == O_PARKED);
        S.nowners--; /* the slot is free again */
        check_ledger();
        return;
    }
    CHECK(rc != PL_EINVAL); /* pl_poll_key() only gives encodable keys */
    S.parked_total++;
    if (old != NULL)
        CHECK(old->state == O_DONE && old->outcome == PL_OUTCOME_REPLACED);
    if (over) {
        CHECK(rc == PL_EREJECTED && w == NULL);
        CHECK(o->state == O_DONE && o->outcome == PL_OUTCOME_REJECTED);
        CHECK(S.callbacks == (old != NULL) + 1u);
    } else {
        CHECK(rc == 0 && w != NULL && o->state == O_PARKING);
        CHECK(S.callbacks == (old != NULL));
        o->state = O_PARKED;
        o->w = w;
        S.parked_now++;
    }
    check_ledger();
    if (rc == 0)
        pl_h1_release(&S.h1); /* a parked poll keeps no request bytes */
}

static void handle_dispatch(const pl_request *req)
{
    const char *err = NULL;
    pl_message m;
    int rc;

    rc = pl_message_parse(req->body, req->body_len, &m, &err);
    TRACE("  message: %d %s\n", rc, rc ? err : "");
    if (rc == PL_MESSAGE_EINVAL) {
        CHECK(err != NULL && err[0] != '\0');
        return;
    }
    if (rc == PL_MESSAGE_ENOMEM) {
        CHECK(S.faults);
        return;
    }
    CHECK(rc == 0);
    /* the payload is always the body's own bytes */
    CHECK(m.payload >= req->body && m.payload + m.payload_len <= req->body + req->body_len);
    if (deliver(&m) == PL_DELIVERY_PENDING)
        record_start(&m);
    pl_message_release(&m);
}

static int path_is(const pl_request *req, const char *path)
{
    size_t len = strlen(path);
    return req->path_len == len && memcmp(req->path, path, len) == 0;
}

static int inside(const char *p, size_t len, const pl_h1 *h)
{
    return len == 0 || (p >= h->arena.data && p + len <= h->arena.data + h->arena.len);
}

/* pl_broker_on_request's routing, for the two routes that reach the engine. */
static void route(const uint8_t *opt)
{
    pl_request req;
    int method;

    pl_h1_request(&S.h1, &req);
    CHECK(req.path_len <= S.limits.max_url_bytes && inside(req.path, req.path_len, &S.h1));
    CHECK(req.body_len <= S.limits.max_body_bytes && inside(req.body, req.body_len, &S.h1));
    for (int i = 0; i < PL_HDR__COUNT; i++) {
        if (req.header[i] == NULL)
            CHECK(req.header_len[i] == 0);
        else
            CHECK(inside(req.header[i], req.header_len[i], &S.h1));
    }
    method = req.method == HTTP_HEAD ? HTTP_GET : req.method;
    TRACE("request %s %.*s\n", llhttp_method_name((llhttp_method_t)req.method), (int)req.path_len,
          req.path);
    if (!path_is(&req, "/warm-start"))
        return; /* connect, healthz, readyz, metrics, debug, 404: no engine */
    if (method == HTTP_GET && req.method != HTTP_HEAD)
        handle_park(&req, opt[1], opt[11]);
    else if (method == HTTP_POST)
        handle_dispatch(&req);
    /* else 405 */
}

/* ---- the parser ---- */

static void on_begin(void *p)
{
    CHECK(p == &S && S.phase == 0);
    S.phase = 1;
}

static int on_headers(void *p, int send_continue)
{
    CHECK(p == &S && S.phase == 1);
    S.phase = 2;
    if (send_continue && S.fail_continue) {
        S.continue_failed = 1;
        return -EPIPE; /* writing "100 Continue" failed */
    }
    return 0;
}

static const pl_h1_events events = {on_begin, on_headers};

static void new_connection(void)
{
    pl_h1_release(&S.h1);
    pl_h1_init(&S.h1, &S.limits, &events, &S);
    S.phase = 0;
    S.continue_failed = 0;
}

/* The connection is over: a new one if the options say so. */
static void connection_end(void)
{
    if (S.reinit)
        new_connection();
    else
        S.h1_dead = 1;
}

static void feed(const char *buf, size_t len, const uint8_t *opt)
{
    size_t off = 0;
    int stalls = 0;

    while (off < len && !S.h1_dead) {
        size_t used = SIZE_MAX, left = len - off;
        pl_h1_result r = pl_h1_execute(&S.h1, buf + off, left, &used);

        CHECK(used <= left);
        off += used;
        if (r == PL_H1_AGAIN) {
            CHECK(used == left);
        } else if (r == PL_H1_REQUEST) {
            CHECK(S.phase == 2 && !S.h1.in_msg);
            S.phase = 0;
            stalls = used == 0 ? stalls + 1 : 0;
            CHECK(stalls < 3); /* a request per call, never a spin */
            route(opt);
            if (!S.h1.keep_alive && S.reinit) {
                new_connection(); /* what followed was never read */
                return;
            }
        } else {
            int st = S.h1.err_status;
            CHECK(r == PL_H1_ERROR && used == left);
            CHECK(st == 0 || st == 400 || st == 413 || st == 414 || st == 417 || st == 431 ||
                  st == 501 || (st == 503 && S.faults));
            CHECK(st == 0 ? S.continue_failed : S.h1.err_msg != NULL);
            TRACE("error %d %s\n", st, st ? S.h1.err_msg : "(close)");
            connection_end();
            return;
        }
    }
}

/* ---- the input ---- */

/* Checks what the engine reports about keys against the model. */
static size_t key_fn_calls, key_fn_parked;

static void key_fn(const pl_key_info *info, void *arg)
{
    size_t n = 0;
    uint64_t oldest = UINT64_MAX;

    (void)arg;
    key_fn_calls++;
    key_fn_parked += info->parked;
    for (size_t i = 0; i < S.nowners; i++) {
        owner *o = &S.owners[i];
        if (o->state == O_PARKED && key_is(o, &info->key)) {
            n++;
            if (o->parked_at < oldest)
                oldest = o->parked_at;
        }
    }
    CHECK(n == info->parked && n > 0 && oldest == info->oldest_parked_at);
    CHECK(pl_engine_waiting(S.engine, &info->key) == n);
}

static void check_keys(void)
{
    size_t keys = 0, parked = 0, total;
    uint64_t oldest = UINT64_MAX, deadline = 0;

    for (size_t i = 0; i < S.nowners; i++) {
        owner *o = &S.owners[i];
        int first = 1;
        if (o->state != O_PARKED)
            continue;
        parked++;
        if (o->parked_at < oldest)
            oldest = o->parked_at;
        for (size_t j = 0; j < i && first; j++)
            if (S.owners[j].state == O_PARKED && same_key(&S.owners[j], o))
                first = 0;
        keys += first;
    }
    key_fn_calls = key_fn_parked = 0;
    total = pl_engine_each_key(S.engine, SIZE_MAX, key_fn, NULL);
    CHECK(total == keys && key_fn_calls == keys && key_fn_parked == parked);
    CHECK(pl_engine_key_count(S.engine) == keys);
    if (S.timeout == 0 || parked == 0) {
        CHECK(pl_engine_next_deadline(S.engine, &deadline) == -ENOENT);
    } else {
        CHECK(pl_engine_next_deadline(S.engine, &deadline) == 0);
        CHECK(deadline == oldest + S.timeout);
    }
}

static void act(uint8_t a)
{
    TRACE("-- chunk end: +%llu ms%s%s\n", (unsigned long long)clock_steps[a & 7],
          a & 8 ? ", expire" : "", a & 16 ? ", disconnect" : "");
    S.now += clock_steps[a & 7];
    if (a & 8) {
        size_t before = S.callbacks, n;
        S.op = OP_EXPIRE;
        n = pl_engine_expire(S.engine, S.now);
        S.op = OP_NONE;
        CHECK(n == S.callbacks - before);
        for (size_t i = 0; i < S.nowners; i++)
            CHECK(S.timeout == 0 || S.owners[i].state != O_PARKED ||
                  S.owners[i].parked_at + S.timeout > S.now);
        check_ledger();
    }
    if (a & 16) {
        size_t parked = 0, k;
        for (size_t i = 0; i < S.nowners; i++)
            parked += S.owners[i].state == O_PARKED;
        k = parked ? (size_t)(a >> 5) % parked : 0;
        for (size_t i = 0; i < S.nowners && parked; i++) {
            owner *o = &S.owners[i];
            if (o->state != O_PARKED || k-- > 0)
                continue;
            S.op = OP_DISCONNECT;
            S.target = o;
            pl_engine_settle(S.engine, o->w, PL_OUTCOME_DISCONNECT);
            S.op = OP_NONE;
            CHECK(o->state == O_DONE && o->outcome == PL_OUTCOME_DISCONNECT);
            check_ledger();
            break;
        }
    }
    records_tick();
    check_keys();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    pl_log_threshold = PL_LOG_ERROR;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const pl_h1_limits limits[4] = {
        {4096, 1024, 8192}, {256, 64, 128}, {1024, 256, 2048}, {16384, 4096, 65536},
    };
    static const uint32_t caps[4][2] = {{0, 0}, {4, 0}, {0, 2}, {3, 1}};
    static const uint64_t timeouts[4] = {0, 1000, 30000, 1};
    const uint8_t *opt = data;
    size_t len, cut[NCHUNKS + 1];
    pl_engine_opts eo;
    int mode;

    if (size < HEADER)
        return 0;
    data += HEADER;
    len = size - HEADER;

    S.nowners = 0;
    S.parked_total = S.parked_now = 0;
    memset(S.settled, 0, sizeof(S.settled));
    S.op = OP_NONE;
    S.callbacks = 0;
    S.nrecords = 0;
    S.now = 0;
    S.h1_dead = 0;
    S.order = opt[0] & 1 ? PL_ORDER_LIFO : PL_ORDER_FIFO;
    mode = (opt[0] >> 1) & 3;
    S.enforce = mode == 2;
    S.confirm = (opt[0] >> 3) & 1;
    S.max_waiters = caps[(opt[0] >> 4) & 3][0];
    S.max_per_key = caps[(opt[0] >> 4) & 3][1];
    S.timeout = timeouts[opt[0] >> 6];
    S.faults = opt[2] >= 0xc0;
    S.limits = limits[opt[3] & 3];
    S.reinit = (opt[3] >> 2) & 1;
    S.fail_continue = (opt[3] >> 3) & 1;

    eo = (pl_engine_opts){S.order, S.max_waiters, S.max_per_key, S.timeout, on_settle};
    S.engine = pl_engine_new(&eo);
    CHECK(S.engine != NULL);
    S.verifier = NULL;
    if (mode == 1 || mode == 2) {
        S.verifier = pl_token_verifier_new((const unsigned char *)SECRET, strlen(SECRET));
        CHECK(S.verifier != NULL);
    }
    pl_h1_init(&S.h1, &S.limits, &events, &S);
    S.phase = 0;
    S.continue_failed = 0;

    /* four chunks, cut where opt[4..6] say */
    cut[0] = 0;
    cut[NCHUNKS] = len;
    for (int i = 1; i < NCHUNKS; i++)
        cut[i] = len * opt[3 + i] / 256;
    for (int i = 1; i < NCHUNKS; i++) /* sort the three cuts */
        for (int j = i + 1; j < NCHUNKS; j++)
            if (cut[j] < cut[i]) {
                size_t t = cut[i];
                cut[i] = cut[j];
                cut[j] = t;
            }

    if (S.faults)
        pl_mem_fail_after((opt[2] & 0x1f) + 1ul, opt[2] & 0x20);
    for (int i = 0; i < NCHUNKS; i++) {
        size_t n = cut[i + 1] - cut[i];
        char *chunk = malloc(n ? n : 1); /* exact size: over-reads are caught */
        CHECK(chunk != NULL);
        memcpy(chunk, data + cut[i], n);
        feed(chunk, n, opt);
        free(chunk);
        act(opt[7 + i]);
    }
    pl_mem_fail_after(0, 0);

    /* The end: pending deliveries are settled, then the engine drained. */
    for (int guard = 0; S.nrecords > 0; guard++) {
        CHECK(guard <= NOWNERS);
        records_tick();
    }
    S.op = OP_DRAIN;
    pl_engine_drain(S.engine);
    S.op = OP_NONE;
    check_ledger();
    CHECK(S.parked_now == 0 && pl_engine_key_count(S.engine) == 0);
    for (size_t i = 0; i < S.nowners; i++)
        CHECK(S.owners[i].state == O_DONE && S.owners[i].settles == 1);
    check_keys();
    pl_engine_free(S.engine);
    pl_token_verifier_free(S.verifier);
    pl_h1_release(&S.h1);
    S.engine = NULL;
    S.verifier = NULL;
    return 0;
}
