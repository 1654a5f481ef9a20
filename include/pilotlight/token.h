/* token.h -- deployment tokens: a JWT in the x-trigger-deployment-id header.
 *
 * Two layers. pl_token_deployment() reads a token's claim without checking
 * anything (the broker's pre-verification path). pl_token_verify() is the
 * verifier: an HS256 signature checked with libcrypto, then the header and
 * claims exactly as Trigger.dev mints them (docs/protocol.md, "Deployment
 * tokens"), with verified tokens cached until they expire. */
#ifndef PILOTLIGHT_TOKEN_H
#define PILOTLIGHT_TOKEN_H

#include <errno.h>
#include <stddef.h>

#include "pilotlight/key.h"

/* Longest token pl_token_verify() looks at, in bytes; longer is invalid.
 * Trigger.dev's tokens are about 400 bytes. */
#define PL_TOKEN_MAX 4096
/* Verified tokens remembered per verifier; the least recently used one is
 * dropped to make room. */
#define PL_TOKEN_CACHE_MAX 1024

/* Returns 1 when <s> decodes as a JWT: three non-empty base64url segments
 * joined by dots, the first beginning with a JSON object (as JSON.parse
 * reads one, json.h) whose "alg" is a non-empty string (the JOSE header),
 * the second beginning with a JSON object. Bytes after either object and
 * repeated names do not change the answer (the verifier refuses them).
 * Anything else, dots or not, is a bare deployment id: ids are opaque
 * strings. Checks no signature. */
int pl_token_is_jwt(const char *s, size_t len);

/* Decodes base64url (no padding) <in> into <out> (room for len*3/4+3 bytes).
 * Returns the decoded length, or -EINVAL on a character outside the
 * alphabet or an impossible length. Lenient about unused trailing bits; the verifier
 * uses a strict decoder of its own. */
long pl_token_b64url_decode(const char *in, size_t len, unsigned char *out);

/* pl_token_deployment() of a value that is not a JWT: no token here, the
 * value is a bare id. */
#define PL_TOKEN_NOT_JWT (-ENOENT)

/* For a value that decodes as a JWT (pl_token_is_jwt), copies the payload's
 * "deployment" claim, decoded, into <out> (<cap> bytes, NUL-terminated; a
 * repeated claim reads as its first value). Returns its length; -EINVAL
 * when the JWT has no non-empty string "deployment" claim that fits and
 * holds no NUL or lone surrogate; PL_TOKEN_NOT_JWT when <s> is a bare id. Checks no
 * signature: use pl_token_verify() for that. */
long pl_token_deployment(const char *s, size_t len, char *out, size_t cap);

typedef enum {
    PL_TOKEN_VALID,   /* signature and claims check out; claims filled */
    PL_TOKEN_INVALID, /* has a JWT header (so claims to be a token) but fails */
    PL_TOKEN_LEGACY,  /* a bare deployment id: no JWT header (a base64url
                         JSON object with a string "alg") before two dots */
    PL_TOKEN_ABSENT,  /* empty value */
    PL_TOKEN_UNCHECKED, /* not verified: no verifier (pl_poll_key) */
} pl_token_result;

typedef struct pl_token_verifier pl_token_verifier;

/* What a valid token says. Strings are NUL-terminated; deployment is never
 * empty, deployment_version may be (Trigger.dev's schema allows it). */
typedef struct {
    char deployment[PL_KEY_FIELD_MAX + 1];
    char deployment_version[PL_KEY_FIELD_MAX + 1];
    double exp; /* expiry, seconds since the epoch, maybe fractional */
    int previous; /* signed with the previous secret (a rotation) */
} pl_token_claims;

/* Cache counters, for metrics and tests. */
typedef struct {
    size_t entries;          /* tokens cached now */
    unsigned long hits;      /* verifications answered from the cache */
    unsigned long evictions; /* entries dropped for room or expiry */
} pl_token_stats;

/* Creates a verifier for the HMAC key <secret> (<len> bytes, copied: the
 * caller may wipe its own copy). Trigger.dev keys HMAC with the UTF-8 bytes
 * of its secret string, so pass exactly those bytes (no trailing newline).
 * Returns NULL when out of memory or when <len> is 0 (an empty key would
 * let anyone sign). Not thread-safe: one verifier per event loop. */
pl_token_verifier *pl_token_verifier_new(const unsigned char *secret, size_t len);

/* Also accepts tokens signed with <secret> (<len> bytes, copied), the secret
 * being retired during a rotation: the current one is tried first. Once per
 * verifier. Returns 0, -ENOMEM, or -EINVAL when <len> is 0 or one is set. */
int pl_token_verifier_set_previous(pl_token_verifier *v, const unsigned char *secret,
                                   size_t len);

/* Wipes the secret (OPENSSL_cleanse), frees the cache and <v>. NULL is a
 * no-op. */
void pl_token_verifier_free(pl_token_verifier *v);

/* Classifies and, for a token, verifies the header value <s> (<len> bytes,
 * need not be NUL-terminated; NULL allowed when len is 0) at time
 * <now_seconds> (seconds since the epoch). On PL_TOKEN_VALID fills <out>;
 * otherwise leaves it alone. <why> (may be NULL) receives a static string
 * naming the outcome, fit for logs and metric labels:
 *   valid, absent, legacy,
 *   too_long, malformed (segment count or an empty segment), bad_base64,
 *   bad_header (not one JSON object, read by json.h with nothing after it,
 *   without repeated names, \u0000 or lone surrogates; a leading byte order
 *   mark is dropped, as jose's TextDecoder drops it), bad_alg (not "HS256"),
 *   bad_typ (typ present and not "JWT"), crit, bad_signature,
 *   bad_payload (as bad_header), bad_iss, bad_aud,
 *   bad_ver, bad_claim (a required claim missing or of the wrong type, or
 *   too long), expired, not_yet_valid (nbf in the future), no_memory (a
 *   decode buffer; one that fails while the first segment is classified
 *   reads as legacy).
 * A valid token is cached (keyed by its exact bytes) until its exp, so a
 * repeated poll skips HMAC and JSON. Returns the classification. */
pl_token_result pl_token_verify(pl_token_verifier *v, const char *s, size_t len,
                                double now_seconds, pl_token_claims *out,
                                const char **why);

/* Copies <v>'s cache counters into <out>. */
void pl_token_verifier_stats(const pl_token_verifier *v, pl_token_stats *out);

#endif
