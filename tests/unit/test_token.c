/* test_token.c -- the deployment token verifier: valid tokens, every forgery,
 * the cache, out-of-memory paths.
 *
 * Without arguments it runs the unit tests, minting tokens itself with
 * libcrypto. With `--vectors FILE` it instead checks the verifier against
 * vectors minted by the real jose library (tests/token/mint.mjs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/token.h"
#include "mint.h"
#include "unit.h"

#define SECRET "test-secret-0123456789abcdef"
#define NOW 1750000000.0
#define HEADER "{\"alg\":\"HS256\"}"
/* Claims in the order Trigger.dev's mint produces them, with a placeholder
 * for the expiry. */
#define CLAIMS_BEFORE_EXP                                                     \
    "\"ver\":1,\"deployment\":\"deployment_abc123\","                        \
    "\"deployment_version\":\"20250101.1\",\"environment_id\":\"env_1\","     \
    "\"environment_type\":\"PRODUCTION\",\"org_id\":\"org_1\","               \
    "\"project_id\":\"proj_1\",\"iss\":\"https://id.trigger.dev\","           \
    "\"aud\":\"https://api.trigger.dev\""
#define PAYLOAD "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600}"
#define ISS "\"iss\":\"https://id.trigger.dev\""
#define AUD "\"aud\":\"https://api.trigger.dev\""

/* ---- minting ----------------------------------------------------------- */

static char tok[8192];

/* Replaces the signature of the token <t> (at least two segments) with a
 * valid one over its first two segments as they now are. */
static void resign(char *t)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    char *dot = strchr(strchr(t, '.') + 1, '.');
    size_t n = dot ? (size_t)(dot - t) : strlen(t);

    HMAC(EVP_sha256(), SECRET, (int)strlen(SECRET), (unsigned char *)t, n, mac, &mac_len);
    t[n] = '.';
    b64url(mac, mac_len, t + n + 1);
}

static const char *mint(const char *header, const char *payload)
{
    mint_with(EVP_sha256(), SECRET, header, payload, tok);
    return tok;
}

/* ---- verifying --------------------------------------------------------- */

static pl_token_verifier *ver;
static pl_token_claims claims;
static const char *why;

/* Verifies <s> from an exact-size heap copy (no NUL after it), so reading
 * past the value is caught by AddressSanitizer. */
static pl_token_result verify_at(const char *s, double now)
{
    size_t n = strlen(s);
    char *copy = malloc(n ? n : 1);
    pl_token_result r;

    memcpy(copy, s, n);
    why = NULL;
    r = pl_token_verify(ver, n ? copy : NULL, n, now, &claims, &why);
    free(copy);
    return r;
}

static pl_token_result verify(const char *s)
{
    return verify_at(s, NOW);
}

/* Checks that <s> is invalid for reason <reason>. */
/* A value without a JWT header is a bare id, dots or not. */
#define CHECK_LEGACY(s)                                                       \
    do {                                                                      \
        CHECK_EQ(verify(s), PL_TOKEN_LEGACY);                                 \
        CHECK_STR(why, "legacy");                                             \
    } while (0)

#define CHECK_INVALID(s, reason)                                              \
    do {                                                                      \
        CHECK_EQ(verify(s), PL_TOKEN_INVALID);                                \
        CHECK_STR(why, reason);                                               \
    } while (0)

/* Mints the standard header with <payload> and expects <reason>. */
#define CHECK_PAYLOAD_INVALID(payload, reason) CHECK_INVALID(mint(HEADER, payload), reason)

static void fresh_verifier(void)
{
    pl_token_verifier_free(ver);
    ver = pl_token_verifier_new((const unsigned char *)SECRET, strlen(SECRET));
    CHECK(ver != NULL);
}

/* ---- tests ------------------------------------------------------------- */

static void test_valid_token(void)
{
    fresh_verifier();
    memset(&claims, 0, sizeof(claims));
    CHECK_EQ(verify(mint(HEADER, PAYLOAD)), PL_TOKEN_VALID);
    CHECK_STR(why, "valid");
    CHECK_STR(claims.deployment, "deployment_abc123");
    CHECK_STR(claims.deployment_version, "20250101.1");
    CHECK(claims.exp == 1750003600.0);
    /* typ "JWT", extra header fields and extra claims are allowed. */
    CHECK_EQ(verify(mint("{\"alg\":\"HS256\",\"typ\":\"JWT\",\"kid\":\"k1\"}", PAYLOAD)),
             PL_TOKEN_VALID);
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                                 "\"extra\":{\"a\":[1,2]},\"iat\":1}")),
             PL_TOKEN_VALID);
    /* JSON whitespace around and inside, as JSON.parse accepts it. */
    CHECK_EQ(verify(mint(" { \"alg\" : \"HS256\" }\n", "\t" PAYLOAD "\r\n ")), PL_TOKEN_VALID);
    /* Escapes mean what they mean to JavaScript. */
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                                 "\"deploym\\u0065nt\":\"x\"}")),
             PL_TOKEN_INVALID);
    CHECK_STR(why, "bad_payload"); /* a duplicate once unescaped */
}

static void test_legacy_and_absent(void)
{
    fresh_verifier();
    CHECK_EQ(verify("deployment_abc123"), PL_TOKEN_LEGACY);
    CHECK_STR(why, "legacy");
    CHECK_EQ(verify("a.b"), PL_TOKEN_LEGACY);
    CHECK_EQ(verify("."), PL_TOKEN_LEGACY);
    CHECK_EQ(verify(""), PL_TOKEN_ABSENT);
    CHECK_STR(why, "absent");
    CHECK_EQ(pl_token_verify(ver, NULL, 0, NOW, &claims, NULL), PL_TOKEN_ABSENT);
}

static void test_signature_forgeries(void)
{
    char t[8192];
    char *sig;

    fresh_verifier();
    strcpy(t, mint(HEADER, PAYLOAD));
    sig = strrchr(t, '.') + 1;
    sig[0] = sig[0] == 'A' ? 'B' : 'A';
    CHECK_INVALID(t, "bad_signature");
    /* Signed with another secret. */
    mint_with(EVP_sha256(), "another-secret", HEADER, PAYLOAD, t);
    CHECK_INVALID(t, "bad_signature");
    /* Signatures of the wrong length (canonical base64url: 31, 35 and 48
     * bytes), and one too long to be decoded at all. */
    static const char *const lengths[] = {
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
    };
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        strcpy(t, mint(HEADER, PAYLOAD));
        strcpy(strrchr(t, '.') + 1, lengths[i]);
        CHECK_INVALID(t, "bad_signature");
    }
    /* Cut by one character: 42 characters whose last one has unused bits
     * set is not canonical; either way it is refused. */
    strcpy(t, mint(HEADER, PAYLOAD));
    t[strlen(t) - 1] = '\0';
    CHECK_EQ(verify(t), PL_TOKEN_INVALID);
    /* The payload changed after signing. */
    strcpy(t, mint(HEADER, PAYLOAD));
    sig = strchr(t, '.') + 1;
    sig[2] = sig[2] == 'A' ? 'B' : 'A';
    CHECK_INVALID(t, "bad_signature");
}

static void test_header_forgeries(void)
{
    char t[8192];

    fresh_verifier();
    /* alg none as jose's UnsecuredJWT writes it: an empty signature. */
    mint_with(EVP_sha256(), SECRET, "{\"alg\":\"none\"}", PAYLOAD, t);
    strcpy(strrchr(t, '.') + 1, "");
    CHECK_INVALID(t, "malformed");
    CHECK_INVALID(mint("{\"alg\":\"none\"}", PAYLOAD), "bad_alg");
    mint_with(EVP_sha512(), SECRET, "{\"alg\":\"HS512\"}", PAYLOAD, t);
    CHECK_INVALID(t, "bad_alg");
    mint_with(EVP_sha256(), SECRET, "{\"alg\":\"HS512\"}", PAYLOAD, t);
    CHECK_INVALID(t, "bad_alg");
    CHECK_LEGACY(mint("{\"typ\":\"JWT\"}", PAYLOAD)); /* no alg: not a JWT header */
    CHECK_INVALID(mint("{\"alg\":\"hs256\"}", PAYLOAD), "bad_alg");
    CHECK_INVALID(mint("{\"alg\":\"HS256 \"}", PAYLOAD), "bad_alg");
    CHECK_LEGACY(mint("{\"alg\":[\"HS256\"]}", PAYLOAD));
    CHECK_LEGACY(mint("{\"ALG\":\"HS256\"}", PAYLOAD));
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"crit\":[\"exp\"]}", PAYLOAD), "crit");
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"crit\":[]}", PAYLOAD), "crit");
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"typ\":\"JOSE\"}", PAYLOAD), "bad_typ");
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"typ\":1}", PAYLOAD), "bad_typ");
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"alg\":\"HS256\"}", PAYLOAD), "bad_header");
    CHECK_INVALID(mint("{\"alg\":\"none\",\"alg\":\"HS256\"}", PAYLOAD), "bad_header");
    CHECK_LEGACY(mint("[\"HS256\"]", PAYLOAD));
    CHECK_LEGACY(mint("\"HS256\"", PAYLOAD));
    CHECK_LEGACY(mint("{\"alg\":\"HS256\"", PAYLOAD));
    CHECK_INVALID(mint("{\"alg\":\"HS256\"}x", PAYLOAD), "bad_header");
    CHECK_INVALID(mint("{\"alg\":\"HS256\"}{}", PAYLOAD), "bad_header");
    CHECK_LEGACY(mint("", PAYLOAD));
    /* JSON as JSON.parse reads it makes a header, then refused for holding
     * what no C string carries; what is not JSON is no header at all. */
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"x\":\"\\ud800\"}", PAYLOAD), "bad_header");
    CHECK_INVALID(mint("{\"alg\":\"HS256\",\"x\":\"\\u0000\"}", PAYLOAD), "bad_header");
    CHECK_INVALID(mint("{\"alg\":\"\\u0000\"}", PAYLOAD), "bad_header");
    CHECK_LEGACY(mint("{\"alg\":\"HS256\",\"x\":\"\x01\"}", PAYLOAD));
    CHECK_LEGACY(mint("{\"alg\":\"HS256\",\"x\":01}", PAYLOAD));
    CHECK_LEGACY(mint("\x0b{\"alg\":\"HS256\"}", PAYLOAD));
    /* A byte order mark is dropped before the JSON text, as jose does. */
    CHECK_EQ(verify(mint("\xef\xbb\xbf{\"alg\":\"HS256\"}", PAYLOAD)), PL_TOKEN_VALID);
}

static void test_issuer_audience_version(void)
{
    static const char *const base =
        "\"deployment\":\"d\",\"deployment_version\":\"v\",\"environment_id\":\"e\","
        "\"environment_type\":\"DEVELOPMENT\",\"org_id\":\"o\",\"project_id\":\"p\","
        "\"exp\":1750003600";
    static const struct {
        const char *claims, *why;
    } cases[] = {
        {"\"ver\":1,\"iss\":\"https://id.trigger.dev/\"," AUD, "bad_iss"},
        {"\"ver\":1,\"iss\":\"https://ID.trigger.dev\"," AUD, "bad_iss"},
        {"\"ver\":1," AUD, "bad_iss"},
        {"\"ver\":1,\"iss\":[\"https://id.trigger.dev\"]," AUD, "bad_iss"},
        {"\"ver\":1," ISS ",\"aud\":\"https://app.trigger.dev\"", "bad_aud"},
        {"\"ver\":1," ISS, "bad_aud"},
        {"\"ver\":1," ISS ",\"aud\":[]", "bad_aud"},
        {"\"ver\":1," ISS ",\"aud\":[\"x\",1,null]", "bad_aud"},
        {"\"ver\":1," ISS ",\"aud\":{\"a\":\"https://api.trigger.dev\"}", "bad_aud"},
        {"\"ver\":2," ISS "," AUD, "bad_ver"},
        {"\"ver\":\"1\"," ISS "," AUD, "bad_ver"},
        {"\"ver\":1.5," ISS "," AUD, "bad_ver"},
        {"\"ver\":true," ISS "," AUD, "bad_ver"},
        {ISS "," AUD, "bad_ver"},
        {"\"ver\":1," ISS ",\"aud\":[\"x\",\"https://api.trigger.dev\"]", NULL},
        {"\"ver\":1.0," ISS "," AUD, NULL},
        {"\"ver\":1e0," ISS "," AUD, NULL},
    };
    char payload[2048];

    fresh_verifier();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(payload, sizeof(payload), "{%s,%s}", cases[i].claims, base);
        if (cases[i].why == NULL) {
            CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
        } else {
            CHECK_PAYLOAD_INVALID(payload, cases[i].why);
        }
        if (cases[i].why != NULL && (why == NULL || strcmp(why, cases[i].why) != 0))
            fprintf(stderr, "  case %zu: %s\n", i, payload);
    }
}

static void test_expiry(void)
{
    fresh_verifier();
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1749999999}", "expired");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750000000}", "expired");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1749999999.999}", "expired");
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750000000.25}")),
             PL_TOKEN_VALID);
    CHECK(claims.exp == 1750000000.25);
    CHECK_EQ(verify_at(tok, 1750000000.24), PL_TOKEN_VALID);
    CHECK_EQ(verify_at(tok, 1750000000.25), PL_TOKEN_INVALID);
    CHECK_STR(why, "expired");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":\"1750003600\"}", "bad_claim");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":null}", "bad_claim");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP "}", "bad_claim");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1e999}", "bad_claim");
    /* nbf and iat are checked as jose checks them, when present. */
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"nbf\":1750000001}",
                          "not_yet_valid");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"nbf\":\"0\"}",
                          "bad_claim");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"iat\":\"0\"}",
                          "bad_claim");
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"nbf\":1750000000}")),
             PL_TOKEN_VALID);
}

/* Builds a payload from the standard claims with <name> dropped, renamed
 * to <rename>, or given the raw JSON value <value>. */
static void payload_with(char *out, size_t cap, const char *name, const char *rename,
                         const char *value)
{
    static const char *const names[] = {"ver", "deployment", "deployment_version",
                                        "environment_id", "environment_type", "org_id",
                                        "project_id", "iss", "aud", "exp"};
    static const char *const values[] = {"1", "\"deployment_abc\"", "\"v1\"", "\"env_1\"",
                                         "\"PRODUCTION\"", "\"org_1\"", "\"proj_1\"",
                                         "\"https://id.trigger.dev\"",
                                         "\"https://api.trigger.dev\"", "1750003600"};
    size_t n = 0;

    n += (size_t)snprintf(out + n, cap - n, "{");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const char *nm = names[i], *val = values[i];
        if (strcmp(nm, name) == 0) {
            if (rename == NULL && value == NULL)
                continue;
            nm = rename ? rename : nm;
            val = value ? value : val;
        }
        n += (size_t)snprintf(out + n, cap - n, "%s\"%s\":%s", n > 1 ? "," : "", nm, val);
    }
    snprintf(out + n, cap - n, "}");
}

static void test_required_claims(void)
{
    static const char *const strings[] = {"deployment", "deployment_version",
                                          "environment_id", "environment_type",
                                          "org_id", "project_id"};
    static const char *const wrong[] = {"1", "null", "true", "[\"x\"]", "{\"a\":\"x\"}"};
    char payload[2048], upper[64];

    fresh_verifier();
    payload_with(payload, sizeof(payload), "", NULL, NULL);
    CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        payload_with(payload, sizeof(payload), strings[i], NULL, NULL);
        CHECK_PAYLOAD_INVALID(payload, "bad_claim");
        /* Claim names are case-sensitive. */
        snprintf(upper, sizeof(upper), "%s", strings[i]);
        upper[0] = (char)(upper[0] - 'a' + 'A');
        payload_with(payload, sizeof(payload), strings[i], upper, NULL);
        CHECK_PAYLOAD_INVALID(payload, "bad_claim");
        for (size_t j = 0; j < sizeof(wrong) / sizeof(wrong[0]); j++) {
            payload_with(payload, sizeof(payload), strings[i], NULL, wrong[j]);
            CHECK_PAYLOAD_INVALID(payload, "bad_claim");
        }
    }
    payload_with(payload, sizeof(payload), "iss", "Iss", NULL);
    CHECK_PAYLOAD_INVALID(payload, "bad_iss");
    payload_with(payload, sizeof(payload), "exp", "EXP", NULL);
    CHECK_PAYLOAD_INVALID(payload, "bad_claim");
    /* An empty deployment is refused; an empty version is what the schema
     * allows (the broker then compares it with the header). */
    payload_with(payload, sizeof(payload), "deployment", NULL, "\"\"");
    CHECK_PAYLOAD_INVALID(payload, "bad_claim");
    payload_with(payload, sizeof(payload), "deployment_version", NULL, "\"\"");
    CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
    CHECK_STR(claims.deployment_version, "");
    payload_with(payload, sizeof(payload), "environment_type", NULL, "\"\"");
    CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
}

static void test_claim_lengths(void)
{
    char value[PL_KEY_FIELD_MAX + 8], payload[2048];

    fresh_verifier();
    memset(value, 'd', sizeof(value));
    value[0] = '"';
    value[PL_KEY_FIELD_MAX + 1] = '"';
    value[PL_KEY_FIELD_MAX + 2] = '\0';
    payload_with(payload, sizeof(payload), "deployment", NULL, value);
    CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
    CHECK_EQ(strlen(claims.deployment), PL_KEY_FIELD_MAX);
    value[PL_KEY_FIELD_MAX + 1] = 'd';
    value[PL_KEY_FIELD_MAX + 2] = '"';
    value[PL_KEY_FIELD_MAX + 3] = '\0';
    payload_with(payload, sizeof(payload), "deployment", NULL, value);
    CHECK_PAYLOAD_INVALID(payload, "bad_claim");
    payload_with(payload, sizeof(payload), "deployment_version", NULL, value);
    CHECK_PAYLOAD_INVALID(payload, "bad_claim");
}

static void test_json_strictness(void)
{
    fresh_verifier();
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"deployment\":\"deployment_other\"}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"exp\":1750003600}",
                          "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":[{\"a\":1,\"a\":2}]}", "bad_payload");
    /* The same name in two different objects is no duplicate. */
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                                 "\"x\":{\"exp\":1},\"y\":[{\"exp\":2}]}")),
             PL_TOKEN_VALID);
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":\"a\\u0000b\"}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":\"a\x01z\"}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":\"\xff\"}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":\"\xc0\xaf\"}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                          "\"x\":\"\xed\xa0\x80\"}", "bad_payload");
    /* An escaped backslash before "u0000" is just text. */
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                                 "\"x\":\"a\\\\u0000b \xc3\xa9\"}")),
             PL_TOKEN_VALID);
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600} x", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600}}", "bad_payload");
    CHECK_PAYLOAD_INVALID("[{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600}]", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,}", "bad_payload");
    CHECK_PAYLOAD_INVALID("null", "bad_payload");
    /* JSON.parse refuses these, so jose does, signed or not. */
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"x\":\"a\tb\"}",
                          "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":01750003600}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600.}", "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"x\":\"\\ud800\"}",
                          "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"x\":\"\\udc00\\ud800\"}",
                          "bad_payload");
    CHECK_PAYLOAD_INVALID("{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600}\x0b", "bad_payload");
    /* A surrogate pair is a character; escaped names are the names. */
    CHECK_EQ(verify(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,"
                                 "\"x\":\"\\ud83d\\ude00\"}")),
             PL_TOKEN_VALID);
    CHECK_EQ(verify(mint("{\"\\u0061lg\":\"HS\\u0032\\u00356\"}",
                         "{\"ver\":1,\"deploym\\u0065nt\":\"dep\\u006C\\u006fyment_\\u00e9\","
                         "\"deployment_version\":\"v\\/1\",\"environment_id\":\"e\","
                         "\"environment_type\":\"P\",\"org_id\":\"o\",\"project_id\":\"p\","
                         "\"iss\":\"https:\\/\\/id.trigger.dev\",\"aud\":[1,{\"a\":[]},"
                         "\"https:\\/\\/api.trigger.dev\"],\"exp\":1.7500036e9}")),
             PL_TOKEN_VALID);
    CHECK_STR(claims.deployment, "deployment_\xc3\xa9");
    CHECK_STR(claims.deployment_version, "v/1");
    CHECK(claims.exp == 1750003600.0);
    /* A byte order mark is dropped before the JSON text, as jose does. */
    CHECK_EQ(verify(mint(HEADER, "\xef\xbb\xbf" PAYLOAD)), PL_TOKEN_VALID);
}

static void test_base64_strictness(void)
{
    char t[8192], *p;

    fresh_verifier();
    /* Characters outside base64url in each segment. */
    static const char bad[] = {'+', '/', '=', ' ', '%', '\0'};
    for (int seg = 0; seg < 3; seg++) {
        for (size_t i = 0; bad[i] != '\0'; i++) {
            strcpy(t, mint(HEADER, PAYLOAD));
            p = t;
            for (int s = 0; s < seg; s++)
                p = strchr(p, '.') + 1;
            p[1] = bad[i];
            if (seg < 2)
                resign(t); /* so the signature is not what fails */
            if (seg == 0)
                CHECK_LEGACY(t); /* no longer decodes: a bare id */
            else
                CHECK_INVALID(t, "bad_base64");
        }
    }
    /* Padding after the signature, and after the header. */
    strcpy(t, mint(HEADER, PAYLOAD));
    strcat(t, "=");
    CHECK_INVALID(t, "bad_base64");
    mint("{\"alg\":\"HS256\"} ", PAYLOAD); /* a header of 16 bytes needs padding */
    p = strchr(tok, '.');
    memmove(p + 2, p, strlen(p) + 1);
    p[0] = p[1] = '=';
    resign(tok);
    CHECK_LEGACY(tok); /* the lenient reading refuses padding too */
    /* Padding after the payload, signed. */
    strcpy(t, mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600} "));
    p = strrchr(t, '.');
    strcpy(p, "==");
    resign(t);
    CHECK_INVALID(t, "bad_base64");
    /* A segment of length 4n+1 is impossible. */
    CHECK_LEGACY("eyJhbGciOiJIUzI1NiJ9A.e30.AAAA");
}

/* The header {"alg":"HS256"} is 15 bytes: 20 characters, no unused bits.
 * This test builds headers whose encodings end with unused bits and sets
 * them, which must be refused before the signature is even looked at. */
static void test_noncanonical_bits(void)
{
    char t[8192], *dot;
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

    fresh_verifier();
    /* 16 bytes -> 22 characters, 4 unused bits in the last one. */
    mint("{\"alg\":\"HS256\"} ", PAYLOAD);
    strcpy(t, tok);
    CHECK_EQ(verify(t), PL_TOKEN_VALID);
    dot = strchr(t, '.');
    {
        const char *at = strchr(abc, dot[-1]);
        CHECK(at != NULL && ((at - abc) & 15) == 0);
        dot[-1] = abc[(at - abc) | 1];
        CHECK_INVALID(t, "bad_base64");
    }
    /* 17 bytes -> 23 characters, 2 unused bits. */
    mint("{\"alg\":\"HS256\"}  ", PAYLOAD);
    strcpy(t, tok);
    CHECK_EQ(verify(t), PL_TOKEN_VALID);
    dot = strchr(t, '.');
    {
        const char *at = strchr(abc, dot[-1]);
        CHECK(at != NULL && ((at - abc) & 3) == 0);
        dot[-1] = abc[(at - abc) | 2];
        CHECK_INVALID(t, "bad_base64");
    }
    /* The signature's last character carries 2 unused bits (32 bytes). */
    strcpy(t, mint(HEADER, PAYLOAD));
    {
        char *last = t + strlen(t) - 1;
        const char *at = strchr(abc, *last);
        CHECK(at != NULL && ((at - abc) & 3) == 0);
        *last = abc[(at - abc) | 1];
        CHECK_INVALID(t, "bad_base64");
    }
}

static void test_shape(void)
{
    char t[8192];

    fresh_verifier();
    strcpy(t, mint(HEADER, PAYLOAD));
    strcat(t, ".AAAA");
    CHECK_INVALID(t, "malformed");
    /* Dots alone make no token: these are bare ids. */
    CHECK_LEGACY("..");
    CHECK_LEGACY("a..c");
    CHECK_LEGACY(".b.c");
    CHECK_LEGACY("a.b.");
    CHECK_LEGACY("a.b.c.");
    CHECK_LEGACY("deployment.abc.def");
    CHECK_LEGACY("deployment_app.v2.eu");
    CHECK_LEGACY("eyJ4IjoxfQ.eyJkZXBsb3ltZW50IjoieCJ9.c2ln"); /* {"x":1}: no alg */
    /* A JWT header makes the rest a (malformed) token. */
    strcpy(t, mint(HEADER, PAYLOAD));
    strcpy(strchr(t, '.') + 1, ".x");
    CHECK_INVALID(t, "malformed");
}

static void test_length_cap(void)
{
    char payload[8192], filler[4096];
    size_t base, len = 0;
    int found = 0;

    fresh_verifier();
    /* Find a filler claim that makes the token exactly PL_TOKEN_MAX long. */
    base = strlen(mint(HEADER, "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"f\":\"\"}"));
    for (size_t n = (PL_TOKEN_MAX - base) * 3 / 4 - 8; n < PL_TOKEN_MAX && !found; n++) {
        memset(filler, 'x', n);
        filler[n] = '\0';
        snprintf(payload, sizeof(payload),
                 "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"f\":\"%s\"}", filler);
        len = strlen(mint(HEADER, payload));
        found = len == PL_TOKEN_MAX;
    }
    CHECK(found);
    CHECK_EQ(verify(tok), PL_TOKEN_VALID);
    memmove(filler + 1, filler, strlen(filler) + 1);
    snprintf(payload, sizeof(payload), "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"f\":\"%s\"}",
             filler);
    CHECK(strlen(mint(HEADER, payload)) > PL_TOKEN_MAX);
    CHECK_INVALID(tok, "too_long");
    /* A long bare id is still a legacy id: its length is the key's business. */
    memset(payload, 'd', 6000);
    payload[6000] = '\0';
    CHECK_EQ(verify(payload), PL_TOKEN_LEGACY);
}

static void test_cache(void)
{
    pl_token_stats st;
    pl_token_claims first;
    char t[8192];

    fresh_verifier();
    strcpy(t, mint(HEADER, PAYLOAD));
    CHECK_EQ(verify(t), PL_TOKEN_VALID);
    first = claims;
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.entries, 1);
    CHECK_EQ(st.hits, 0);
    memset(&claims, 0, sizeof(claims));
    /* A hit allocates nothing: with every allocation failing it still works. */
    pl_mem_fail_after(1, 1);
    CHECK_EQ(verify(t), PL_TOKEN_VALID);
    pl_mem_fail_after(0, 0);
    CHECK_STR(why, "valid");
    CHECK(memcmp(&claims, &first, sizeof(claims)) == 0);
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.hits, 1);
    /* Invalid tokens are not cached; a forgery sharing a prefix misses. */
    t[strlen(t) - 2] = t[strlen(t) - 2] == 'A' ? 'B' : 'A';
    CHECK_INVALID(t, "bad_signature");
    CHECK_INVALID(t, "bad_signature");
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.entries, 1);
    CHECK_EQ(st.hits, 1);
    /* Past its exp the cached token is refused and dropped. */
    strcpy(t, mint(HEADER, PAYLOAD));
    CHECK_EQ(verify_at(t, 1750003599.5), PL_TOKEN_VALID);
    CHECK_EQ(verify_at(t, 1750003600.0), PL_TOKEN_INVALID);
    CHECK_STR(why, "expired");
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.entries, 0);
    CHECK_EQ(st.hits, 2);
    CHECK_EQ(st.evictions, 1);
}

static void test_cache_bound(void)
{
    char payload[1024], keep[8192];
    pl_token_stats st;

    fresh_verifier();
    for (int i = 0; i < PL_TOKEN_CACHE_MAX + 10; i++) {
        snprintf(payload, sizeof(payload),
                 "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"n\":%d}", i);
        CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
        if (i == 0)
            strcpy(keep, tok);
        if (i > 0 && i % 100 == 0) /* keep the first one recently used */
            CHECK_EQ(verify(keep), PL_TOKEN_VALID);
    }
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.entries, PL_TOKEN_CACHE_MAX);
    CHECK_EQ(st.evictions, 10);
    unsigned long hits = st.hits;
    CHECK_EQ(verify(keep), PL_TOKEN_VALID);
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.hits, hits + 1);
    /* The second token was the least recently used: evicted, re-verified. */
    snprintf(payload, sizeof(payload), "{" CLAIMS_BEFORE_EXP ",\"exp\":1750003600,\"n\":%d}", 1);
    CHECK_EQ(verify(mint(HEADER, payload)), PL_TOKEN_VALID);
    pl_token_verifier_stats(ver, &st);
    CHECK_EQ(st.hits, hits + 1);
}

/* Every allocation of a fresh verification fails in turn: the answer is
 * valid or a clean refusal, and nothing leaks (ASan checks the latter). */
static void test_out_of_memory(void)
{
    char t[8192];
    int valid = 0, refused = 0;

    CHECK(pl_token_verifier_new((const unsigned char *)"x", 0) == NULL);
    for (unsigned long n = 1; n <= 3; n++) {
        pl_mem_fail_after(n, 0);
        pl_token_verifier *v = pl_token_verifier_new((const unsigned char *)"x", 1);
        pl_mem_fail_after(0, 0);
        CHECK(n > 2 ? v != NULL : v == NULL);
        pl_token_verifier_free(v);
    }
    strcpy(t, mint(HEADER, PAYLOAD));
    for (unsigned long n = 1; n <= 200; n++) {
        fresh_verifier();
        pl_mem_fail_after(n, 0);
        pl_token_result r = verify(t);
        pl_mem_fail_after(0, 0);
        if (r == PL_TOKEN_VALID) {
            valid++;
        } else {
            refused++;
            CHECK(strcmp(why, "no_memory") == 0 || strcmp(why, "bad_header") == 0 ||
                  strcmp(why, "bad_payload") == 0 || strcmp(why, "legacy") == 0);
        }
    }
    CHECK(refused > 0);
    CHECK(valid > 0);
}

/* The broker's pre-verification helpers keep working. */
static void test_legacy_helpers(void)
{
    char dep[PL_KEY_FIELD_MAX + 1];
    const char *t = mint(HEADER, PAYLOAD);

    CHECK_EQ(pl_token_is_jwt(t, strlen(t)), 1);
    CHECK_EQ(pl_token_is_jwt("deployment_x", 12), 0);
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), 17);
    CHECK_STR(dep, "deployment_abc123");
    /* The claim as JavaScript reads it, escapes decoded; one a C string
     * would cut short (a NUL) or no header carries is no claim. */
    t = mint(HEADER, "{\"deployment\":\"dep_\\u00e9\",\"x\":\"\\ud800\"}");
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), 6);
    CHECK_STR(dep, "dep_\xc3\xa9");
    t = mint(HEADER, "{\"deployment\":\"a\\u0000b\"}");
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), -EINVAL);
    t = mint(HEADER, "{\"deployment\":\"a\\udc00\"}");
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), -EINVAL);
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, 0), -EINVAL);
    /* Unverified, a repeated claim reads as its first value; a payload that
     * is not JSON makes the value a bare id. */
    t = mint(HEADER, "{\"deployment\":\"first\",\"deployment\":\"second\"}");
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), 5);
    CHECK_STR(dep, "first");
    t = mint(HEADER, "{\"deployment\":\"a\tb\"}");
    CHECK_EQ(pl_token_deployment(t, strlen(t), dep, sizeof(dep)), PL_TOKEN_NOT_JWT);
    CHECK_EQ(pl_token_is_jwt(t, strlen(t)), 0);
    /* The lenient decoder still accepts non-zero unused bits. */
    unsigned char out[8];
    CHECK_EQ(pl_token_b64url_decode("QR", 2, out), 1);
    CHECK_EQ(out[0], 'A');
}

/* ---- jose vectors ------------------------------------------------------ */

static void test_previous_secret(void)
{
    static char old_tok[8192];

    fresh_verifier();
    mint_with(EVP_sha256(), "retired-secret", HEADER, PAYLOAD, old_tok);
    CHECK_INVALID(old_tok, "bad_signature");
    CHECK_EQ(pl_token_verifier_set_previous(ver, (const unsigned char *)"retired-secret", 14),
             0);
    CHECK_EQ(pl_token_verifier_set_previous(ver, (const unsigned char *)"x", 1), -EINVAL);
    memset(&claims, 0, sizeof(claims));
    CHECK_EQ(verify(old_tok), PL_TOKEN_VALID);
    CHECK_EQ(claims.previous, 1);
    CHECK_EQ(verify(old_tok), PL_TOKEN_VALID); /* from the cache, still "previous" */
    CHECK_EQ(claims.previous, 1);
    CHECK_EQ(verify(mint(HEADER, PAYLOAD)), PL_TOKEN_VALID);
    CHECK_EQ(claims.previous, 0);
    mint_with(EVP_sha256(), "neither-secret", HEADER, PAYLOAD, old_tok);
    CHECK_INVALID(old_tok, "bad_signature");
    fresh_verifier();
    CHECK_EQ(pl_token_verifier_set_previous(ver, (const unsigned char *)"", 0), -EINVAL);
}

static const char *result_name(pl_token_result r)
{
    switch (r) {
    case PL_TOKEN_VALID:
        return "valid";
    case PL_TOKEN_INVALID:
        return "invalid";
    case PL_TOKEN_LEGACY:
        return "legacy";
    case PL_TOKEN_ABSENT:
        return "absent";
    case PL_TOKEN_UNCHECKED:
        return "unchecked";
    }
    return "?";
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0 || (buf = malloc((size_t)n + 1)) == NULL) {
        if (f)
            fclose(f);
        return NULL;
    }
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    } else {
        buf[n] = '\0';
    }
    fclose(f);
    return buf;
}

static const char *str_field(const cJSON *o, const char *name)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(it) ? it->valuestring : NULL;
}

/* Checks one vector; returns 1 when the verifier agreed with it. */
static int run_vector(const cJSON *vec, double now)
{
    const char *name = str_field(vec, "name"), *secret = str_field(vec, "secret");
    const char *token = str_field(vec, "token"), *expect = str_field(vec, "expect");
    const char *want_why = str_field(vec, "why"), *dep = str_field(vec, "deployment");
    const char *dver = str_field(vec, "deployment_version");
    const cJSON *vnow = cJSON_GetObjectItemCaseSensitive(vec, "now");
    pl_token_result r;
    int ok;

    if (name == NULL || secret == NULL || token == NULL || expect == NULL) {
        printf("FAIL malformed vector\n");
        return 0;
    }
    pl_token_verifier_free(ver);
    ver = pl_token_verifier_new((const unsigned char *)secret, strlen(secret));
    if (ver == NULL) {
        printf("FAIL %s: no verifier for this secret\n", name);
        return 0;
    }
    r = verify_at(token, cJSON_IsNumber(vnow) ? vnow->valuedouble : now);
    ok = strcmp(result_name(r), expect) == 0 &&
         (want_why == NULL || (why && strcmp(why, want_why) == 0));
    if (ok && r == PL_TOKEN_VALID)
        ok = (dep == NULL || strcmp(dep, claims.deployment) == 0) &&
             (dver == NULL || strcmp(dver, claims.deployment_version) == 0);
    if (ok)
        printf("ok   %s\n", name);
    else
        printf("FAIL %s: got %s (%s), want %s (%s)\n", name, result_name(r),
               why ? why : "-", expect, want_why ? want_why : "-");
    return ok;
}

static int run_vectors(const char *path)
{
    char *text = read_file(path);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    const cJSON *vecs = cJSON_GetObjectItemCaseSensitive(root, "vectors"), *vec;
    const cJSON *now = cJSON_GetObjectItemCaseSensitive(root, "now");
    int total = 0, good = 0;

    if (!cJSON_IsArray(vecs) || !cJSON_IsNumber(now)) {
        fprintf(stderr, "%s: not a vectors file\n", path);
        free(text);
        cJSON_Delete(root);
        return 2;
    }
    cJSON_ArrayForEach(vec, vecs) {
        total++;
        good += run_vector(vec, now->valuedouble);
    }
    printf("%d vectors, %d failed\n", total, total - good);
    pl_token_verifier_free(ver);
    ver = NULL;
    cJSON_Delete(root);
    free(text);
    return total > 0 && good == total ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--vectors") == 0)
        return run_vectors(argv[2]);
    RUN(test_valid_token);
    RUN(test_legacy_and_absent);
    RUN(test_signature_forgeries);
    RUN(test_header_forgeries);
    RUN(test_issuer_audience_version);
    RUN(test_expiry);
    RUN(test_required_claims);
    RUN(test_claim_lengths);
    RUN(test_json_strictness);
    RUN(test_base64_strictness);
    RUN(test_noncanonical_bits);
    RUN(test_shape);
    RUN(test_length_cap);
    RUN(test_cache);
    RUN(test_cache_bound);
    RUN(test_out_of_memory);
    RUN(test_legacy_helpers);
    RUN(test_previous_secret);
    pl_token_verifier_free(ver);
    return unit_finish();
}
