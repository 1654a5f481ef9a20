/* token.c -- reading and verifying deployment tokens (HS256 JWTs). */
#include <limits.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "pilotlight/hash.h"
#include "pilotlight/json.h"
#include "pilotlight/mem.h"
#include "pilotlight/token.h"

/* uthash allocates its buckets through our wrapper and, on failure, leaves
 * the table unchanged and tells us instead of calling exit(). */
#define HASH_NONFATAL_OOM 1
#define uthash_malloc(sz) pl_malloc(sz)
#define uthash_free(ptr, sz) pl_free(ptr)
#define uthash_nonfatal_oom(obj) (cache_oom = 1)
static int cache_oom;
#define HASH_FUNCTION(keyptr, keylen, hashv) ((hashv) = pl_hash((keyptr), (keylen), 0))
#include <uthash.h>

/* What Trigger.dev's generateJWT() sets (packages/core, v3/jwt.ts). */
#define TOKEN_ISSUER "https://id.trigger.dev"
#define TOKEN_AUDIENCE "https://api.trigger.dev"
#define TOKEN_VERSION 1.0
/* An HMAC-SHA256 is 32 bytes (43 base64url characters); longer signature
 * segments than SIG_B64_MAX are refused without decoding. */
#define SIG_LEN 32
#define SIG_B64_MAX 64

typedef struct cache_entry {
    UT_hash_handle hh;                 /* by exact token bytes */
    struct cache_entry *older, *newer; /* recency list, oldest first */
    pl_token_claims claims;
    size_t len;
    char token[];
} cache_entry;

struct pl_token_verifier {
    unsigned char *secret;
    size_t secret_len;
    unsigned char *previous; /* a secret being retired, or NULL */
    size_t previous_len;
    cache_entry *cache; /* uthash head */
    cache_entry *oldest, *newest;
    pl_token_stats stats;
};

/* ---- base64url --------------------------------------------------------- */

static int b64url_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -EINVAL;
}

/* Decodes <in> into <out> (len*3/4+3 bytes). With <strict>, the unused
 * bits of the last character must be zero, so that every byte string has
 * exactly one encoding. Returns the decoded length or -EINVAL. */
static long b64url_decode(const char *in, size_t len, unsigned char *out, int strict)
{
    unsigned long acc = 0;
    int bits = 0;
    long n = 0;

    if (len % 4 == 1)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        int v = b64url_value((unsigned char)in[i]);
        if (v < 0)
            return -EINVAL;
        acc = (acc << 6) | (unsigned long)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1UL << bits) - 1;
        }
    }
    if (strict && acc != 0)
        return -EINVAL;
    return n;
}

/* Sets *dot1 and *dot2 and returns 1 when <s> is three non-empty base64url
 * segments joined by dots. */
static int jwt_shape(const char *s, size_t len, const char **dot1, const char **dot2)
{
    size_t seg = 0;
    const char *dots[2] = {NULL, NULL};
    int n = 0;

    /* Every poll asks this of its deployment id: a plain id has no dot. */
    if (memchr(s, '.', len) == NULL)
        return 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (seg == 0 || n == 2)
                return 0;
            dots[n++] = s + i;
            seg = 0;
        } else if (b64url_value((unsigned char)s[i]) < 0) {
            return 0;
        } else {
            seg++;
        }
    }
    *dot1 = dots[0];
    *dot2 = dots[1];
    return n == 2 && seg > 0;
}

long pl_token_b64url_decode(const char *in, size_t len, unsigned char *out)
{
    return b64url_decode(in, len, out, 0);
}

/* What is read of a segment. A header: "alg", "typ", "crit". Claims: the
 * ones Trigger.dev's schema requires, and "nbf" and "iat" jose checks. */
enum { H_ALG, H_TYP, H_CRIT, H_PATHS };
static const pl_json_path header_paths[H_PATHS] = {
    [H_ALG] = {PL_JSON_ROOT, 3, "alg"},
    [H_TYP] = {PL_JSON_ROOT, 3, "typ"},
    [H_CRIT] = {PL_JSON_ROOT, 4, "crit"},
};

enum {
    C_DEPLOYMENT, C_DEPLOYMENT_VERSION, C_ENVIRONMENT_ID, C_ENVIRONMENT_TYPE, C_ORG_ID,
    C_PROJECT_ID, C_ISS, C_AUD, C_VER, C_EXP, C_NBF, C_IAT, C_PATHS
};
static const pl_json_path claim_paths[C_PATHS] = {
    [C_DEPLOYMENT] = {PL_JSON_ROOT, 10, "deployment"},
    [C_DEPLOYMENT_VERSION] = {PL_JSON_ROOT, 18, "deployment_version"},
    [C_ENVIRONMENT_ID] = {PL_JSON_ROOT, 14, "environment_id"},
    [C_ENVIRONMENT_TYPE] = {PL_JSON_ROOT, 16, "environment_type"},
    [C_ORG_ID] = {PL_JSON_ROOT, 6, "org_id"},
    [C_PROJECT_ID] = {PL_JSON_ROOT, 10, "project_id"},
    [C_ISS] = {PL_JSON_ROOT, 3, "iss"},
    [C_AUD] = {PL_JSON_ROOT, 3, "aud"},
    [C_VER] = {PL_JSON_ROOT, 3, "ver"},
    [C_EXP] = {PL_JSON_ROOT, 3, "exp"},
    [C_NBF] = {PL_JSON_ROOT, 3, "nbf"},
    [C_IAT] = {PL_JSON_ROOT, 3, "iat"},
};

/* The JSON text of a decoded segment: jose decodes one with TextDecoder,
 * which drops a leading byte order mark, so this does too. */
static const char *segment_text(const unsigned char *p, size_t *n)
{
    if (*n >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0) {
        *n -= 3;
        return (const char *)p + 3;
    }
    return (const char *)p;
}

/* A segment decoded for the lenient reading. Most fit <room>, so that a
 * poll whose id has dots allocates nothing; a longer one goes to the heap. */
typedef struct {
    unsigned char *bytes;
    unsigned char room[PL_TOKEN_MAX / 4 * 3 + 4];
} segment;

static void segment_free(segment *g)
{
    if (g->bytes != g->room)
        pl_free(g->bytes);
}

/* Decodes the base64url segment <seg> leniently into <g> (the caller frees
 * it with segment_free(), whatever the answer) and reads the values of
 * <paths> into found[]. Returns 1 when it begins with a JSON object, as
 * JavaScript reads one. This reading asks what a segment claims to be, not
 * whether it is well made: what follows the object and repeated names are
 * the verifier's business (bad_header, bad_payload), and a repeated name
 * reads as its first value. */
static int read_lenient(const char *seg, size_t len, const pl_json_path *paths, size_t npaths,
                        pl_json_value *found, segment *g)
{
    size_t cap = len / 4 * 3 + 4, size;
    const char *text;
    pl_json_doc doc;
    long n;
    int rc;

    g->bytes = cap <= sizeof(g->room) ? g->room : pl_malloc(cap);
    if (g->bytes == NULL || (n = pl_token_b64url_decode(seg, len, g->bytes)) <= 0)
        return 0;
    size = (size_t)n;
    text = segment_text(g->bytes, &size);
    rc = pl_json_read(text, size, PL_JSON_PREFIX, paths, npaths, found, &doc);
    return (rc == 0 || rc == PL_JSON_EDUP) && doc.root.type == PL_JSON_OBJECT;
}

/* 1 when <seg> decodes to a JSON object whose "alg" is a non-empty string:
 * what makes a first segment a JWT header rather than part of an id. */
static int is_jwt_header(const char *seg, size_t len)
{
    pl_json_value found[H_PATHS];
    segment g;
    int yes = read_lenient(seg, len, header_paths, H_PATHS, found, &g) &&
              found[H_ALG].type == PL_JSON_STRING && found[H_ALG].len > 0;

    segment_free(&g);
    return yes;
}

/* 1 when <s> decodes as a JWT (see pl_token_is_jwt); *dep is then its
 * "deployment" claim, in <g> (the caller frees it with segment_free(),
 * whatever the answer). */
static int jwt_claim(const char *s, size_t len, pl_json_value *dep, segment *g)
{
    const char *dot1, *dot2;

    g->bytes = g->room;
    if (!jwt_shape(s, len, &dot1, &dot2) || !is_jwt_header(s, (size_t)(dot1 - s)))
        return 0;
    return read_lenient(dot1 + 1, (size_t)(dot2 - dot1 - 1), &claim_paths[C_DEPLOYMENT], 1, dep,
                        g);
}

int pl_token_is_jwt(const char *s, size_t len)
{
    pl_json_value dep;
    segment g;
    int yes = jwt_claim(s, len, &dep, &g);

    segment_free(&g);
    return yes;
}

long pl_token_deployment(const char *s, size_t len, char *out, size_t cap)
{
    pl_json_value dep;
    segment g;
    long n = -EINVAL;

    if (!jwt_claim(s, len, &dep, &g)) {
        segment_free(&g);
        return PL_TOKEN_NOT_JWT;
    }
    /* as text: a NUL would end the copy early and name another deployment */
    if (cap > 0)
        n = pl_json_string(&dep, out, cap - 1);
    segment_free(&g);
    if (n <= 0 || !pl_json_is_text(out, (size_t)n))
        return -EINVAL;
    out[n] = '\0';
    return n;
}

/* ---- the checks -------------------------------------------------------- */

/* Decodes the base64url segment <seg> strictly into a buffer of its exact
 * size (*bytes, freed by the caller whatever the answer), so a reader going
 * past it is caught by AddressSanitizer, and reads it as one JSON object
 * with nothing after it, no repeated name, and only strings a C string can
 * hold (JSON.parse would read \u0000 and lone surrogates; they are refused
 * here). Fills found[] for <paths>. Returns NULL, or "bad_base64",
 * "no_memory" or <bad_json>. */
static const char *read_strict(const char *seg, size_t len, const char *bad_json,
                               const pl_json_path *paths, size_t npaths, pl_json_value *found,
                               unsigned char **bytes)
{
    size_t size = len * 3 / 4;
    const char *text;
    pl_json_doc doc;
    int rc;

    *bytes = NULL;
    if (len % 4 == 1)
        return "bad_base64";
    if ((*bytes = pl_malloc(size)) == NULL)
        return "no_memory";
    if (b64url_decode(seg, len, *bytes, 1) != (long)size)
        return "bad_base64";
    text = segment_text(*bytes, &size);
    rc = pl_json_read(text, size, PL_JSON_TEXT, paths, npaths, found, &doc);
    if (rc == PL_JSON_ENOMEM)
        return "no_memory";
    return rc != 0 || doc.root.type != PL_JSON_OBJECT ? bad_json : NULL;
}

/* Returns NULL when the header allows HS256 verification, else a reason. */
static const char *check_header(const pl_json_value *h)
{
    if (!pl_json_equals(&h[H_ALG], "HS256", 5))
        return "bad_alg";
    /* We understand no extension, so any "crit" must be refused. */
    if (h[H_CRIT].type != PL_JSON_NONE)
        return "crit";
    if (h[H_TYP].type != PL_JSON_NONE && !pl_json_equals(&h[H_TYP], "JWT", 3))
        return "bad_typ";
    return NULL;
}

/* Whether <given> is the HMAC of the first <signed_len> bytes of <s> under
 * <key>, compared in constant time. */
static int mac_matches(const unsigned char *key, size_t key_len, const char *s,
                       size_t signed_len, const unsigned char *given)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;

    if (HMAC(EVP_sha256(), key, (int)key_len, (const unsigned char *)s, signed_len,
             mac, &mac_len) == NULL || mac_len != SIG_LEN)
        return 0;
    return CRYPTO_memcmp(given, mac, SIG_LEN) == 0;
}

/* Checks the signature segment <sig> over the first <signed_len> bytes of
 * <s> against the current secret, then the previous one; sets *previous
 * when the previous one signed it. Returns NULL when one matches, else a
 * reason. */
static const char *check_signature(const pl_token_verifier *v, const char *s,
                                   size_t signed_len, const char *sig, size_t sig_len,
                                   int *previous)
{
    unsigned char given[SIG_B64_MAX / 4 * 3];
    long n;

    if (sig_len > SIG_B64_MAX)
        return "bad_signature";
    n = b64url_decode(sig, sig_len, given, 1);
    if (n < 0)
        return "bad_base64";
    if (n != SIG_LEN) /* the length check before the constant-time compare */
        return "bad_signature";
    if (mac_matches(v->secret, v->secret_len, s, signed_len, given))
        return NULL;
    *previous = v->previous != NULL &&
                mac_matches(v->previous, v->previous_len, s, signed_len, given);
    return *previous ? NULL : "bad_signature";
}

/* 1 when "aud" is the audience, or an array holding it. */
static int audience_ok(const pl_json_value *aud)
{
    const char *cursor = NULL;
    pl_json_value item;

    while (pl_json_element(aud, &cursor, &item) == 1)
        if (pl_json_equals(&item, TOKEN_AUDIENCE, sizeof(TOKEN_AUDIENCE) - 1))
            return 1;
    return pl_json_equals(aud, TOKEN_AUDIENCE, sizeof(TOKEN_AUDIENCE) - 1);
}

/* Copies the string claim <v> into <dst> (PL_KEY_FIELD_MAX + 1 bytes).
 * Returns 0, or -EINVAL when it is not a string or does not fit. */
static int copy_claim(const pl_json_value *v, char *dst)
{
    long n = pl_json_string(v, dst, PL_KEY_FIELD_MAX);

    if (n < 0)
        return (int)n;
    dst[n] = '\0';
    return 0;
}

/* The time claims, as jose checks them: exp required here (Trigger.dev
 * always sets it), nbf and iat only when present. */
static const char *check_times(const pl_json_value *claims, double now, pl_token_claims *c)
{
    double exp, nbf, iat;

    if (pl_json_number(&claims[C_EXP], &exp) != 0 ||
        (claims[C_NBF].type != PL_JSON_NONE && pl_json_number(&claims[C_NBF], &nbf) != 0) ||
        (claims[C_IAT].type != PL_JSON_NONE && pl_json_number(&claims[C_IAT], &iat) != 0))
        return "bad_claim";
    if (!(exp > now))
        return "expired";
    if (claims[C_NBF].type != PL_JSON_NONE && nbf > now)
        return "not_yet_valid";
    c->exp = exp;
    return NULL;
}

/* Checks every claim Trigger.dev's schema requires and fills <c>. Returns
 * NULL when the claims are acceptable, else a reason. */
static const char *check_claims(const pl_json_value *claims, double now, pl_token_claims *c)
{
    double ver;

    if (!pl_json_equals(&claims[C_ISS], TOKEN_ISSUER, sizeof(TOKEN_ISSUER) - 1))
        return "bad_iss";
    if (!audience_ok(&claims[C_AUD]))
        return "bad_aud";
    if (pl_json_number(&claims[C_VER], &ver) != 0 || ver != TOKEN_VERSION)
        return "bad_ver";
    if (copy_claim(&claims[C_DEPLOYMENT], c->deployment) < 0 || c->deployment[0] == '\0' ||
        copy_claim(&claims[C_DEPLOYMENT_VERSION], c->deployment_version) < 0)
        return "bad_claim";
    for (int i = C_ENVIRONMENT_ID; i <= C_PROJECT_ID; i++)
        if (claims[i].type != PL_JSON_STRING)
            return "bad_claim";
    return check_times(claims, now, c);
}

/* Full verification of a token already split at its two dots. The payload
 * is read only once the signature matched, so the JSON reader sees
 * nothing but the header from an unauthenticated peer. */
static const char *verify_fresh(const pl_token_verifier *v, const char *s, size_t len,
                                const char *dot1, const char *dot2, double now,
                                pl_token_claims *c)
{
    pl_json_value header[H_PATHS], claims[C_PATHS];
    unsigned char *bytes;
    const char *why;

    why = read_strict(s, (size_t)(dot1 - s), "bad_header", header_paths, H_PATHS, header,
                      &bytes);
    if (why == NULL)
        why = check_header(header);
    pl_free(bytes);
    if (why == NULL)
        why = check_signature(v, s, (size_t)(dot2 - s), dot2 + 1,
                              len - (size_t)(dot2 + 1 - s), &c->previous);
    if (why != NULL)
        return why;
    why = read_strict(dot1 + 1, (size_t)(dot2 - dot1 - 1), "bad_payload", claim_paths, C_PATHS,
                      claims, &bytes);
    if (why == NULL)
        why = check_claims(claims, now, c);
    pl_free(bytes);
    return why;
}

/* ---- the cache --------------------------------------------------------- */

static void lru_unlink(pl_token_verifier *v, cache_entry *e)
{
    if (e->older != NULL)
        e->older->newer = e->newer;
    else
        v->oldest = e->newer;
    if (e->newer != NULL)
        e->newer->older = e->older;
    else
        v->newest = e->older;
    e->older = e->newer = NULL;
}

static void lru_append(pl_token_verifier *v, cache_entry *e)
{
    e->older = v->newest;
    e->newer = NULL;
    if (v->newest != NULL)
        v->newest->newer = e;
    else
        v->oldest = e;
    v->newest = e;
}

static void cache_drop(pl_token_verifier *v, cache_entry *e)
{
    HASH_DELETE(hh, v->cache, e);
    lru_unlink(v, e);
    OPENSSL_cleanse(e->token, e->len);
    pl_free(e);
    v->stats.entries--;
}

/* Returns the live cache entry for <s>, most recently used from now on, or
 * NULL. An entry found expired is dropped. */
static cache_entry *cache_find(pl_token_verifier *v, const char *s, size_t len, double now)
{
    cache_entry *e = NULL;

    HASH_FIND(hh, v->cache, s, (unsigned)len, e);
    if (e == NULL)
        return NULL;
    if (!(e->claims.exp > now)) {
        cache_drop(v, e);
        v->stats.evictions++;
        return NULL;
    }
    lru_unlink(v, e);
    lru_append(v, e);
    return e;
}

/* Remembers a verified token. Out of memory, it simply is not cached. */
static void cache_put(pl_token_verifier *v, const char *s, size_t len,
                      const pl_token_claims *c)
{
    cache_entry *e;

    if (v->stats.entries >= PL_TOKEN_CACHE_MAX) {
        cache_drop(v, v->oldest);
        v->stats.evictions++;
    }
    e = pl_malloc(sizeof(*e) + len);
    if (e == NULL)
        return;
    memset(e, 0, sizeof(*e));
    e->claims = *c;
    e->len = len;
    memcpy(e->token, s, len);
    cache_oom = 0;
    HASH_ADD_KEYPTR(hh, v->cache, e->token, (unsigned)len, e);
    if (cache_oom) {
        pl_free(e);
        return;
    }
    lru_append(v, e);
    v->stats.entries++;
}

/* ---- the verifier ------------------------------------------------------ */

pl_token_verifier *pl_token_verifier_new(const unsigned char *secret, size_t len)
{
    pl_token_verifier *v;

    if (len == 0 || len > INT_MAX)
        return NULL;
    v = pl_malloc(sizeof(*v));
    if (v == NULL)
        return NULL;
    memset(v, 0, sizeof(*v));
    v->secret = pl_malloc(len);
    if (v->secret == NULL) {
        pl_free(v);
        return NULL;
    }
    memcpy(v->secret, secret, len);
    v->secret_len = len;
    return v;
}

void pl_token_verifier_free(pl_token_verifier *v)
{
    if (v == NULL)
        return;
    while (v->oldest != NULL)
        cache_drop(v, v->oldest);
    OPENSSL_cleanse(v->secret, v->secret_len);
    pl_free(v->secret);
    if (v->previous != NULL)
        OPENSSL_cleanse(v->previous, v->previous_len);
    pl_free(v->previous);
    pl_free(v);
}

int pl_token_verifier_set_previous(pl_token_verifier *v, const unsigned char *secret,
                                   size_t len)
{
    if (len == 0 || len > INT_MAX || v->previous != NULL)
        return -EINVAL;
    v->previous = pl_malloc(len);
    if (v->previous == NULL)
        return -ENOMEM;
    memcpy(v->previous, secret, len);
    v->previous_len = len;
    return 0;
}

void pl_token_verifier_stats(const pl_token_verifier *v, pl_token_stats *out)
{
    *out = v->stats;
}

static pl_token_result outcome(pl_token_result r, const char *reason, const char **why)
{
    if (why != NULL)
        *why = reason;
    return r;
}

pl_token_result pl_token_verify(pl_token_verifier *v, const char *s, size_t len,
                                double now_seconds, pl_token_claims *out,
                                const char **why)
{
    const char *dot1, *dot2, *reason;
    cache_entry *e;
    pl_token_claims c;

    if (len == 0)
        return outcome(PL_TOKEN_ABSENT, "absent", why);
    dot1 = memchr(s, '.', len);
    dot2 = dot1 ? memchr(dot1 + 1, '.', len - (size_t)(dot1 + 1 - s)) : NULL;
    if (dot2 == NULL)
        return outcome(PL_TOKEN_LEGACY, "legacy", why);
    if ((e = cache_find(v, s, len, now_seconds)) != NULL) {
        v->stats.hits++;
        *out = e->claims;
        return outcome(PL_TOKEN_VALID, "valid", why);
    }
    /* Ids are opaque: dots alone do not make a token, a JWT header does. */
    if (!is_jwt_header(s, (size_t)(dot1 - s)))
        return outcome(PL_TOKEN_LEGACY, "legacy", why);
    if (len > PL_TOKEN_MAX)
        return outcome(PL_TOKEN_INVALID, "too_long", why);
    if (dot1 == s || dot2 == dot1 + 1 || dot2 + 1 == s + len ||
        memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - s)) != NULL)
        return outcome(PL_TOKEN_INVALID, "malformed", why);
    memset(&c, 0, sizeof(c));
    reason = verify_fresh(v, s, len, dot1, dot2, now_seconds, &c);
    if (reason != NULL)
        return outcome(PL_TOKEN_INVALID, reason, why);
    cache_put(v, s, len, &c);
    *out = c;
    return outcome(PL_TOKEN_VALID, "valid", why);
}
