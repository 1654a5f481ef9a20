/* test_message.c -- dispatch body validation and payload extraction. */
#include <math.h>
#include <stdlib.h>

#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/token.h"
#include "unit.h"

#define KEYED(extra)                                                          \
    "{\"deployment\":{\"friendlyId\":\"deployment_a\"},"                      \
    "\"backgroundWorker\":{\"version\":\"20261130.1\"},"                      \
    "\"run\":{\"machine\":{\"cpu\":0.5,\"memory\":1}}" extra "}"

static int parse(const char *body, pl_message *m, const char **err)
{
    *err = NULL;
    return pl_message_parse(body, strlen(body), m, err);
}

static void expect_invalid(const char *body, const char *field)
{
    pl_message m;
    const char *err;

    CHECK_EQ(parse(body, &m, &err), PL_MESSAGE_EINVAL);
    CHECK(err != NULL && strstr(err, field) != NULL);
    if (err == NULL || strstr(err, field) == NULL)
        fprintf(stderr, "  body %.200s: error %s, wanted it to name %s\n", body, err, field);
}

static void test_valid_keeps_payload_bytes(void)
{
    const char *body = "{ \"other\": {\"dequeuedMessage\": 1},\n  \"dequeuedMessage\" : "
                       KEYED(",\"n\":1.50e0,\"s\":\"a}\\\"]\"") " , \"tail\": [1,{}]}";
    const char *want = KEYED(",\"n\":1.50e0,\"s\":\"a}\\\"]\"");
    pl_message m;
    const char *err;

    CHECK_EQ(parse(body, &m, &err), 0);
    CHECK_EQ(m.payload_len, strlen(want));
    CHECK(m.payload_len == strlen(want) && memcmp(m.payload, want, m.payload_len) == 0);
    CHECK_EQ(m.key.deployment_len, strlen("deployment_a"));
    CHECK(memcmp(m.key.deployment, "deployment_a", 12) == 0);
    CHECK(memcmp(m.key.version, "20261130.1", 10) == 0);
    CHECK(m.key.cpu == 0.5 && m.key.memory == 1.0);
    pl_message_release(&m);
}

static void test_escaped_member_name(void)
{
    /* "\u0064equeuedMessage" is the same name to JSON.parse: it is the
     * payload, forwarded as written. */
    const char *body = "{\"\\u0064equeuedMessage\":" KEYED("") "}";
    pl_message m;
    const char *err;

    CHECK_EQ(parse(body, &m, &err), 0);
    CHECK(m.payload == body + 24 && m.payload_len == strlen(body) - 25);
    pl_message_release(&m);
    /* ... and so it repeats the plain one */
    expect_invalid("{\"dequeuedMessage\":" KEYED("") ",\"\\u0064equeuedMessage\":1}",
                   "duplicate member name \\\"\\u0064equeuedMessage\\\"");
    /* a NUL makes it another name, not dequeuedMessage */
    expect_invalid("{\"dequeuedMessage\\u0000x\":" KEYED("") "}", "dequeuedMessage must be");
}

static void test_numbers(void)
{
    const char *body = "{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                       "\"backgroundWorker\":{\"version\":\"v\"},"
                       "\"run\":{\"machine\":{\"cpu\":5e-1,\"memory\":-0.0}}}}";
    pl_message m;
    const char *err;

    CHECK_EQ(parse(body, &m, &err), 0);
    CHECK(m.key.cpu == 0.5);
    CHECK(m.key.memory == 0 && !signbit(m.key.memory));
    pl_message_release(&m);
}

static void test_invalid_bodies(void)
{
    expect_invalid("", "JSON");
    expect_invalid("{", "JSON");
    expect_invalid("{\"dequeuedMessage\":" KEYED("") "} trailing", "JSON");
    expect_invalid("[1]", "dequeuedMessage");
    expect_invalid("{}", "dequeuedMessage");
    expect_invalid("{\"dequeuedMessage\":[]}", "dequeuedMessage");
    expect_invalid("{\"dequeuedMessage\":{}}", "dequeuedMessage.deployment.friendlyId");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":7}}}",
                   "dequeuedMessage.deployment.friendlyId");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"\"}}}",
                   "dequeuedMessage.deployment.friendlyId");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"}}}",
                   "dequeuedMessage.backgroundWorker.version");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                   "\"backgroundWorker\":{\"version\":\"v\"},\"run\":{\"machine\":{\"cpu\":\"1\"}}}}",
                   "dequeuedMessage.run.machine.cpu");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                   "\"backgroundWorker\":{\"version\":\"v\"},\"run\":{\"machine\":{\"cpu\":1}}}}",
                   "dequeuedMessage.run.machine.memory");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                   "\"backgroundWorker\":{\"version\":\"v\"},\"run\":{\"machine\":{\"cpu\":1,\"memory\":1e999}}}}",
                   "dequeuedMessage.run.machine.memory");
}

/* What JSON.parse refuses, or reads otherwise than a lenient parser. */
static void test_strict(void)
{
#define DM(x) "{\"dequeuedMessage\":" x "}"
    static const char *const not_json[] = {
        DM(KEYED(",\"n\":01")), DM(KEYED(",\"n\":1.")), DM(KEYED(",\"n\":.5")),
        DM(KEYED(",\"n\":+1")), DM(KEYED(",\"n\":1e")), DM(KEYED(",\"n\":-")),
        DM(KEYED(",\x01\"n\":1")), DM(KEYED(",\"n\":1\f")), DM(KEYED(",\"s\":\"a\nb\"")),
        DM(KEYED(",\"s\":\"\x07\"")), DM(KEYED(",\"s\":\"\\x\"")), DM(KEYED(",\"s\":\"\\u12\"")),
        DM(KEYED(",\"s\":\"\xc0\xaf\"")), DM(KEYED(",\"s\":\"\xed\xa0\x80\"")),
        DM(KEYED(",\"s\":\"\xf4\x90\x80\x80\"")), DM(KEYED(",\"s\":\"\xe2\x82\"")),
        DM(KEYED(",\"s\":\"\x80\"")), "\xef\xbb\xbf" DM(KEYED("")), DM(KEYED("")) "\x00",
        DM(KEYED("")) " x", DM(KEYED(",\"a\":[1,]")), DM(KEYED(",\"a\":tru")),
        DM(KEYED(",\"a\":NaN")), DM(KEYED(",\"a\":'x'")), "{\"dequeuedMessage\"" KEYED(""),
    };
    const char *ok = DM(KEYED(",\"s\":\"\\u0000 \\ud800 \xf0\x9f\x98\x80 \xe2\x82\xac\","
                              "\"n\":[-0,0.5e-3,1E+2,123456789012345678901234567890,1e999]"));
    char buf[512];
    pl_message m;
    const char *err;

    for (size_t i = 0; i < sizeof(not_json) / sizeof(not_json[0]); i++) {
        size_t n = strlen(not_json[i]);

        if (strcmp(not_json[i], DM(KEYED(""))) == 0) /* the one with a NUL after */
            n++;
        CHECK_EQ(pl_message_parse(not_json[i], n, &m, &err), PL_MESSAGE_EINVAL);
        CHECK(strstr(err, "not valid JSON") != NULL);
    }
    CHECK_EQ(parse(ok, &m, &err), 0);
    pl_message_release(&m);
    /* key fields are read as JSON.parse reads them, escapes decoded, but
     * never to a NUL (a C reading ends there) or a lone surrogate */
    expect_invalid(DM("{\"deployment\":{\"friendlyId\":\"A\\u0000B\"}}"),
                   "friendlyId must not contain \\\\u0000");
    expect_invalid(DM("{\"deployment\":{\"friendlyId\":\"A\\ud800\"}}"),
                   "friendlyId must not contain \\\\u0000 or a lone surrogate");
    expect_invalid(DM("{\"deployment\":{\"friendlyId\":\"d\"},\"backgroundWorker\":"
                      "{\"version\":\"\\udc00\"}}"), "version must not contain");
    {
        const char *esc = DM("{\"deployment\":{\"friendlyId\":\"q\\\"\\\\\\t\\u0041\\ud83d\\ude00\"},"
                             "\"backgroundWorker\":{\"version\":\"1\\/2\"},"
                             "\"run\":{\"machine\":{\"cpu\":1,\"memory\":2}}}");

        CHECK_EQ(parse(esc, &m, &err), 0);
        CHECK(m.key.deployment_len == 9 &&
              memcmp(m.key.deployment, "q\"\\\tA\xf0\x9f\x98\x80", 9) == 0);
        CHECK(m.key.version_len == 3 && memcmp(m.key.version, "1/2", 3) == 0);
        CHECK(m.owned != NULL);
        pl_message_release(&m);
        /* out of memory for the decoded strings: ENOMEM, nothing leaks */
        pl_mem_fail_after(1, 0);
        CHECK_EQ(parse(esc, &m, &err), PL_MESSAGE_ENOMEM);
        pl_mem_fail_after(0, 0);
    }
    /* nesting: the limit, and one more */
    memset(buf, '[', PL_MESSAGE_MAX_DEPTH > 400 ? 400 : PL_MESSAGE_MAX_DEPTH);
    CHECK_EQ(pl_message_parse(buf, 400, &m, &err), PL_MESSAGE_EINVAL);
    CHECK(strstr(err, "not valid JSON") != NULL);
#undef DM
}

/* A dispatch whose "a" holds arrays nested <extra> deep. */
static int parse_nested(size_t extra, const char **err)
{
    char *body = malloc(2 * extra + 256);
    size_t n;
    pl_message m;
    int rc;

    if (body == NULL)
        return -1;
    n = (size_t)sprintf(body, "{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                                     "\"backgroundWorker\":{\"version\":\"v\"},"
                                     "\"run\":{\"machine\":{\"cpu\":1,\"memory\":1}},\"a\":");

    memset(body + n, '[', extra);
    memset(body + n + extra, ']', extra);
    memcpy(body + n + 2 * extra, "}}", 3);
    rc = parse(body, &m, err);
    free(body);
    return rc;
}

static void test_deep(void)
{
    const char *err;

    /* the root and dequeuedMessage are two levels */
    CHECK_EQ(parse_nested(PL_MESSAGE_MAX_DEPTH - 2, &err), 0);
    CHECK_EQ(parse_nested(PL_MESSAGE_MAX_DEPTH - 1, &err), PL_MESSAGE_EINVAL);
    CHECK(strstr(err, "nested too deeply") != NULL);
}

static void test_duplicates(void)
{
    /* first-wins for routing, last-wins for the controller: refused */
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"B\"},"
                   "\"backgroundWorker\":{\"version\":\"v\"},\"run\":{\"machine\":{\"cpu\":1,"
                   "\"memory\":1}},\"deployment\":{\"friendlyId\":\"A\"}}}",
                   "duplicate member name \\\"deployment\\\"");
    expect_invalid("{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"B\",\"friendlyId\":\"A\"}}}",
                   "duplicate member name \\\"friendlyId\\\"");
    /* anywhere, however deep, and the first one is named */
    expect_invalid("{\"dequeuedMessage\":" KEYED(",\"x\":[{\"a\":1,\"b\":{\"c\":1,\"c\":2},\"a\":2}]") "}",
                   "duplicate member name \\\"c\\\"");
    expect_invalid("{\"x\":1,\"\\u0078\":2,\"dequeuedMessage\":" KEYED("") "}",
                   "duplicate member name \\\"\\u0078\\\"");
    /* surrogates: an escaped pair is the character itself; lone ones differ */
    expect_invalid("{\"dequeuedMessage\":" KEYED(",\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2") "}",
                   "duplicate member name");
    {
        const char *ok = "{\"dequeuedMessage\":" KEYED(",\"\\ud83d\":1,\"\\ude00\":2,\"\\ud83d\\ude00\":3,"
                                                      "\"a\":{\"a\":{}},\"b\":[{\"a\":1},{\"a\":1}]") "}";
        pl_message m;
        const char *err;

        CHECK_EQ(parse(ok, &m, &err), 0);
    }
    /* the same name in sibling and nested objects is no duplicate; a
     * syntax error after a duplicate is reported as the syntax error */
    expect_invalid("{\"a\":1,\"a\":2,", "not valid JSON");
}

/* Objects of up to 16 names are checked name against name, larger ones by
 * hash from then on: duplicates on either side of that line and across it
 * are found, same names in sibling objects are not duplicates, and the
 * table is left empty after every body (a slot left behind would fill it
 * within a few hundred bodies and hang the parse). */
static void test_duplicates_in_large_objects(void)
{
    char body[4096];
    pl_message m;
    const char *err;

    for (int dup_at = 1; dup_at < 40; dup_at++) {
        int n = snprintf(body, sizeof(body), "{\"x\":{");

        for (int i = 0; i < 40; i++)
            n += snprintf(body + n, sizeof(body) - (size_t)n, "%s\"m%d\":0", i ? "," : "",
                          i == dup_at ? dup_at / 2 : i);
        snprintf(body + n, sizeof(body) - (size_t)n,
                 "},\"y\":{\"m1\":0,\"m30\":0},\"dequeuedMessage\":" KEYED("") "}");
        for (int k = 0; k < 200; k++) {
            char want[64];

            snprintf(want, sizeof(want), "duplicate member name \\\"m%d\\\"", dup_at / 2);
            expect_invalid(body, want);
        }
    }
    for (int k = 0; k < 500; k++) {
        int n = snprintf(body, sizeof(body), "{\"x\":{");

        for (int i = 0; i < 40; i++)
            n += snprintf(body + n, sizeof(body) - (size_t)n, "%s\"m%d\":{\"m%d\":0}", i ? "," : "",
                          i, i);
        snprintf(body + n, sizeof(body) - (size_t)n,
                 "},\"y\":{\"m1\":0,\"m30\":0},\"dequeuedMessage\":" KEYED("") "}");
        CHECK_EQ(parse(body, &m, &err), 0);
        pl_message_release(&m);
    }
}

/* A line of tests/vectors/dispatch.tsv: its fields, hex decoded. */
static size_t unhex(const char *hex, char *out)
{
    size_t n = 0;

    for (; hex[0] && hex[1] && hex[0] != '\t'; hex += 2) {
        unsigned v;
        sscanf(hex, "%2x", &v);
        out[n++] = (char)v;
    }
    return n;
}

/* Each body's verdict, key and payload as Node's JSON.parse read them
 * (tests/vectors/gen-dispatch.mjs wrote the file). */
static void test_vectors(void)
{
    const char *root = getenv("PL_SOURCE_ROOT");
    char path[4096], *line = NULL;
    size_t cap = 0, count = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s/tests/vectors/dispatch.tsv", root ? root : ".");
    f = fopen(path, "r");
    CHECK(f != NULL);
    if (f == NULL)
        return;
    while (getline(&line, &cap, f) > 0) {
        char *fld[9] = {0}, *rest = line, *t, *body, *dep, *ver;
        size_t len, dl, vl;
        int nf = 0, rc;
        pl_message m;
        const char *err = NULL;

        if (line[0] == '#' || line[0] == '\n')
            continue;
        line[strcspn(line, "\n")] = '\0';
        while (nf < 9 && (t = strsep(&rest, "\t")) != NULL)
            fld[nf++] = t; /* an empty body is an empty field */
        body = malloc(strlen(fld[1]) / 2 + 1);
        len = unhex(fld[1], body);
        rc = pl_message_parse(body, len, &m, &err);
        count++;
        if (strcmp(fld[0], "ok") == 0 && nf == 9) {
            double cpu = strtod(fld[4], NULL), mem = strtod(fld[5], NULL);
            size_t off = strtoul(fld[6], NULL, 10), pl = strtoul(fld[7], NULL, 10);

            dep = malloc(strlen(fld[2]) / 2 + 1);
            ver = malloc(strlen(fld[3]) / 2 + 1);
            dl = unhex(fld[2], dep);
            vl = unhex(fld[3], ver);
            CHECK_EQ(rc, 0);
            if (rc == 0) {
                CHECK(m.key.deployment_len == dl && memcmp(m.key.deployment, dep, dl) == 0);
                CHECK(m.key.version_len == vl && memcmp(m.key.version, ver, vl) == 0);
                CHECK(m.key.cpu == cpu && m.key.memory == mem);
                CHECK(m.payload == body + off && m.payload_len == pl);
                pl_message_release(&m);
            }
            free(dep);
            free(ver);
        } else {
            CHECK(strcmp(fld[0], "bad") == 0 && nf >= 3);
            CHECK_EQ(rc, PL_MESSAGE_EINVAL);
            CHECK(rc != PL_MESSAGE_EINVAL || strstr(err, fld[2]) != NULL);
        }
        if ((strcmp(fld[0], "ok") == 0) != (rc == 0) ||
            (rc != 0 && fld[2] && err && strstr(err, fld[2]) == NULL))
            fprintf(stderr, "  vector %s: %s (wanted %s %s)\n", fld[nf - 1],
                    rc == 0 ? "accepted" : err, fld[0], fld[0][0] == 'b' ? fld[2] : "");
        free(body);
    }
    free(line);
    fclose(f);
    CHECK(count >= 50);
}

static void test_too_long_field(void)
{
    char *body = malloc(PL_KEY_FIELD_MAX + 256);
    char *dep = malloc(PL_KEY_FIELD_MAX + 2);

    memset(dep, 'x', PL_KEY_FIELD_MAX + 1);
    dep[PL_KEY_FIELD_MAX + 1] = '\0';
    snprintf(body, PL_KEY_FIELD_MAX + 256,
             "{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"%s\"}}}", dep);
    expect_invalid(body, "too long");
    free(body);
    free(dep);
}

/* A body with more member names than the static scratch holds, and long
 * escaped names, needs heap scratch: each allocation failing in turn gives
 * ENOMEM, never a wrong verdict, and nothing leaks (ASan, valgrind). */
static void test_out_of_memory(void)
{
    size_t cap = 64 * 1024, n = 0;
    char *body = malloc(cap);
    pl_message m;
    const char *err;
    int rc = -1;

    n += (size_t)snprintf(body + n, cap - n,
                          "{\"dequeuedMessage\":{\"deployment\":{\"friendlyId\":\"d\"},"
                          "\"backgroundWorker\":{\"version\":\"v\"},"
                          "\"run\":{\"machine\":{\"cpu\":1,\"memory\":1}},\"x\":{");
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s\"\\u006e%d\":%d", i ? "," : "", i, i);
    for (int i = 0; i < 3; i++)
        n += (size_t)snprintf(body + n, cap - n, ",\"\\u0041%01500d\":0", i);
    n += (size_t)snprintf(body + n, cap - n, "}}}");
    for (unsigned long k = 1; k < 20 && rc != 0; k++) {
        pl_mem_fail_after(k, 0);
        rc = pl_message_parse(body, n, &m, &err);
        pl_mem_fail_after(0, 0);
        CHECK(rc == 0 || rc == PL_MESSAGE_ENOMEM);
        CHECK(k > 1 || rc == PL_MESSAGE_ENOMEM); /* it does allocate */
    }
    CHECK_EQ(rc, 0);
    pl_message_release(&m);
    /* the same names twice over: found across the heap scratch too */
    memcpy(body + n - 3, ",\"n1999\":0}}}", 14);
    expect_invalid(body, "duplicate member name \\\"n1999\\\"");
    free(body);
}

static void test_token_deployment(void)
{
    /* {"alg":"HS256"} . {"deployment":"deployment_t","ver":1} . sig */
    const char *tok = "eyJhbGciOiJIUzI1NiJ9.eyJkZXBsb3ltZW50IjoiZGVwbG95bWVudF90IiwidmVyIjoxfQ.c2ln";
    char out[64];

    CHECK(pl_token_is_jwt(tok, strlen(tok)));
    CHECK(!pl_token_is_jwt("deployment_abc", 14));
    CHECK(!pl_token_is_jwt("a..b", 4));
    CHECK(!pl_token_is_jwt("a.b.", 4));
    CHECK(!pl_token_is_jwt("a.b.c.d", 7));
    CHECK(!pl_token_is_jwt("a.b+.c", 6));
    CHECK_EQ(pl_token_deployment(tok, strlen(tok), out, sizeof(out)), 12);
    CHECK_STR(out, "deployment_t");
    CHECK_EQ(pl_token_deployment(tok, strlen(tok), out, 5), -EINVAL);
    /* Dots alone make no token: these are bare ids (ids are opaque). */
    CHECK_EQ(pl_token_deployment("a.b.c", 5, out, sizeof(out)), PL_TOKEN_NOT_JWT);
    CHECK(!pl_token_is_jwt("deployment_app.v2.eu", 20));
    CHECK_EQ(pl_token_deployment("deployment_app.v2.eu", 20, out, sizeof(out)),
             PL_TOKEN_NOT_JWT);
    /* A header without "alg", or a payload that is not an object: not a JWT.
     * {"typ":"JWT"} . {"deployment":"x"} . sig and {"alg":"HS256"} . [1] . sig */
    CHECK(!pl_token_is_jwt("eyJ0eXAiOiJKV1QifQ.eyJkZXBsb3ltZW50IjoieCJ9.c2ln", 48));
    CHECK(!pl_token_is_jwt("eyJhbGciOiJIUzI1NiJ9.WzFd.c2ln", 30));
    /* {"alg":"HS256"} . {"ver":1} . sig: a JWT without the claim. */
    CHECK(pl_token_is_jwt("eyJhbGciOiJIUzI1NiJ9.eyJ2ZXIiOjF9.c2ln", 38));
    CHECK_EQ(pl_token_deployment("eyJhbGciOiJIUzI1NiJ9.eyJ2ZXIiOjF9.c2ln", 38, out,
                                 sizeof(out)), -EINVAL);
}

int main(void)
{
    RUN(test_valid_keeps_payload_bytes);
    RUN(test_escaped_member_name);
    RUN(test_strict);
    RUN(test_duplicates);
    RUN(test_duplicates_in_large_objects);
    RUN(test_deep);
    RUN(test_vectors);
    RUN(test_numbers);
    RUN(test_invalid_bodies);
    RUN(test_too_long_field);
    RUN(test_out_of_memory);
    RUN(test_token_deployment);
    return unit_finish();
}
