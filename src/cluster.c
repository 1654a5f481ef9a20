/* cluster.c -- where a request for a key is served, and the redirect that
 * sends it to the key's owner. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "pilotlight/cluster.h"
#include "pilotlight/hash.h"
#include "pilotlight/mem.h"

void pl_cluster_init(pl_cluster *cl, uint64_t grace_ms)
{
    memset(cl, 0, sizeof(*cl));
    pl_ring_init(&cl->ring);
    cl->self = -1;
    cl->grace_ms = grace_ms;
}

void pl_cluster_set(pl_cluster *cl, const pl_ring *ring, int self, int agreed, uint64_t now)
{
    if (self >= 0 && cl->self < 0)
        cl->newcomer_until = UINT64_MAX;
    /* Agreed with others, at last: a grace for the polls still on their way. */
    if (cl->newcomer_until == UINT64_MAX && agreed && ring->n > 1)
        cl->newcomer_until = now + cl->grace_ms;
    cl->ring = *ring;
    cl->self = self;
    cl->agreed = agreed;
    cl->digest = pl_ring_digest(ring);
    cl->on = 1;
    /* Every key's "owned here" mark was of the old view. */
    if (++cl->view == 0)
        cl->view = 1;
}

/* The decimal value of s[0..len), at most 20 digits; -EINVAL otherwise. */
static int read_u64(const char *s, size_t len, uint64_t *out)
{
    uint64_t v = 0;

    if (len == 0 || len > 19)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int is_hex(const char *s, size_t len, size_t want)
{
    if (len != want)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

int pl_cluster_read_hop(const char *query, size_t len, pl_hop *out)
{
    const char *p = query, *end = query + len;
    pl_hop h = {0, 0, NULL, NULL, 0, 0, 0};
    uint64_t v;

    memset(out, 0, sizeof(*out));
    out->marked = out->malformed = 1; /* until read whole */
    while (p != NULL && p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p)), *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        size_t nlen = eq ? (size_t)(eq - p) : (size_t)(stop - p);
        const char *val = eq ? eq + 1 : stop;
        size_t vlen = (size_t)(stop - val);

        if (nlen == 6 && memcmp(p, "pl_hop", 6) == 0) {
            if (read_u64(val, vlen, &v) != 0 || v > PL_CLUSTER_HOPS_MAX)
                return -EINVAL;
            h.hops = (unsigned)v;
            h.marked = 1;
        } else if (nlen == 6 && memcmp(p, "pl_exp", 6) == 0) {
            if (read_u64(val, vlen, &h.exp) != 0)
                return -EINVAL;
            h.marked = 1;
        } else if (nlen == 6 && memcmp(p, "pl_sig", 6) == 0) {
            if (!is_hex(val, vlen, 64))
                return -EINVAL;
            h.sig = val;
            h.marked = 1;
        } else if (nlen == 8 && memcmp(p, "pl_nonce", 8) == 0) {
            if (!is_hex(val, vlen, PL_CLUSTER_NONCE_HEX))
                return -EINVAL;
            h.nonce = val;
            h.marked = 1;
        }
        p = amp ? amp + 1 : NULL;
    }
    *out = h;
    return 0;
}

size_t pl_cluster_owner(const pl_cluster *cl, const pl_key *key)
{
    return pl_ring_owner(&cl->ring, pl_ring_key_hash(key));
}

int pl_cluster_owns(const pl_cluster *cl, const pl_key *key)
{
    if (!cl->on || cl->ring.n == 0)
        return 1;
    return cl->self >= 0 && pl_cluster_owner(cl, key) == (size_t)cl->self;
}

int pl_cluster_route(const pl_cluster *cl, const pl_key *key, unsigned hops, int *foreign)
{
    size_t owner;

    *foreign = 0;
    if (!cl->on || cl->ring.n == 0)
        return -1;
    owner = pl_cluster_owner(cl, key);
    if (cl->self >= 0 && owner == (size_t)cl->self)
        return -1;
    if (hops >= PL_CLUSTER_HOPS_MAX || (hops > 0 && cl->self >= 0)) {
        *foreign = 1;
        return -1;
    }
    return (int)owner;
}

int pl_cluster_after_miss(const pl_cluster *cl, const pl_key *key, unsigned hops, int foreign,
                          int recently)
{
    size_t to;

    if (!cl->on || cl->ring.n < 2 || hops >= PL_CLUSTER_HOPS_MAX)
        return -1;
    if (foreign)
        to = pl_cluster_owner(cl, key);
    else if (recently && cl->self >= 0)
        to = pl_ring_owner_but(&cl->ring, pl_ring_key_hash(key), (size_t)cl->self);
    else
        return -1;
    return to < cl->ring.n && (int)to != cl->self ? (int)to : -1;
}

void pl_cluster_decide(const pl_cluster *cl, const pl_key *key, const pl_hop *hop,
                       uint64_t now, pl_cluster_verdict *v)
{
    v->to = pl_cluster_route(cl, key, hop->hops, &v->foreign);
    v->after_miss = v->to >= 0 ? -1
                               : pl_cluster_after_miss(cl, key, hop->hops, v->foreign,
                                                       now < cl->newcomer_until);
}

/* HMAC-SHA256 under <secret> of "pl2\n<exp>\n<hops>\n<member>\n<nonce>\n
 * <path>\n" and the SHA-256 of <body>, in lower-case hex with its NUL (65
 * bytes): what a redirect authorises, and no more. */
static void sign(const char *secret, uint64_t exp, unsigned hops, const char *member,
                 const char *nonce, const char *path, const char *body, size_t body_len,
                 char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char msg[PL_RING_NAME_MAX + 160], mac[EVP_MAX_MD_SIZE];
    unsigned int maclen = 0, dlen = 0;
    int n = snprintf((char *)msg, sizeof(msg) - 32, "pl2\n%llu\n%u\n%s\n%.*s\n%s\n",
                     (unsigned long long)exp, hops, member, PL_CLUSTER_NONCE_HEX, nonce, path);

    memset(mac, 0, sizeof(mac));
    if (n > 0 && (size_t)n < sizeof(msg) - 32 &&
        EVP_Digest(body, body_len, msg + n, &dlen, EVP_sha256(), NULL) == 1 && dlen == 32)
        HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, (size_t)n + 32, mac, &maclen);
    if (maclen != 32)
        memset(mac, 0, sizeof(mac)); /* then it matches no signature sent */
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[mac[i] >> 4];
        hex[2 * i + 1] = digits[mac[i] & 15];
    }
    hex[64] = '\0';
}

int pl_cluster_location(char *out, const char *owner, uint16_t port, const char *path,
                        unsigned hops, const char *secret, const char *nonce,
                        const char *body, size_t body_len, uint64_t now_s)
{
    const char *colon = strrchr(owner, ':');
    int hostlen = colon ? (int)(colon - owner) : (int)strlen(owner), n;
    char hex[65];

    if (port != 0)
        n = snprintf(out, PL_CLUSTER_LOCATION_MAX, "Location: http://%.*s:%u%s?pl_hop=%u",
                     hostlen, owner, (unsigned)port, path, hops + 1);
    else
        n = snprintf(out, PL_CLUSTER_LOCATION_MAX, "Location: http://%s%s?pl_hop=%u", owner,
                     path, hops + 1);
    if (n > 0 && secret != NULL && secret[0] != '\0' && n < PL_CLUSTER_LOCATION_MAX) {
        uint64_t exp = now_s + PL_CLUSTER_SIG_TTL_S;
        sign(secret, exp, hops + 1, owner, nonce, path, body, body_len, hex);
        n += snprintf(out + n, PL_CLUSTER_LOCATION_MAX - (size_t)n,
                      "&pl_exp=%llu&pl_nonce=%.*s&pl_sig=%s", (unsigned long long)exp,
                      PL_CLUSTER_NONCE_HEX, nonce, hex);
    }
    if (n > 0 && n < PL_CLUSTER_LOCATION_MAX)
        n += snprintf(out + n, PL_CLUSTER_LOCATION_MAX - (size_t)n, "\r\n");
    return n > 0 && n < PL_CLUSTER_LOCATION_MAX ? n : -ENOSPC;
}

int pl_cluster_hop_signed(const pl_hop *h, const char *secret, const char *self,
                          const char *path, const char *body, size_t body_len, uint64_t now_s)
{
    char hex[65];

    if (h->sig == NULL || h->nonce == NULL || h->hops == 0 || secret[0] == '\0' ||
        self == NULL || self[0] == '\0' || h->exp + PL_CLUSTER_SKEW_S < now_s ||
        h->exp > now_s + PL_CLUSTER_SIG_TTL_S + PL_CLUSTER_SKEW_S) /* not one made to last */
        return 0;
    sign(secret, h->exp, h->hops, self, h->nonce, path, body, body_len, hex);
    return CRYPTO_memcmp(hex, h->sig, 64) == 0;
}

/* ---- the nonces taken ---- */

struct pl_cluster_seen {
    uint64_t until;  /* kept until then (epoch seconds); 0: a free slot */
    char nonce[PL_CLUSTER_NONCE_HEX];
};

int pl_cluster_replay_take(pl_cluster_replay *rp, const pl_hop *h, uint64_t now_s)
{
    uint32_t hv = pl_hash(h->nonce, PL_CLUSTER_NONCE_HEX, 0);
    size_t free_at = SIZE_MAX;

    if (rp->slots == NULL) {
        rp->slots = pl_malloc(PL_CLUSTER_REPLAY_MAX * sizeof(*rp->slots));
        if (rp->slots == NULL)
            return -ENOMEM;
        memset(rp->slots, 0, PL_CLUSTER_REPLAY_MAX * sizeof(*rp->slots));
        rp->cap = PL_CLUSTER_REPLAY_MAX;
    }
    /* Open addressing with a bounded probe, at a place a client cannot
     * aim for (the hash is keyed); an expired slot on the way is reused,
     * so the set holds what is live and no more. */
    for (size_t n = 0; n < 64; n++) {
        struct pl_cluster_seen *s = &rp->slots[(hv + n) % rp->cap];
        if (s->until >= now_s && memcmp(s->nonce, h->nonce, PL_CLUSTER_NONCE_HEX) == 0)
            return -EALREADY;
        if (free_at == SIZE_MAX && s->until < now_s)
            free_at = (hv + n) % rp->cap;
        if (s->until == 0)
            break;
    }
    if (free_at == SIZE_MAX)
        return -ENOSPC; /* refused rather than forget a live one */
    rp->slots[free_at].until = h->exp + PL_CLUSTER_SKEW_S;
    memcpy(rp->slots[free_at].nonce, h->nonce, PL_CLUSTER_NONCE_HEX);
    return 0;
}

void pl_cluster_replay_free(pl_cluster_replay *rp)
{
    pl_free(rp->slots);
    rp->slots = NULL;
    rp->cap = 0;
}
