/* ring.c -- a key's owner among the instances: rendezvous hashing. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/ring.h"

/* A fixed 64-bit hash, eight bytes at a time (multiply and fold). Fixed:
 * instances agree on owners only if they hash alike. */
static uint64_t hash64(const void *data, size_t len, uint64_t h)
{
    const uint64_t k = 0x9E3779B97F4A7C15u;
    const unsigned char *s = data, *end = s + len;
    uint64_t w;

    h = (h ^ len) * k;
    for (; end - s >= 8; s += 8) {
        memcpy(&w, s, 8);
        h = (h ^ w) * k;
        h ^= h >> 29;
    }
    for (w = 0; s < end; s++)
        w = w << 8 | *s;
    h = (h ^ w) * k;
    return h ^ h >> 32;
}

/* A member's rank for a key: both hashes mixed (splitmix64's finalizer),
 * so that each member orders the keys independently of the others. */
static uint64_t rank(uint64_t seed, uint64_t kh)
{
    uint64_t z = seed ^ kh;

    z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9u;
    z = (z ^ z >> 27) * 0x94D049BB133111EBu;
    return z ^ z >> 31;
}

void pl_ring_init(pl_ring *r)
{
    r->n = 0;
}

int pl_ring_find(const pl_ring *r, const char *name, size_t len)
{
    for (size_t i = 0; i < r->n; i++)
        if (strlen(r->m[i].name) == len && memcmp(r->m[i].name, name, len) == 0)
            return (int)i;
    return -ENOENT;
}

/* Orders member names as strcmp does, <name> being <len> bytes. */
static int name_cmp(const char *member, const char *name, size_t len)
{
    size_t mlen = strlen(member);
    int c = memcmp(member, name, mlen < len ? mlen : len);

    return c != 0 ? c : (mlen > len) - (mlen < len);
}

uint64_t pl_ring_digest(const pl_ring *r)
{
    uint64_t h = 0;

    /* The members are sorted, so the same set gives the same sequence. */
    for (size_t i = 0; i < r->n; i++)
        h = (h ^ r->m[i].seed) * 0x100000001b3ULL + i;
    return r->n == 0 ? 0 : h | 1;
}

/* Reads a run of at most <max> digits of base <base> (10, or 16 in
 * lowercase) from *p into *out. Returns 0, or -EINVAL for none or more. */
static int digits(const char **p, const char *end, unsigned base, size_t max, uint64_t *out)
{
    const char *s = *p;
    uint64_t n = 0;

    for (; s < end && (size_t)(s - *p) <= max; s++) {
        unsigned d = *s >= '0' && *s <= '9' ? (unsigned)(*s - '0')
                     : base == 16 && *s >= 'a' && *s <= 'f' ? (unsigned)(*s - 'a' + 10)
                                                             : base;
        if (d == base)
            break;
        n = n * base + d;
    }
    if (s == *p || (size_t)(s - *p) > max)
        return -EINVAL;
    *p = s;
    *out = n;
    return 0;
}

int pl_ring_view_read(const char *v, size_t len, int with_clock, pl_ring_view *out)
{
    const char *p = v, *end = v + len;
    size_t n;

    if (digits(&p, end, 16, 16, &out->digest) != 0 || p - v != 16 || p == end || *p++ != ' ')
        return -EINVAL;
    out->ms = 0;
    if (with_clock && (digits(&p, end, 10, 13, &out->ms) != 0 || p == end || *p++ != ' '))
        return -EINVAL;
    n = (size_t)(end - p);
    if (n == 0 || n >= PL_RING_NAME_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] <= ' ' || (unsigned char)p[i] >= 0x7f)
            return -EINVAL;
    memcpy(out->name, p, n);
    out->name[n] = '\0';
    return 0;
}

int pl_ring_add(pl_ring *r, const char *name, size_t len)
{
    size_t at = 0;

    if (len == 0 || len >= PL_RING_NAME_MAX)
        return -EINVAL;
    if (pl_ring_find(r, name, len) >= 0)
        return 0;
    if (r->n == PL_RING_MEMBERS_MAX)
        return -ENOSPC;
    while (at < r->n && name_cmp(r->m[at].name, name, len) < 0)
        at++;
    memmove(&r->m[at + 1], &r->m[at], (r->n - at) * sizeof(r->m[0]));
    memcpy(r->m[at].name, name, len);
    r->m[at].name[len] = '\0';
    r->m[at].seed = hash64(name, len, 0x5EED);
    r->n++;
    return 0;
}

int pl_ring_same(const pl_ring *a, const pl_ring *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->m[i].name, b->m[i].name) != 0)
            return 0;
    return 1;
}

uint64_t pl_ring_key_hash(const pl_key *k)
{
    unsigned char buf[PL_KEY_ENCODED_MAX];
    size_t len = pl_key_encode(k, buf);

    return hash64(buf, len, 0);
}

size_t pl_ring_owner_but(const pl_ring *r, uint64_t kh, size_t skip)
{
    size_t best = r->n;
    uint64_t top = 0;

    /* Ties (no two names hash alike in practice) go to the first name. */
    for (size_t i = 0; i < r->n; i++) {
        uint64_t v = rank(r->m[i].seed, kh);
        if (i != skip && (best == r->n || v > top)) {
            top = v;
            best = i;
        }
    }
    return best;
}

size_t pl_ring_owner(const pl_ring *r, uint64_t kh)
{
    return pl_ring_owner_but(r, kh, r->n);
}

int pl_ring_split(const char *s, size_t len, char *host, size_t cap, uint16_t *port)
{
    const char *colon = NULL, *h = s;
    size_t hlen;
    unsigned long v = 0;

    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (close == NULL || close + 1 >= s + len || close[1] != ':')
            return -EINVAL;
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = memchr(s, ':', len);
        if (colon == NULL || memchr(colon + 1, ':', len - (size_t)(colon + 1 - s)) != NULL)
            return -EINVAL; /* none, or an IPv6 host without its brackets */
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= cap || colon + 1 == s + len || len - (size_t)(colon + 1 - s) > 5)
        return -EINVAL;
    for (const char *q = colon + 1; q < s + len; q++)
        if (*q < '0' || *q > '9' || (v = v * 10 + (unsigned long)(*q - '0')) > 65535)
            return -EINVAL;
    for (size_t i = 0; i < hlen; i++)
        if ((unsigned char)h[i] <= ' ' || (unsigned char)h[i] >= 0x7f ||
            strchr("/?#@[]", h[i]) != NULL)
            return -EINVAL;
    if (v == 0)
        return -EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return 0;
}

size_t pl_ring_each_name(const char *list, void (*fn)(const char *s, size_t len, void *arg),
                         void *arg)
{
    size_t n = 0;

    for (const char *s = list + strspn(list, ", "); *s != '\0'; s += strspn(s, ", ")) {
        size_t len = strcspn(s, ", ");
        fn(s, len, arg);
        s += len;
        n++;
    }
    return n;
}

typedef struct {
    const char *self;
    const char *bad; /* the first name that is not one */
    size_t bad_len, count;
    int self_seen;
} names_check;

static void check_name(const char *s, size_t len, void *arg)
{
    names_check *c = arg;
    char host[PL_RING_NAME_MAX];
    uint16_t port;

    if (c->bad == NULL && (len >= PL_RING_NAME_MAX ||
                           pl_ring_split(s, len, host, sizeof(host), &port) != 0)) {
        c->bad = s;
        c->bad_len = len;
    }
    if (strlen(c->self) == len && memcmp(c->self, s, len) == 0)
        c->self_seen = 1;
    c->count++;
}

int pl_ring_check_config(const char *peers, const char *dns, const char *self, char *err,
                         size_t errlen)
{
    names_check c = {self, NULL, 0, 0, 0};
    char host[PL_RING_NAME_MAX];
    uint16_t port;

    if (peers[0] != '\0' && dns[0] != '\0') {
        snprintf(err, errlen, "ring_peers and ring_dns: a ring takes one or the other");
        return -EINVAL;
    }
    if (self[0] != '\0' && (strlen(self) >= PL_RING_NAME_MAX ||
                            pl_ring_split(self, strlen(self), host, sizeof(host), &port) != 0)) {
        snprintf(err, errlen, "ring_self: \"%.80s\" is not host:port", self);
        return -EINVAL;
    }
    if (dns[0] != '\0' && (strlen(dns) >= PL_RING_NAME_MAX ||
                           pl_ring_split(dns, strlen(dns), host, sizeof(host), &port) != 0)) {
        snprintf(err, errlen, "ring_dns: \"%.80s\" is not name:port", dns);
        return -EINVAL;
    }
    if (peers[0] == '\0') {
        if (self[0] != '\0' && dns[0] == '\0') {
            snprintf(err, errlen, "ring_self is set but neither ring_peers nor ring_dns");
            return -EINVAL;
        }
        return 0;
    }
    pl_ring_each_name(peers, check_name, &c);
    if (c.bad != NULL) {
        snprintf(err, errlen, "ring_peers: \"%.*s\" is not host:port",
                 (int)(c.bad_len > 80 ? 80 : c.bad_len), c.bad);
        return -EINVAL;
    }
    if (c.count > PL_RING_MEMBERS_MAX) {
        snprintf(err, errlen, "ring_peers: more than %d members", PL_RING_MEMBERS_MAX);
        return -EINVAL;
    }
    if (!c.self_seen) {
        snprintf(err, errlen, "ring_self (this instance as its peers reach it) must be one "
                              "of ring_peers");
        return -EINVAL;
    }
    return 0;
}
