/* redirect.c -- the key ring on the request path: the 307s, the ring's
 * view, and the polls moved when it changes. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include <openssl/rand.h>

#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/redirect.h"

struct pl_redirect {
    uv_loop_t *loop;
    pl_engine *engine;
    const pl_config *cfg;
    pl_metrics *m;
    pl_cluster cluster;
    char self[PL_RING_NAME_MAX]; /* this instance's name, as last a member */
    pl_cluster_replay replay;    /* signatures taken */
    pl_redirect_heard_fn heard;  /* a peer's check told its view */
    void *heard_arg;
    uv_timer_t sweep; /* moves polls parked here for another's key; set
                       * up with the ring, as the ring's only handle */
    int sweep_ready;  /* ... it has been */
};

/* Writes the 307 for member <name>; <port>, <secret> and <body> as for
 * pl_cluster_location(). Returns whether it did. */
static int write_307(pl_conn *c, const char *name, uint16_t port, unsigned hops,
                     const char *secret, const pl_request *req)
{
    static const char digits[] = "0123456789abcdef";
    char loc[PL_CLUSTER_LOCATION_MAX], nonce[PL_CLUSTER_NONCE_HEX];
    unsigned char raw[PL_CLUSTER_NONCE_HEX / 2];

    if (secret != NULL && secret[0] != '\0') {
        if (RAND_bytes(raw, sizeof(raw)) != 1)
            return 0; /* no randomness: no signature, and no redirect */
        for (size_t i = 0; i < sizeof(raw); i++) {
            nonce[2 * i] = digits[raw[i] >> 4];
            nonce[2 * i + 1] = digits[raw[i] & 15];
        }
    }
    if (pl_cluster_location(loc, name, port, "/warm-start", hops, secret, nonce,
                            req != NULL ? req->body : NULL, req != NULL ? req->body_len : 0,
                            (uint64_t)time(NULL)) < 0)
        return 0; /* cannot be: names are short */
    pl_conn_respond(c, 307, NULL, loc, NULL, 0);
    return 1;
}

void pl_redirect_moved(pl_conn *c, const char *name)
{
    /* A redirect, which a controller follows at once (a closed poll would
     * cost it a back-off). */
    if (!write_307(c, name, 0, 0, NULL, NULL))
        pl_conn_close(c);
}

/* Answers <req> with a 307 to member <to>. Returns whether it did: a
 * request admitted by a signature alone is never signed again, so it is
 * served here rather than sent on. */
static int redirect(pl_redirect *r, pl_conn *c, const pl_request *req, const pl_hop *hop,
                    int to, int dispatch)
{
    const pl_config *cfg = r->cfg;
    uint16_t port = dispatch && cfg->dispatch_listen.host[0] != '\0' ? cfg->dispatch_listen.port
                                                                     : 0;
    unsigned hops = hop->hops;

    if (hop->signed_only)
        return 0;
    if (!write_307(c, r->cluster.ring.m[to].name, port, hops,
                   dispatch ? cfg->dispatch_token : NULL, req))
        return 0;
    r->m->ring_redirects[dispatch != 0]++;
    return 1;
}

/* ---- the polls of keys another member owns ---- */

/* What a change of view judges a parked poll by. */
typedef struct {
    const pl_cluster *cl; /* the view now */
    const pl_ring *before; /* the view before, and this instance in it */
    int self_before;
    int all;              /* the members agree: every other's key moves */
} moving;

/* pl_engine_settle_if's judge: a poll whose key another member owns now is
 * moved there if this instance owned the key before (the change gave it to
 * another, in every view that has the change), or once the views agree;
 * one parked here as another's while they disagree stays, so that no poll
 * is sent back and forth between views that disagree. */
static int judge_owner(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    const moving *mv = arg;

    (void)tag;
    if (pl_cluster_owns(mv->cl, &info->key))
        return 0;
    if (!mv->all && (mv->self_before < 0 || mv->before->n == 0 ||
                     pl_ring_owner(mv->before, pl_ring_key_hash(&info->key)) !=
                         (size_t)mv->self_before))
        return 0;
    *why = mv->cl->ring.m[pl_cluster_owner(mv->cl, &info->key)].name;
    return 1;
}

static void move_polls(pl_redirect *r, const pl_ring *before, int self_before)
{
    moving mv = {&r->cluster, before, self_before, r->cluster.agreed};
    size_t n = pl_engine_settle_if(r->engine, PL_OUTCOME_MOVED, judge_owner, &mv);

    if (n > 0)
        PL_LOG(PL_LOG_INFO, "ring: parked polls sent to their keys' owners", "\"moved\":%zu", n);
}

static void sweep_cb(uv_timer_t *t)
{
    pl_redirect *r = t->data;

    move_polls(r, &r->cluster.ring, r->cluster.self);
}

void pl_redirect_ring_changed(pl_redirect *r, const pl_ring *ring, int self, int agreed,
                              int move)
{
    pl_ring before = r->cluster.ring;
    int self_before = r->cluster.self;

    if (!r->sweep_ready) {
        uv_timer_init(r->loop, &r->sweep);
        r->sweep.data = r;
        r->sweep_ready = 1;
    }
    pl_cluster_set(&r->cluster, ring, self, agreed, uv_now(r->loop));
    if (self >= 0)
        memcpy(r->self, ring->m[self].name, sizeof(r->self));
    r->m->ring_on = 1;
    /* Not a member (left to drain, or not yet among ring_dns's addresses):
     * 0, so a sum or count over instances leaves it out. */
    r->m->ring_members = self >= 0 ? ring->n : 0;
    r->m->ring_agreed = (uint64_t)agreed;
    if (!pl_ring_same(&before, ring) || self != self_before)
        r->m->ring_changes++;
    if (move)
        move_polls(r, &before, self_before);
}

void pl_redirect_off(pl_redirect *r)
{
    if (!r->cluster.on)
        return;
    uv_timer_stop(&r->sweep);
    r->cluster.on = 0;
    r->m->ring_on = 0;
    r->m->ring_members = 0;
}

void pl_redirect_recheck(pl_redirect *r)
{
    if (r->cluster.on)
        uv_timer_start(&r->sweep, sweep_cb, 0, 0);
}

/* ---- what the members say of their views ---- */

size_t pl_redirect_view_header(const pl_redirect *r, char *buf, size_t cap)
{
    struct timespec ts;
    int n;

    if (!r->cluster.on || r->self[0] == '\0')
        return 0;
    clock_gettime(CLOCK_REALTIME, &ts);
    n = snprintf(buf, cap, "X-PL-Ring: %016llx %llu %s\r\n",
                 (unsigned long long)r->cluster.digest,
                 (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000,
                 r->self);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

void pl_redirect_heard(pl_redirect *r, const char *value, size_t len)
{
    pl_ring_view v;

    if (!r->cluster.on || r->heard == NULL || pl_ring_view_read(value, len, 0, &v) != 0)
        return; /* not what a member sends: nothing to act on */
    r->heard(r->heard_arg, v.digest, v.name, strlen(v.name));
}

void pl_redirect_on_heard(pl_redirect *r, pl_redirect_heard_fn fn, void *arg)
{
    r->heard = fn;
    r->heard_arg = arg;
}

/* ---- a request ---- */

int pl_redirect_elsewhere(pl_redirect *r, pl_conn *c, const pl_request *req,
                          const pl_hop *hop, pl_engine_spot *spot, int dispatch)
{
    pl_cluster_verdict v;

    /* No ring; or the key is known to be this instance's in this view:
     * what a key's owner is in a view is kept with the key in the engine
     * (spot->mark) while it has parked polls, so the polls and dispatches
     * of a key served here cost no hash of the ring. */
    if (!r->cluster.on || (spot->mark == r->cluster.view && !hop->marked))
        return 0;
    if (hop->malformed) {
        pl_conn_respond_error(c, 400, "malformed pl_hop, pl_exp, pl_nonce or pl_sig");
        return 1;
    }
    pl_cluster_decide(&r->cluster, spot->key, hop, uv_now(r->loop), &v);
    if (v.to >= 0) {
        if (redirect(r, c, req, hop, v.to, dispatch))
            return 1;
        v.foreign = 1; /* not to be sent on: served here all the same */
    }
    if (!v.foreign)
        spot->mark = r->cluster.view;
    /* A poll served here for another's key stays while the views disagree
     * (until they agree: pl_redirect_ring_changed); when they agree, its
     * sender's view was off, and it is sent on a check period later (one
     * more redirect at most: the owner it goes to counts itself one). */
    r->m->ring_hop_served[dispatch != 0] += (uint64_t)v.foreign;
    if (v.foreign && !dispatch && r->cluster.agreed && !uv_is_active((uv_handle_t *)&r->sweep))
        uv_timer_start(&r->sweep, sweep_cb, r->cfg->ring_check_ms, 0);
    return 0;
}

int pl_redirect_after_miss(pl_redirect *r, pl_conn *c, const pl_request *req,
                           const pl_hop *hop, const pl_key *key)
{
    pl_cluster_verdict v;

    if (!r->cluster.on)
        return 0;
    pl_cluster_decide(&r->cluster, key, hop, uv_now(r->loop), &v);
    return v.after_miss >= 0 && redirect(r, c, req, hop, v.after_miss, 1);
}

/* ---- its life ---- */

pl_redirect *pl_redirect_new(uv_loop_t *loop, pl_engine *engine, const pl_config *cfg,
                             pl_metrics *m)
{
    pl_redirect *r = pl_malloc(sizeof(*r));

    if (r == NULL)
        return NULL;
    memset(r, 0, sizeof(*r));
    r->loop = loop;
    r->engine = engine;
    r->cfg = cfg;
    r->m = m;
    /* Once the views agree, the polls the others moved are on their way
     * for a round trip; a check period is ample. */
    pl_cluster_init(&r->cluster, cfg->ring_check_ms);
    return r;
}

void pl_redirect_stop(pl_redirect *r)
{
    if (r->sweep_ready)
        uv_close((uv_handle_t *)&r->sweep, NULL);
}

int pl_redirect_signed(pl_redirect *r, const pl_request *req, const pl_hop *hop,
                       const char *path)
{
    uint64_t now = (uint64_t)time(NULL);
    int rc;

    if (hop->malformed || !r->cluster.on ||
        !pl_cluster_hop_signed(hop, r->cfg->dispatch_token, r->self, path, req->body,
                               req->body_len, now))
        return 0;
    if ((rc = pl_cluster_replay_take(&r->replay, hop, now)) != 0) {
        PL_LOG(PL_LOG_WARN, rc == -EALREADY ? "ring: a signed redirect used twice: refused"
                                            : "ring: signed redirects: too many at once",
               NULL);
        return 0;
    }
    return 1;
}

void pl_redirect_free(pl_redirect *r)
{
    if (r != NULL)
        pl_cluster_replay_free(&r->replay);
    pl_free(r);
}
