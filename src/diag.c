/* diag.c -- what dispatches came to lately, and why each miss missed. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/diag.h"
#include "pilotlight/hash.h"
#include "pilotlight/invariant.h"
#include "pilotlight/json.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"
#include "pilotlight/token.h"

#define MINUTE_MS 60000
#define NONE 0xff
#define BUCKETS 128 /* twice the keys: chains of one, mostly */
/* Keys of one deployment looked at for a miss's nearest: its versions
 * times its machine sizes. */
#define NEAR_MAX 256

/* Counts by minute: bucket m % PL_DIAG_MINUTES holds minute m, for the
 * PL_DIAG_MINUTES minutes up to <minute>, the newest counted in. <until>
 * and <slot> say where that minute ends and its bucket, so that a count
 * within it takes no division. */
typedef struct {
    uint64_t minute;
    uint64_t until; /* (minute + 1) * MINUTE_MS; 0: nothing counted yet */
    uint32_t slot;  /* minute % PL_DIAG_MINUTES */
    uint32_t hits[PL_DIAG_MINUTES], misses[PL_DIAG_MINUTES];
} window;

/* A key dispatched to. */
typedef struct {
    unsigned char *enc; /* its encoding (pool, <cap> bytes), kept for the
                         * slot's next key; NULL before its first */
    uint32_t hash;
    uint16_t len, cap;
    uint8_t next; /* in its bucket's chain */
    uint8_t pins; /* events kept that name it: it stays while any do */
    uint8_t used; /* dispatched to since the clock hand last passed */
    uint32_t gen; /* times the slot was taken: a tag names this use of it */
    window w;
} rec;

/* A dispatch kept: its key is a rec, pinned. */
typedef struct {
    uint64_t at, took_ns, waited_ms;
    uint8_t rec; /* NONE: an empty slot */
    uint8_t result;
} event;

/* A key kept apart from the recs (pool bytes). */
typedef struct {
    unsigned char *enc;
    uint16_t len;
} kept_key;

/* A false answer kept, with what was parked nearest its key then. */
typedef struct {
    event ev;
    uint8_t run_len, run_cut;
    char run[PL_DIAG_RUN_MAX];
    uint8_t nearest;
    uint8_t has_refusal;
    kept_key near, refused;
    uint32_t ref_count;
    int ref_token, ref_enforced;
    uint64_t ref_at;
    uint64_t near_parked, near_version_parked, version_parked, deployment_parked,
        deployment_keys, parked;
} miss_event;

/* A poll refused its token. */
typedef struct {
    kept_key key; /* enc NULL: a free slot */
    int token, enforced;
    uint64_t at;
    uint32_t count;
} refusal;

struct pl_diag {
    const pl_engine *engine;
    rec recs[PL_DIAG_KEYS];
    uint8_t buckets[BUCKETS];
    uint8_t nrecs; /* recs ever used: they are reused, never freed */
    uint8_t hand;  /* the clock hand: the next rec looked at for room */
    window gone;   /* the counts of keys let go: all = gone + every rec's */
    event hits[PL_DIAG_LAST];
    miss_event misses[PL_DIAG_LAST];
    uint64_t nhits, nmisses; /* events ever kept: the next slot is n % LAST */
    refusal refusals[PL_DIAG_TOKENS];
};

static const char *const nearest_names[PL_NEAREST__COUNT] = {
    "key", "token", "machine", "version", "deployment", "none",
};

const char *pl_nearest_name(pl_nearest n)
{
    return (unsigned)n < PL_NEAREST__COUNT ? nearest_names[n] : "unknown";
}

/* ---- keys kept apart ---- */

static int keep(kept_key *k, const unsigned char *enc, size_t len)
{
    k->enc = pl_pool_alloc(len, NULL);
    if (k->enc == NULL)
        return -ENOMEM;
    memcpy(k->enc, enc, len);
    k->len = (uint16_t)len;
    return 0;
}

static void unkeep(kept_key *k)
{
    if (k->enc != NULL)
        pl_pool_free(k->enc, k->len);
    k->enc = NULL;
    k->len = 0;
}

/* ---- windows ---- */

/* Moves <w> on to <minute>: the buckets of the minutes between start empty. */
static void window_roll(window *w, uint64_t minute)
{
    uint64_t gap = minute - w->minute;

    for (uint64_t i = 1; i <= gap && i <= PL_DIAG_MINUTES; i++) {
        w->hits[(w->minute + i) % PL_DIAG_MINUTES] = 0;
        w->misses[(w->minute + i) % PL_DIAG_MINUTES] = 0;
    }
    w->minute = minute;
    w->until = (minute + 1) * MINUTE_MS;
    w->slot = (uint32_t)(minute % PL_DIAG_MINUTES);
}

/* <w> empty, its newest minute <minute>. */
static void window_start(window *w, uint64_t minute)
{
    memset(w, 0, sizeof(*w));
    w->minute = minute;
    w->until = (minute + 1) * MINUTE_MS;
    w->slot = (uint32_t)(minute % PL_DIAG_MINUTES);
}

/* Counts a dispatch at <now> (loop ms, which never go back) in <w>. */
static inline void window_count(window *w, uint64_t now, int hit)
{
    if (now >= w->until)
        window_roll(w, now / MINUTE_MS);
    if (hit)
        w->hits[w->slot]++;
    else
        w->misses[w->slot]++;
}

/* Adds <from>'s counts to <into>'s. */
static void window_merge(window *into, const window *from)
{
    if (from->minute > into->minute)
        window_roll(into, from->minute);
    if (from->minute == into->minute) { /* mostly: bucket by bucket */
        for (unsigned i = 0; i < PL_DIAG_MINUTES; i++) {
            into->hits[i] += from->hits[i];
            into->misses[i] += from->misses[i];
        }
        return;
    }
    for (uint64_t i = 0; i < PL_DIAG_MINUTES && i <= from->minute; i++) {
        uint64_t m = from->minute - i;

        if (into->minute - m >= PL_DIAG_MINUTES)
            break; /* out of <into>'s window, and so are the older ones */
        into->hits[m % PL_DIAG_MINUTES] += from->hits[m % PL_DIAG_MINUTES];
        into->misses[m % PL_DIAG_MINUTES] += from->misses[m % PL_DIAG_MINUTES];
    }
}

/* <w> as seen at <now>, the oldest minute first. */
static void window_read(const window *w, uint64_t now, pl_diag_window *out)
{
    uint64_t last = now / MINUTE_MS;

    memset(out, 0, sizeof(*out));
    for (unsigned i = 0; i < PL_DIAG_MINUTES; i++) {
        uint64_t m = last - (PL_DIAG_MINUTES - 1) + i;

        if (last + 1 < PL_DIAG_MINUTES - i || m > w->minute ||
            m + PL_DIAG_MINUTES <= w->minute)
            continue; /* before the clock's start, or not counted */
        out->hits[i] = w->hits[m % PL_DIAG_MINUTES];
        out->misses[i] = w->misses[m % PL_DIAG_MINUTES];
        out->total_hits += out->hits[i];
        out->total_misses += out->misses[i];
    }
}

/* ---- the keys dispatched to ---- */

pl_diag *pl_diag_new(const pl_engine *engine)
{
    pl_diag *d = pl_malloc(sizeof(*d));

    if (d == NULL)
        return NULL;
    memset(d, 0, sizeof(*d));
    d->engine = engine;
    memset(d->buckets, NONE, sizeof(d->buckets));
    for (unsigned i = 0; i < PL_DIAG_LAST; i++)
        d->hits[i].rec = d->misses[i].ev.rec = NONE;
    return d;
}

void pl_diag_free(pl_diag *d)
{
    if (d == NULL)
        return;
    for (unsigned i = 0; i < d->nrecs; i++)
        pl_pool_free(d->recs[i].enc, d->recs[i].cap);
    for (unsigned i = 0; i < PL_DIAG_LAST; i++) {
        unkeep(&d->misses[i].near);
        unkeep(&d->misses[i].refused);
    }
    for (unsigned i = 0; i < PL_DIAG_TOKENS; i++)
        unkeep(&d->refusals[i].key);
    pl_free(d);
}

/* The index of the rec of the key encoded <enc>, or NONE. */
static unsigned find_rec(const pl_diag *d, const unsigned char *enc, size_t len, uint32_t hash)
{
    unsigned i = d->buckets[hash % BUCKETS];

    while (i != NONE && (d->recs[i].hash != hash || d->recs[i].len != len ||
                         memcmp(d->recs[i].enc, enc, len) != 0))
        i = d->recs[i].next;
    return i;
}

/* The encoding of <x>'s key: its spot's, or written into <buf>. Returns its
 * length. */
static size_t encoding(const pl_diag_dispatch *x, unsigned char *buf,
                       const unsigned char **enc)
{
    if (x->spot != NULL) {
        *enc = x->spot->buf;
        return x->spot->len;
    }
    *enc = buf;
    return pl_key_encode(x->key, buf);
}

/* The slot for a key not kept yet: a fresh one, else the first the clock
 * hand finds that no kept event names and that was not dispatched to
 * since the hand last passed (a second chance, as an operating system's
 * page clock gives): the keys dispatched to lately stay, at one store per
 * dispatch. Events pin at most 2 * PL_DIAG_LAST keys: two turns find one. */
static unsigned victim(pl_diag *d)
{
    if (d->nrecs < PL_DIAG_KEYS)
        return d->nrecs;
    for (unsigned steps = 0;; steps++) {
        rec *r = &d->recs[d->hand];
        unsigned i = d->hand;

        PL_ASSERT(steps < 2 * PL_DIAG_KEYS);
        d->hand = (uint8_t)((d->hand + 1) % PL_DIAG_KEYS);
        if (r->pins == 0 && !r->used)
            return i;
        r->used = 0;
    }
}

/* The index of the rec of a key not kept yet, first dispatched to in
 * <minute>, in a fresh slot or in the victim's (its counts go to d->gone).
 * NONE when out of memory. */
static unsigned add_rec(pl_diag *d, const unsigned char *enc, size_t len, uint32_t hash,
                        uint64_t minute)
{
    unsigned i = victim(d);
    rec *r = &d->recs[i];
    unsigned char *copy = r->enc;
    size_t cap = r->cap;
    uint32_t gen = r->gen + 1;
    uint8_t *link;

    if (copy == NULL || cap < len) { /* else the last key's bytes make room */
        if ((copy = pl_pool_alloc(len, &cap)) == NULL)
            return NONE;
        if (r->enc != NULL)
            pl_pool_free(r->enc, r->cap);
    }
    if (i == d->nrecs) {
        d->nrecs++;
    } else {
        for (link = &d->buckets[r->hash % BUCKETS]; *link != i; link = &d->recs[*link].next)
            ;
        *link = r->next;
        window_merge(&d->gone, &r->w);
    }
    memset(r, 0, sizeof(*r));
    window_start(&r->w, minute);
    r->gen = gen & 0xffffff ? gen : 1; /* 24 bits in a tag, never 0 */
    r->enc = copy;
    r->cap = (uint16_t)cap;
    memcpy(r->enc, enc, len);
    r->len = (uint16_t)len;
    r->hash = hash;
    r->next = d->buckets[hash % BUCKETS];
    d->buckets[hash % BUCKETS] = (uint8_t)i;
    return i;
}

/* ---- recording ---- */

/* The run's id (run.friendlyId) in the payload of a false answer, as
 * kept: its text, cut at a character's end. Read here, on the miss path
 * alone: a hit's costs no instruction. One that is not text (a NUL, a lone
 * surrogate once decoded) is kept empty. */
static void keep_run(miss_event *m, const char *payload, size_t len)
{
    static const pl_json_path paths[2] = {{PL_JSON_ROOT, 3, "run"}, {1, 10, "friendlyId"}};
    pl_json_value found[2];
    pl_json_doc doc;
    char buf[4 * PL_DIAG_RUN_MAX];
    const char *s;
    long n;

    m->run_len = m->run_cut = 0;
    if (payload == NULL || pl_json_read(payload, len, 0, paths, 2, found, &doc) == PL_JSON_ENOMEM ||
        found[1].type != PL_JSON_STRING)
        return;
    s = found[1].p;
    n = (long)found[1].len;
    if (found[1].escaped) {
        n = pl_json_string(&found[1], buf, sizeof(buf));
        if (n < 0 || !pl_json_is_text(buf, (size_t)n)) {
            m->run_cut = n < 0; /* too long to read here */
            return;
        }
        s = buf;
    }
    m->run_cut = n > PL_DIAG_RUN_MAX;
    if (m->run_cut) {
        n = PL_DIAG_RUN_MAX;
        while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
            n--; /* s[n] continues a character: cut before it */
    }
    memcpy(m->run, s, (size_t)n);
    m->run_len = (uint8_t)n;
}

/* Fills the common part of <ev> and pins <r> in it, unpinning the key of
 * the event it replaces. */
static void keep_event(pl_diag *d, event *ev, unsigned r, const pl_diag_dispatch *x)
{
    if (ev->rec != NONE)
        d->recs[ev->rec].pins--;
    ev->rec = (uint8_t)r;
    d->recs[r].pins++;
    ev->at = x->now;
    ev->took_ns = x->took_ns;
    ev->waited_ms = x->waited_ms;
    ev->result = (uint8_t)x->result;
}

static int same_deployment(const pl_key *a, const pl_key *b)
{
    return a->deployment_len == b->deployment_len &&
           memcmp(a->deployment, b->deployment, a->deployment_len) == 0;
}

/* The refusal that explains a miss of <key> (encoded <enc>, <len> bytes)
 * at <now>: the key's own, else the latest for its deployment, within the
 * window. Sets *exact when it is the key's own. NULL when none. */
static const refusal *refusal_for(const pl_diag *d, const pl_key *key, const unsigned char *enc,
                                  size_t len, uint64_t now, int *exact)
{
    const refusal *best = NULL;

    *exact = 0;
    for (unsigned i = 0; i < PL_DIAG_TOKENS; i++) {
        const refusal *f = &d->refusals[i];
        pl_key k;

        if (f->key.enc == NULL || f->at + PL_DIAG_MINUTES * MINUTE_MS < now)
            continue;
        if (f->key.len == len && memcmp(f->key.enc, enc, len) == 0) {
            *exact = 1;
            return f;
        }
        pl_key_decode(f->key.enc, f->key.len, &k);
        if (same_deployment(&k, key) && (best == NULL || f->at > best->at))
            best = f;
    }
    return best;
}

/* What was parked nearest the key of the miss <m> (its dispatch <x>),
 * kept in <m>; the first of pl_nearest's order that holds. */
static pl_nearest classify(pl_diag *d, const pl_diag_dispatch *x, miss_event *m)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    const unsigned char *enc;
    size_t len = encoding(x, buf, &enc);
    pl_engine_near n;
    const refusal *f;
    int exact;
    pl_nearest kind;

    pl_engine_nearest(d->engine, x->key, NEAR_MAX, &n);
    f = refusal_for(d, x->key, enc, len, x->now, &exact);
    m->near_parked = n.found ? n.nearest.parked : 0;
    m->near_version_parked = n.nearest_version_parked;
    m->version_parked = n.version_parked;
    m->deployment_parked = n.deployment_parked;
    m->deployment_keys = n.deployment_keys;
    m->parked = pl_engine_ledger(d->engine)->parked_now;
    if (n.found) {
        unsigned char nbuf[PL_KEY_ENCODED_MAX];
        size_t nlen = pl_key_encode(&n.nearest.key, nbuf);
        keep(&m->near, nbuf, nlen); /* without it, fewer words */
    }
    if (x->offered || n.key_parked > 0)
        kind = PL_NEAREST_KEY;
    else if (f != NULL && exact)
        kind = PL_NEAREST_TOKEN;
    else if (n.version_parked > 0)
        kind = PL_NEAREST_MACHINE;
    else if (n.deployment_parked > 0)
        kind = PL_NEAREST_VERSION;
    else if (f != NULL)
        kind = PL_NEAREST_TOKEN;
    else if (m->parked > 0)
        kind = PL_NEAREST_DEPLOYMENT;
    else
        kind = PL_NEAREST_NONE;
    if (kind == PL_NEAREST_TOKEN && keep(&m->refused, f->key.enc, f->key.len) == 0) {
        m->has_refusal = 1;
        m->ref_token = f->token;
        m->ref_enforced = f->enforced;
        m->ref_at = f->at;
        m->ref_count = f->count;
    }
    return kind;
}

/* A false answer: kept with its diagnosis (a miss) in the next slot. */
static int missed(pl_diag *d, unsigned r, const pl_diag_dispatch *x)
{
    miss_event *m = &d->misses[d->nmisses++ % PL_DIAG_LAST];
    int kind = -1;

    unkeep(&m->near);
    unkeep(&m->refused);
    keep_event(d, &m->ev, r, x);
    keep_run(m, x->payload, x->payload_len);
    m->has_refusal = 0;
    m->near_parked = m->near_version_parked = m->version_parked = 0;
    m->deployment_parked = m->deployment_keys = m->parked = 0;
    if (x->result == PL_DISPATCH_MISS)
        kind = (int)classify(d, x, m);
    m->nearest = (uint8_t)(kind < 0 ? PL_NEAREST_NONE : kind);
    return kind;
}

/* A miss whose key could not be kept (out of memory): classified all the
 * same, for the counters. */
static int classify_only(pl_diag *d, const pl_diag_dispatch *x)
{
    miss_event m;
    int kind;

    if (x->result != PL_DISPATCH_MISS)
        return -1;
    memset(&m, 0, sizeof(m));
    kind = (int)classify(d, x, &m);
    unkeep(&m.near);
    unkeep(&m.refused);
    return kind;
}

/* The rec of <x>'s key, which came without its spot nor a tag still
 * valid: looked up, and kept from now on if it is not yet (NONE when
 * memory is out). */
static unsigned rec_without_spot(pl_diag *d, const pl_diag_dispatch *x)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(x->key, buf);
    uint32_t hash = pl_hash(buf, len, 0);
    unsigned r = find_rec(d, buf, len, hash);

    return r != NONE ? r : add_rec(d, buf, len, hash, x->now / MINUTE_MS);
}

static unsigned tagged(const pl_diag *d, uint32_t tag)
{
    unsigned r = tag & 0xff;

    return tag != 0 && r < d->nrecs && d->recs[r].gen == tag >> 8 ? r : NONE;
}

/* pl_diag_tag's way for a spot not tagged yet, or whose tag went stale:
 * out of line, so that a tagged spot costs a compare and no more. */
static __attribute__((noinline)) void tag_anew(pl_diag *d, pl_engine_spot *spot, uint64_t now)
{
    unsigned r = find_rec(d, spot->buf, spot->len, spot->hash);

    if (r == NONE)
        r = add_rec(d, spot->buf, spot->len, spot->hash, now / MINUTE_MS);
    spot->note = r != NONE ? d->recs[r].gen << 8 | r : 0;
}

void pl_diag_tag(pl_diag *d, pl_engine_spot *spot, uint64_t now)
{
    if (tagged(d, spot->note) == NONE)
        tag_anew(d, spot, now);
}

/* Every dispatch but a hit whose key was tagged (pl_diag_tag): a miss, a
 * dispatch untagged (nothing parked for its key, or memory out), a tag
 * gone stale (its key let go meanwhile). Out of line, so that the hit's path
 * stays short. <r>: the key's rec, or NONE. */
static __attribute__((noinline)) int dispatched(pl_diag *d, const pl_diag_dispatch *x,
                                                unsigned r)
{
    int hit = x->result == PL_DISPATCH_HIT;

    if (r == NONE && x->spot != NULL) {
        r = find_rec(d, x->spot->buf, x->spot->len, x->spot->hash);
        if (r == NONE)
            r = add_rec(d, x->spot->buf, x->spot->len, x->spot->hash, x->now / MINUTE_MS);
    } else if (r == NONE) {
        r = rec_without_spot(d, x);
    }
    if (r == NONE)
        return classify_only(d, x);
    d->recs[r].used = 1;
    window_count(&d->recs[r].w, x->now, hit);
    if (!hit)
        return missed(d, r, x);
    keep_event(d, &d->hits[d->nhits++ % PL_DIAG_LAST], r, x);
    return -1;
}

int pl_diag_dispatched(pl_diag *d, const pl_diag_dispatch *x)
{
    unsigned r = tagged(d, x->tag);

    if (r == NONE || x->result != PL_DISPATCH_HIT)
        return dispatched(d, x, r);
    d->recs[r].used = 1;
    window_count(&d->recs[r].w, x->now, 1);
    keep_event(d, &d->hits[d->nhits++ % PL_DIAG_LAST], r, x);
    return -1;
}

void pl_diag_token_refused(pl_diag *d, const pl_key *key, int token, int enforced, uint64_t now)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(key, buf);
    refusal *f = NULL;

    if (len == 0)
        return; /* no deployment could be read: nothing to name */
    for (unsigned i = 0; i < PL_DIAG_TOKENS && f == NULL; i++)
        if (d->refusals[i].key.len == len && memcmp(d->refusals[i].key.enc, buf, len) == 0)
            f = &d->refusals[i];
    if (f == NULL) { /* a new one takes the oldest's (or a free) slot */
        f = &d->refusals[0];
        for (unsigned i = 1; i < PL_DIAG_TOKENS && f->key.enc != NULL; i++)
            if (d->refusals[i].key.enc == NULL || d->refusals[i].at < f->at)
                f = &d->refusals[i];
        unkeep(&f->key);
        if (keep(&f->key, buf, len) != 0)
            return;
        f->count = 0;
    }
    f->token = token;
    f->enforced = enforced;
    f->at = now;
    f->count++;
}

/* ---- reading ---- */

void pl_diag_window_all(const pl_diag *d, uint64_t now, pl_diag_window *out)
{
    window_read(&d->gone, now, out);
    for (unsigned i = 0; i < d->nrecs; i++) {
        pl_diag_window w;

        window_read(&d->recs[i].w, now, &w);
        for (unsigned j = 0; j < PL_DIAG_MINUTES; j++) {
            out->hits[j] += w.hits[j];
            out->misses[j] += w.misses[j];
        }
        out->total_hits += w.total_hits;
        out->total_misses += w.total_misses;
    }
}

int pl_diag_key_window(const pl_diag *d, const unsigned char *enc, size_t len, uint32_t hash,
                       uint64_t now, pl_diag_window *out)
{
    unsigned r = find_rec(d, enc, len, hash);

    if (r == NONE) {
        memset(out, 0, sizeof(*out));
        return 0;
    }
    window_read(&d->recs[r].w, now, out);
    return 1;
}

size_t pl_diag_each_key(const pl_diag *d, uint64_t now,
                        void (*fn)(const pl_key *key, const pl_diag_window *w, void *arg),
                        void *arg)
{
    size_t n = 0;

    for (unsigned i = 0; i < d->nrecs; i++, n++) {
        pl_diag_window w;
        pl_key k;

        pl_key_decode(d->recs[i].enc, d->recs[i].len, &k);
        window_read(&d->recs[i].w, now, &w);
        fn(&k, &w, arg);
    }
    return n;
}

static void event_read(const pl_diag *d, const event *e, pl_diag_event *out)
{
    const rec *r = &d->recs[e->rec];

    memset(out, 0, sizeof(*out));
    pl_key_decode(r->enc, r->len, &out->key);
    out->result = (pl_dispatch_result)e->result;
    out->at = e->at;
    out->took_ns = e->took_ns;
    out->waited_ms = e->waited_ms;
}

static void miss_read(const pl_diag *d, const miss_event *m, pl_diag_event *out)
{
    event_read(d, &m->ev, out);
    memcpy(out->run, m->run, m->run_len);
    out->run[m->run_len] = '\0';
    out->run_cut = m->run_cut;
    out->nearest = (pl_nearest)m->nearest;
    out->near_parked = m->near_parked;
    out->near_version_parked = m->near_version_parked;
    out->version_parked = m->version_parked;
    out->deployment_parked = m->deployment_parked;
    out->deployment_keys = m->deployment_keys;
    out->parked = m->parked;
    if ((out->has_near = m->near.enc != NULL))
        pl_key_decode(m->near.enc, m->near.len, &out->near);
    if ((out->has_refusal = m->has_refusal)) {
        pl_key_decode(m->refused.enc, m->refused.len, &out->refusal.key);
        out->refusal.token = m->ref_token;
        out->refusal.enforced = m->ref_enforced;
        out->refusal.at = m->ref_at;
        out->refusal.count = m->ref_count;
    }
}

size_t pl_diag_each_event(const pl_diag *d, int misses,
                          void (*fn)(const pl_diag_event *ev, void *arg), void *arg)
{
    uint64_t total = misses ? d->nmisses : d->nhits;
    size_t n = 0;

    for (uint64_t i = total; i > 0 && total - i < PL_DIAG_LAST; i--, n++) {
        pl_diag_event ev;

        if (misses)
            miss_read(d, &d->misses[(i - 1) % PL_DIAG_LAST], &ev);
        else
            event_read(d, &d->hits[(i - 1) % PL_DIAG_LAST], &ev);
        fn(&ev, arg);
    }
    return n;
}

/* ---- in words ---- */

typedef struct {
    char *buf;
    size_t cap, len;
} words;

static void say(words *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(words *w, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (w->len + 1 >= w->cap)
        return;
    va_start(ap, fmt);
    n = vsnprintf(w->buf + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->len += (size_t)n < w->cap - w->len ? (size_t)n : w->cap - w->len - 1;
}

static const char *plural(uint64_t n)
{
    return n == 1 ? "" : "s";
}

/* "3 controllers are" / "1 controller is" */
static void say_parked(words *w, uint64_t n)
{
    say(w, "%llu controller%s %s parked", (unsigned long long)n, plural(n),
        n == 1 ? "is" : "are");
}

/* How long before the dispatch: "under 1 s", "12 s", "3 min". */
static void say_age(words *w, uint64_t ms)
{
    if (ms < 1000)
        say(w, "under 1 s");
    else if (ms < 120000)
        say(w, "%llu s", (unsigned long long)(ms / 1000));
    else
        say(w, "%llu min", (unsigned long long)(ms / 60000));
}

static void why_token(words *w, const pl_diag_event *ev)
{
    const pl_diag_refusal *f = &ev->refusal;
    const char *what = f->token == PL_TOKEN_LEGACY ? "a bare deployment id where a signed "
                                                     "token is required"
                                                   : "an invalid deployment token";

    if (!ev->has_refusal) {
        say(w, "a poll for this deployment was lately refused its deployment token");
        return;
    }
    if (f->count == 1)
        say(w, "a poll for this deployment");
    else
        say(w, "%lu polls for this deployment", (unsigned long)f->count);
    if (f->key.version_len != ev->key.version_len ||
        memcmp(f->key.version, ev->key.version, f->key.version_len) != 0)
        say(w, " (version %.*s)", (int)f->key.version_len, f->key.version);
    say(w, " came with %s (%s", what, f->count == 1 ? "" : "the last ");
    say_age(w, ev->at >= f->at ? ev->at - f->at : 0);
    say(w, f->enforced ? " before the dispatch): refused 401 (token_mode = enforce); is "
                         "token_secret the supervisor's WORKLOAD_TOKEN_SECRET?"
                       : " before the dispatch; token_mode = log: it parked all the same, "
                         "and has gone since)");
}

const char *pl_diag_why(const pl_diag_event *ev, char *buf, size_t cap)
{
    words w = {buf, cap, 0};
    const pl_key *k = &ev->key, *n = &ev->near;

    buf[0] = '\0';
    if (ev->result == PL_DISPATCH_UNCONFIRMED) {
        say(&w, "the run was written to a controller, but TCP could not tell whether it "
                "arrived (delivery = confirm)");
        return buf;
    }
    if (ev->result == PL_DISPATCH_ABANDONED) {
        say(&w, "the supervisor had gone before the run was handed to a controller");
        return buf;
    }
    switch (ev->nearest) {
    case PL_NEAREST_KEY:
        say(&w, "controllers were parked for this very key, but none could take the run: "
                "their connections had gone, or their polls were about to end");
        break;
    case PL_NEAREST_TOKEN:
        why_token(&w, ev);
        break;
    case PL_NEAREST_MACHINE:
        if (!ev->has_near) {
            say_parked(&w, ev->version_parked);
            say(&w, " for this deployment and version, on other machines");
            break;
        }
        say_parked(&w, ev->near_parked);
        say(&w, " for this deployment and version on %g vCPU, %g GB; the run needs %g vCPU, "
                "%g GB", n->cpu, n->memory, k->cpu, k->memory);
        if (ev->version_parked > ev->near_parked)
            say(&w, " (%llu on other machines in all)", (unsigned long long)ev->version_parked);
        break;
    case PL_NEAREST_VERSION:
        if (!ev->has_near) {
            say_parked(&w, ev->deployment_parked);
            say(&w, " for this deployment, on other versions");
            break;
        }
        say_parked(&w, ev->near_version_parked);
        say(&w, " for this deployment on version %.*s; the run is %.*s", (int)n->version_len,
            n->version, (int)k->version_len, k->version);
        if (ev->deployment_parked > ev->near_version_parked)
            say(&w, " (%llu for this deployment in all)",
                (unsigned long long)ev->deployment_parked);
        break;
    case PL_NEAREST_DEPLOYMENT:
        say(&w, "nothing is parked for this deployment; ");
        say_parked(&w, ev->parked);
        say(&w, " for others");
        break;
    case PL_NEAREST_NONE:
    case PL_NEAREST__COUNT:
        say(&w, "no controller was parked on this instance at all");
        break;
    }
    return buf;
}
