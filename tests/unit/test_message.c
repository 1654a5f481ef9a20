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
        fprintf(stderr, "  body %s: error %s, wanted it to name %s\n", body, err, field);
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
    CHECK(m.owned == NULL);
    CHECK_EQ(m.key.deployment_len, strlen("deployment_a"));
    CHECK(memcmp(m.key.deployment, "deployment_a", 12) == 0);
    CHECK(memcmp(m.key.version, "20261130.1", 10) == 0);
    CHECK(m.key.cpu == 0.5 && m.key.memory == 1.0);
    pl_message_release(&m);
}

static void test_escaped_member_name_falls_back(void)
{
    /* "\u0064equeuedMessage" is the same name, spelled so the byte scanner
     * cannot know it: the payload is re-serialised instead. */
    const char *body = "{\"\\u0064equeuedMessage\":" KEYED("") "}";
    pl_message m;
    const char *err;

    CHECK_EQ(parse(body, &m, &err), 0);
    CHECK(m.owned != NULL);
    CHECK(m.payload != NULL && m.payload[0] == '{');
    pl_message_release(&m);
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

static void test_out_of_memory(void)
{
    const char *body = "{\"dequeuedMessage\":" KEYED("") "}";
    pl_message m;
    const char *err;
    int rc = -1;

    /* Fail each allocation in turn until parsing no longer allocates. */
    for (unsigned long n = 1; n < 200 && rc != 0; n++) {
        pl_mem_fail_after(n, 0);
        rc = parse(body, &m, &err);
        pl_mem_fail_after(0, 0);
        CHECK(rc == 0 || rc == PL_MESSAGE_EINVAL || rc == PL_MESSAGE_ENOMEM);
        if (rc == 0)
            pl_message_release(&m);
    }
    CHECK_EQ(rc, 0);
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
    CHECK_EQ(pl_token_deployment(tok, strlen(tok), out, 5), -1);
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
                                 sizeof(out)), -1);
}

int main(void)
{
    pl_message_init();
    RUN(test_valid_keeps_payload_bytes);
    RUN(test_escaped_member_name_falls_back);
    RUN(test_numbers);
    RUN(test_invalid_bodies);
    RUN(test_too_long_field);
    RUN(test_out_of_memory);
    RUN(test_token_deployment);
    return unit_finish();
}
