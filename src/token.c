/* token.c -- reading and verifying deployment tokens (HS256 JWTs). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "pilotlight/hash.h"
#include "pilotlight/mem.h"
#include "pilotlight/token.h"
#include "pilotlight/utf8.h"

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
    return -1;
}

/* Decodes <in> into <out> (len*3/4+3 bytes). With <strict>, the unused
 * bits of the last character must be zero, so that every byte string has
 * exactly one encoding. Returns the decoded length or -1. */
static long b64url_decode(const char *in, size_t len, unsigned char *out, int strict)
{
    unsigned long acc = 0;
    int bits = 0;
    long n = 0;

    if (len % 4 == 1)
        return -1;
    for (size_t i = 0; i < len; i++) {
        int v = b64url_value((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (unsigned long)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1UL << bits) - 1;
        }
    }
    if (strict && acc != 0)
        return -1;
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

/* Decodes the base64url segment <seg> leniently and parses it as JSON.
 * Returns the value when it is an object (caller deletes it), else NULL. */
static cJSON *lenient_object(const char *seg, size_t len)
{
    unsigned char *json = pl_malloc(len * 3 / 4 + 4);
    cJSON *obj = NULL;
    long n;

    if (json == NULL)
        return NULL;
    n = pl_token_b64url_decode(seg, len, json);
    if (n > 0)
        obj = cJSON_ParseWithLength((const char *)json, (size_t)n);
    pl_free(json);
    if (obj != NULL && !cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        obj = NULL;
    }
    return obj;
}

/* 1 when <seg> decodes to a JSON object whose "alg" is a non-empty string:
 * what makes a first segment a JWT header rather than part of an id. */
static int is_jwt_header(const char *seg, size_t len)
{
    cJSON *hdr = lenient_object(seg, len);
    const cJSON *alg = cJSON_GetObjectItemCaseSensitive(hdr, "alg");
    int yes = cJSON_IsString(alg) && alg->valuestring[0] != '\0';

    cJSON_Delete(hdr);
    return yes;
}

/* The payload object of <s> when <s> decodes as a JWT (see pl_token_is_jwt),
 * else NULL. The caller deletes it. */
static cJSON *jwt_payload(const char *s, size_t len)
{
    const char *dot1, *dot2;

    if (!jwt_shape(s, len, &dot1, &dot2) || !is_jwt_header(s, (size_t)(dot1 - s)))
        return NULL;
    return lenient_object(dot1 + 1, (size_t)(dot2 - dot1 - 1));
}

int pl_token_is_jwt(const char *s, size_t len)
{
    cJSON *payload = jwt_payload(s, len);
    int yes = payload != NULL;

    cJSON_Delete(payload);
    return yes;
}

long pl_token_deployment(const char *s, size_t len, char *out, size_t cap)
{
    cJSON *payload = jwt_payload(s, len);
    const cJSON *dep = cJSON_GetObjectItemCaseSensitive(payload, "deployment");
    long rc = -1;

    if (payload == NULL)
        return PL_TOKEN_NOT_JWT;
    if (cJSON_IsString(dep) && dep->valuestring[0] != '\0' &&
        strlen(dep->valuestring) < cap) {
        rc = (long)strlen(dep->valuestring);
        memcpy(out, dep->valuestring, (size_t)rc + 1);
    }
    cJSON_Delete(payload);
    return rc;
}

/* ---- strict JSON objects ----------------------------------------------- */

/* 1 when the JSON text <p> could mean one thing only, to cJSON and to
 * JavaScript alike: well-formed UTF-8 (JavaScript would turn bad bytes into
 * U+FFFD), no raw control characters but JSON whitespace, and no \u0000
 * (which would end a C string early). A backslash occurs only inside
 * strings in valid JSON, and invalid JSON fails to parse anyway. */
static int json_text_ok(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t step = pl_utf8_len(p + i, n - i);

        if (step == 0)
            return 0;
        if (p[i] < 0x20 && p[i] != '\t' && p[i] != '\n' && p[i] != '\r')
            return 0;
        if (p[i] == '\\') {
            if (n - i >= 6 && memcmp(p + i + 1, "u0000", 5) == 0)
                return 0;
            step = 2; /* the escaped character is never a backslash escape */
        }
        i += step;
    }
    return 1;
}

/* 1 when an object anywhere under <node> repeats a member name. cJSON keeps
 * both members where JavaScript keeps the last, so a repeat would let the
 * two readers disagree. */
static int has_duplicate_keys(const cJSON *node)
{
    for (const cJSON *c = node->child; c != NULL; c = c->next) {
        if (cJSON_IsObject(node)) {
            for (const cJSON *d = c->next; d != NULL; d = d->next)
                if (strcmp(c->string, d->string) == 0)
                    return 1;
        }
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) && has_duplicate_keys(c))
            return 1;
    }
    return 0;
}

/* Decodes the base64url segment <seg> and parses it as one JSON object with
 * nothing after it. The decoded bytes get a buffer of their exact size, so
 * a parser reading past them is caught by AddressSanitizer. Returns the
 * object (caller deletes it), or NULL with *why set to "bad_base64",
 * "no_memory" or <bad_json>. */
static cJSON *decode_object(const char *seg, size_t len, const char *bad_json,
                            const char **why)
{
    size_t size = len * 3 / 4, n;
    unsigned char *buf;
    const char *end = NULL;
    cJSON *obj = NULL;

    if (len % 4 == 1 || (buf = pl_malloc(size)) == NULL) {
        *why = len % 4 == 1 ? "bad_base64" : "no_memory";
        return NULL;
    }
    *why = "bad_base64";
    if (b64url_decode(seg, len, buf, 1) != (long)size)
        goto out;
    n = size;
    *why = bad_json;
    if (!json_text_ok(buf, n))
        goto out;
    obj = cJSON_ParseWithLengthOpts((const char *)buf, n, &end, 0);
    if (obj == NULL)
        goto out;
    while (end < (const char *)buf + n && (*end == ' ' || *end == '\t' ||
                                           *end == '\n' || *end == '\r'))
        end++;
    if (!cJSON_IsObject(obj) || end != (const char *)buf + n ||
        has_duplicate_keys(obj)) {
        cJSON_Delete(obj);
        obj = NULL;
    }
out:
    pl_free(buf);
    return obj;
}

/* ---- the checks -------------------------------------------------------- */

static int is_string(const cJSON *item, const char *want)
{
    return cJSON_IsString(item) && strcmp(item->valuestring, want) == 0;
}

/* Returns NULL when the header allows HS256 verification, else a reason. */
static const char *check_header(const cJSON *hdr)
{
    const cJSON *typ = cJSON_GetObjectItemCaseSensitive(hdr, "typ");

    if (!is_string(cJSON_GetObjectItemCaseSensitive(hdr, "alg"), "HS256"))
        return "bad_alg";
    /* We understand no extension, so any "crit" must be refused. */
    if (cJSON_GetObjectItemCaseSensitive(hdr, "crit") != NULL)
        return "crit";
    if (typ != NULL && !is_string(typ, "JWT"))
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
static int audience_ok(const cJSON *aud)
{
    const cJSON *item;

    if (cJSON_IsString(aud))
        return strcmp(aud->valuestring, TOKEN_AUDIENCE) == 0;
    if (!cJSON_IsArray(aud))
        return 0;
    cJSON_ArrayForEach(item, aud)
        if (is_string(item, TOKEN_AUDIENCE))
            return 1;
    return 0;
}

static int is_finite_number(const cJSON *item)
{
    return cJSON_IsNumber(item) && isfinite(item->valuedouble);
}

/* Copies the string claim <name> into <dst> (PL_KEY_FIELD_MAX + 1 bytes).
 * Returns 0, or -1 when it is not a string or does not fit. */
static int copy_claim(const cJSON *payload, const char *name, char *dst)
{
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(payload, name);
    size_t n;

    if (!cJSON_IsString(item))
        return -1;
    n = strlen(item->valuestring);
    if (n > PL_KEY_FIELD_MAX)
        return -1;
    memcpy(dst, item->valuestring, n + 1);
    return 0;
}

/* The time claims, as jose checks them: exp required here (Trigger.dev
 * always sets it), nbf and iat only when present. */
static const char *check_times(const cJSON *payload, double now, pl_token_claims *c)
{
    const cJSON *exp = cJSON_GetObjectItemCaseSensitive(payload, "exp");
    const cJSON *nbf = cJSON_GetObjectItemCaseSensitive(payload, "nbf");
    const cJSON *iat = cJSON_GetObjectItemCaseSensitive(payload, "iat");

    if (!is_finite_number(exp) || (nbf != NULL && !is_finite_number(nbf)) ||
        (iat != NULL && !is_finite_number(iat)))
        return "bad_claim";
    if (!(exp->valuedouble > now))
        return "expired";
    if (nbf != NULL && nbf->valuedouble > now)
        return "not_yet_valid";
    c->exp = exp->valuedouble;
    return NULL;
}

/* Checks every claim Trigger.dev's schema requires and fills <c>. Returns
 * NULL when the claims are acceptable, else a reason. */
static const char *check_claims(const cJSON *payload, double now, pl_token_claims *c)
{
    static const char *const others[] = {"environment_id", "environment_type",
                                         "org_id", "project_id"};
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(payload, "ver");

    if (!is_string(cJSON_GetObjectItemCaseSensitive(payload, "iss"), TOKEN_ISSUER))
        return "bad_iss";
    if (!audience_ok(cJSON_GetObjectItemCaseSensitive(payload, "aud")))
        return "bad_aud";
    if (!cJSON_IsNumber(ver) || ver->valuedouble != TOKEN_VERSION)
        return "bad_ver";
    if (copy_claim(payload, "deployment", c->deployment) < 0 ||
        c->deployment[0] == '\0' ||
        copy_claim(payload, "deployment_version", c->deployment_version) < 0)
        return "bad_claim";
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(payload, others[i])))
            return "bad_claim";
    return check_times(payload, now, c);
}

/* Full verification of a token already split at its two dots. The payload
 * is parsed only once the signature matched, so the JSON parser sees
 * nothing but the header from an unauthenticated peer. */
static const char *verify_fresh(const pl_token_verifier *v, const char *s, size_t len,
                                const char *dot1, const char *dot2, double now,
                                pl_token_claims *c)
{
    const char *why = NULL;
    cJSON *obj;

    obj = decode_object(s, (size_t)(dot1 - s), "bad_header", &why);
    if (obj == NULL)
        return why;
    why = check_header(obj);
    cJSON_Delete(obj);
    if (why == NULL)
        why = check_signature(v, s, (size_t)(dot2 - s), dot2 + 1,
                              len - (size_t)(dot2 + 1 - s), &c->previous);
    if (why != NULL)
        return why;
    obj = decode_object(dot1 + 1, (size_t)(dot2 - dot1 - 1), "bad_payload", &why);
    if (obj == NULL)
        return why;
    why = check_claims(obj, now, c);
    cJSON_Delete(obj);
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
        return -1;
    v->previous = pl_malloc(len);
    if (v->previous == NULL)
        return -1;
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
