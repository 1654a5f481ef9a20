/* fuzz_token.c -- libFuzzer target for the deployment token verifier.
 *
 * The first input byte picks a mode, the rest is the data:
 *   even: the data is a header value, verified as is (and also read by the
 *         broker's pre-verification helpers, which see untrusted input too);
 *   1 mod 4: the data is "HEADER-JSON\0PAYLOAD-JSON" (or just the payload
 *         JSON, under {"alg":"HS256"}): both are base64url-encoded and
 *         signed with the fuzzer's secret, so the claim checks are reached;
 *   3 mod 4: the data is "segment.segment" text, signed as is, so the
 *         strict base64url and JSON decoding behind a good signature is.
 * Each input gets a fresh verifier and is verified twice: the second answer
 * (from the cache when valid) must equal the first.
 *
 * Build (from the repository root):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude \
 *     tests/fuzz/fuzz_token.c src/token.c src/json.c src/mem.c src/key.c \
 *     src/hash.c src/pool.c src/invariant.c -lcrypto -lm -o fuzz_token
 *   ./fuzz_token -dict=tests/fuzz/token.dict tests/fuzz/corpus/token */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "pilotlight/token.h"

#include "../unit/mint.h" /* b64url */

#define SECRET "fuzz-secret"
#define NOW 1750000000.0
#define MAX_IN (PL_TOKEN_MAX + 64)

/* Appends ".<HMAC of out[0..n)>" to <out>; returns the new length. */
static size_t sign(char *out, size_t n)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;

    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (unsigned char *)out, n, mac, &mac_len);
    out[n++] = '.';
    return n + b64url(mac, mac_len, out + n);
}

/* Builds a signed token from JSON texts in <data>; returns its length. */
static size_t from_json(const uint8_t *data, size_t size, char *out)
{
    static const char def[] = "{\"alg\":\"HS256\"}";
    const uint8_t *nul = memchr(data, 0, size);
    const uint8_t *hdr = (const uint8_t *)def, *pay = data;
    size_t hlen = sizeof(def) - 1, plen = size, n;

    if (nul != NULL) {
        hdr = data;
        hlen = (size_t)(nul - data);
        pay = nul + 1;
        plen = size - hlen - 1;
    }
    n = b64url(hdr, hlen, out);
    out[n++] = '.';
    n += b64url(pay, plen, out + n);
    return sign(out, n);
}

static void check(const char *tok, size_t len)
{
    pl_token_verifier *v = pl_token_verifier_new((const unsigned char *)SECRET, strlen(SECRET));
    pl_token_claims a, b;
    const char *why1 = NULL, *why2 = NULL;
    pl_token_result r1, r2;

    if (v == NULL)
        abort();
    r1 = pl_token_verify(v, len ? tok : NULL, len, NOW, &a, &why1);
    r2 = pl_token_verify(v, len ? tok : NULL, len, NOW, &b, &why2);
    if (why1 == NULL || why2 == NULL || r1 != r2 || strcmp(why1, why2) != 0)
        abort();
    if (r1 == PL_TOKEN_VALID) {
        pl_token_stats st;
        pl_token_verifier_stats(v, &st);
        if (memcmp(&a, &b, sizeof(a)) != 0 || st.hits != 1 || a.deployment[0] == '\0' ||
            strlen(a.deployment) > PL_KEY_FIELD_MAX || !(a.exp > NOW))
            abort();
        /* Past its expiry, a cached token is no longer valid. */
        if (pl_token_verify(v, tok, len, a.exp, &b, NULL) != PL_TOKEN_INVALID)
            abort();
    }
    pl_token_verifier_free(v);
}

/* Checks <len> bytes of <src> from an exact-size heap copy, so any read
 * past the value is caught; <helpers> also runs the broker's readers. */
static void check_copy(const char *src, size_t len, int helpers)
{
    char *tok = malloc(len ? len : 1);

    if (tok == NULL)
        return;
    memcpy(tok, src, len);
    check(tok, len);
    if (helpers) {
        char dep[PL_KEY_FIELD_MAX + 1];
        long n = pl_token_deployment(tok, len, dep, sizeof(dep));

        /* The two readers agree on what is a token and what a bare id, and
         * a value the verifier calls a bare id is never read as a token. */
        if ((n != PL_TOKEN_NOT_JWT) != pl_token_is_jwt(tok, len) ||
            (n >= 0 && (size_t)n != strlen(dep)))
            abort();
        if (n != PL_TOKEN_NOT_JWT && len <= PL_TOKEN_MAX) {
            pl_token_verifier *v = pl_token_verifier_new((const unsigned char *)"k", 1);
            pl_token_claims c;

            if (v != NULL && pl_token_verify(v, tok, len, NOW, &c, NULL) == PL_TOKEN_LEGACY)
                abort();
            pl_token_verifier_free(v);
        }
    }
    free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char buf[4 * MAX_IN + 128];

    if (size < 1 || size > MAX_IN)
        return 0;
    switch (data[0] & 3) {
    case 1:
        check_copy(buf, from_json(data + 1, size - 1, buf), 0);
        break;
    case 3:
        memcpy(buf, data + 1, size - 1);
        check_copy(buf, sign(buf, size - 1), 0);
        break;
    default:
        check_copy((const char *)data + 1, size - 1, 1);
        break;
    }
    return 0;
}
