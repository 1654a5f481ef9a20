/* test_poll.c -- a long-poll's key from its headers (poll.h): what is
 * required, numbers, lengths, text that no dispatch could name, and the
 * deployment token with verification off, logged and enforced. */
#include <stdio.h>
#include <string.h>

#include "pilotlight/poll.h"
#include "mint.h"
#include "unit.h"

#define SECRET "poll-test-secret"
#define NOW 1750000000.0
#define HEADER "{\"alg\":\"HS256\",\"typ\":\"JWT\"}"
/* A token as Trigger.dev mints one, for <deployment> and <version>. */
#define CLAIMS(deployment, version)                                            \
    "{\"ver\":1,\"deployment\":\"" deployment "\",\"deployment_version\":\"" \
    version "\",\"environment_id\":\"env_1\",\"environment_type\":"           \
    "\"PRODUCTION\",\"org_id\":\"org_1\",\"project_id\":\"proj_1\","           \
    "\"iss\":\"https://id.trigger.dev\",\"aud\":\"https://api.trigger.dev\","  \
    "\"exp\":1750003600}"

enum { OFF, LOG, ENFORCE };

static pl_request req;
static pl_key key;
static pl_token_claims claims;
static pl_token_verifier *verifier;
static int token;
static const char *err;
static char msg[128];
static char tok[4096];

static void set(pl_header h, const char *v)
{
    req.header[h] = v;
    req.header_len[h] = v ? strlen(v) : 0;
}

/* A well-formed poll's headers. */
static void good(void)
{
    memset(&req, 0, sizeof(req));
    set(PL_HDR_CONTROLLER_ID, "controller-1");
    set(PL_HDR_DEPLOYMENT_ID, "deployment_abc123");
    set(PL_HDR_DEPLOYMENT_VERSION, "20250101.1");
    set(PL_HDR_MACHINE_CPU, "0.5");
    set(PL_HDR_MACHINE_MEMORY, "1");
}

/* pl_poll_key() in token mode <mode>; returns its status. */
static int key_of(int mode)
{
    memset(&key, 0, sizeof(key));
    memset(&claims, 0, sizeof(claims));
    msg[0] = '\0';
    token = -99;
    err = "not set";
    return pl_poll_key(&req, mode == OFF ? NULL : verifier, mode == ENFORCE, NOW, &key,
                       &claims, &token, &err, msg, sizeof(msg));
}

static int key_is(const char *deployment, const char *version, double cpu, double memory)
{
    return key.deployment_len == strlen(deployment) &&
           memcmp(key.deployment, deployment, key.deployment_len) == 0 &&
           key.version_len == strlen(version) &&
           memcmp(key.version, version, key.version_len) == 0 && key.cpu == cpu &&
           key.memory == memory;
}

static const char *mint(const char *secret, const char *payload)
{
    mint_with(EVP_sha256(), secret, HEADER, payload, tok);
    return tok;
}

static void test_the_key(void)
{
    good();
    CHECK_EQ(key_of(OFF), 0);
    CHECK(err == NULL);
    CHECK_EQ(token, PL_TOKEN_UNCHECKED); /* nothing verified */
    CHECK(key_is("deployment_abc123", "20250101.1", 0.5, 1));
    /* views of the request, not copies */
    CHECK(key.version == req.header[PL_HDR_DEPLOYMENT_VERSION]);
    CHECK(key.deployment == req.header[PL_HDR_DEPLOYMENT_ID]);

    /* numbers as JSON reads them: one key however written */
    set(PL_HDR_MACHINE_CPU, "5e-1");
    set(PL_HDR_MACHINE_MEMORY, "1.0");
    CHECK_EQ(key_of(OFF), 0);
    CHECK(key_is("deployment_abc123", "20250101.1", 0.5, 1));
}

static void test_missing_or_empty_names_the_header(void)
{
    static const struct {
        pl_header h;
        const char *name;
    } required[] = {
        {PL_HDR_CONTROLLER_ID, "x-trigger-workload-controller-id"},
        {PL_HDR_DEPLOYMENT_ID, "x-trigger-deployment-id"},
        {PL_HDR_DEPLOYMENT_VERSION, "x-trigger-deployment-version"},
        {PL_HDR_MACHINE_CPU, "x-trigger-machine-cpu"},
        {PL_HDR_MACHINE_MEMORY, "x-trigger-machine-memory"},
    };
    char want[128];

    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        snprintf(want, sizeof(want), "missing header %s", required[i].name);
        good();
        set(required[i].h, NULL);
        CHECK_EQ(key_of(OFF), -EINVAL);
        CHECK_STR(err, want);
        good();
        set(required[i].h, "");
        CHECK_EQ(key_of(OFF), -EINVAL);
        CHECK_STR(err, want);
    }
    /* with a verifier, an empty deployment id is an absent token */
    good();
    set(PL_HDR_DEPLOYMENT_ID, "");
    CHECK_EQ(key_of(LOG), -EINVAL);
    CHECK_EQ(token, PL_TOKEN_ABSENT);
    /* optional headers are not asked for */
    good();
    set(PL_HDR_AUTHORIZATION, NULL);
    set(PL_HDR_HOST, NULL);
    CHECK_EQ(key_of(OFF), 0);
}

static void test_numbers(void)
{
    static const char *const bad[] = {"abc", "0x1", "1 ", " 1", "01", "NaN", "Infinity",
                                      "1e999", "-", "1.", ".5", "+1", "1,5"};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        good();
        set(PL_HDR_MACHINE_CPU, bad[i]);
        CHECK_EQ(key_of(OFF), -EINVAL);
        CHECK_STR(err, "x-trigger-machine-cpu must be a number");
        good();
        set(PL_HDR_MACHINE_MEMORY, bad[i]);
        CHECK_EQ(key_of(OFF), -EINVAL);
        CHECK_STR(err, "x-trigger-machine-memory must be a number");
    }
    good();
    set(PL_HDR_MACHINE_CPU, "-0.25");
    set(PL_HDR_MACHINE_MEMORY, "1E3");
    CHECK_EQ(key_of(OFF), 0);
    CHECK(key.cpu == -0.25 && key.memory == 1000);
}

static void test_lengths(void)
{
    static char big[PL_KEY_FIELD_MAX + 2];

    memset(big, 'c', PL_POLL_CONTROLLER_ID_MAX + 1);
    big[PL_POLL_CONTROLLER_ID_MAX + 1] = '\0';
    good();
    set(PL_HDR_CONTROLLER_ID, big);
    CHECK_EQ(key_of(OFF), -EINVAL);
    CHECK_STR(err, "x-trigger-workload-controller-id is too long");
    big[PL_POLL_CONTROLLER_ID_MAX] = '\0';
    set(PL_HDR_CONTROLLER_ID, big); /* the longest there may be */
    CHECK_EQ(key_of(OFF), 0);

    memset(big, 'v', PL_KEY_FIELD_MAX + 1);
    big[PL_KEY_FIELD_MAX + 1] = '\0';
    good();
    set(PL_HDR_DEPLOYMENT_VERSION, big);
    CHECK_EQ(key_of(OFF), -EINVAL);
    CHECK_STR(err, "x-trigger-deployment-version is too long");
    good();
    set(PL_HDR_DEPLOYMENT_ID, big);
    CHECK_EQ(key_of(OFF), -EINVAL);
    CHECK_STR(err, "x-trigger-deployment-id is too long");
    big[PL_KEY_FIELD_MAX] = '\0';
    set(PL_HDR_DEPLOYMENT_ID, big);
    CHECK_EQ(key_of(OFF), 0);
    CHECK_EQ(key.deployment_len, PL_KEY_FIELD_MAX);
}

static void test_text_no_dispatch_could_name(void)
{
    static const struct {
        pl_header h;
        const char *value, *err;
    } cases[] = {
        {PL_HDR_CONTROLLER_ID, "ctl\x01", "x-trigger-workload-controller-id holds a control character"},
        {PL_HDR_CONTROLLER_ID, "ctl\xff", "x-trigger-workload-controller-id is not valid UTF-8"},
        {PL_HDR_DEPLOYMENT_VERSION, "1\x7f", "x-trigger-deployment-version holds a control character"},
        {PL_HDR_DEPLOYMENT_VERSION, "\xc0\xaf", "x-trigger-deployment-version is not valid UTF-8"},
        {PL_HDR_DEPLOYMENT_VERSION, "\xed\xa0\x80", "x-trigger-deployment-version is not valid UTF-8"},
        {PL_HDR_DEPLOYMENT_ID, "dep\t1", "x-trigger-deployment-id holds a control character"},
        {PL_HDR_DEPLOYMENT_ID, "dep\xe2\x82", "x-trigger-deployment-id is not valid UTF-8"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        good();
        set(cases[i].h, cases[i].value);
        CHECK_EQ(key_of(OFF), -EINVAL);
        CHECK_STR(err, cases[i].err);
        CHECK(err == msg); /* the message names the header */
    }
    /* any text is fine: a key is opaque */
    good();
    set(PL_HDR_CONTROLLER_ID, "contr\xc3\xb4leur \xf0\x9f\x9a\x80");
    set(PL_HDR_DEPLOYMENT_ID, "d\xc3\xa9ploiement");
    set(PL_HDR_DEPLOYMENT_VERSION, "v 1 \"x\"");
    CHECK_EQ(key_of(OFF), 0);
    CHECK(key_is("d\xc3\xa9ploiement", "v 1 \"x\"", 0.5, 1));
}

/* Every byte value at every place of a header long enough to be read
 * eight bytes at a time: control characters and bytes that cannot start
 * or continue UTF-8 are refused wherever they stand, printable ASCII and
 * a well-formed sequence straddling a block boundary are not. */
static void test_text_at_every_offset(void)
{
    char v[40];

    for (size_t at = 0; at < 24; at++) {
        for (int c = 0; c < 256; c++) {
            int ok = c >= 0x20 && c < 0x7f;

            memset(v, 'a', 24);
            v[24] = '\0';
            v[at] = (char)c;
            if (c == 0)
                continue; /* set() takes a C string; NUL is a control byte anyway */
            good();
            set(PL_HDR_CONTROLLER_ID, v);
            CHECK_EQ(key_of(OFF), ok ? 0 : -EINVAL);
        }
        /* a four-byte character starting at <at> */
        memset(v, 'a', 28);
        v[28] = '\0';
        memcpy(v + at, "\xf0\x9f\x9a\x80", 4);
        good();
        set(PL_HDR_DEPLOYMENT_VERSION, v);
        CHECK_EQ(key_of(OFF), 0);
        v[at + 3] = 'a'; /* cut short */
        set(PL_HDR_DEPLOYMENT_VERSION, v);
        CHECK_EQ(key_of(OFF), -EINVAL);
    }
}

static void test_token_off(void)
{
    /* unverified, a token's claim names the key */
    good();
    set(PL_HDR_DEPLOYMENT_ID, mint("any-secret", CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(OFF), 0);
    CHECK_EQ(token, PL_TOKEN_UNCHECKED);
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));
    /* a JWT without a deployment claim */
    set(PL_HDR_DEPLOYMENT_ID, mint("any-secret", "{\"deployment_version\":\"1\"}"));
    CHECK_EQ(key_of(OFF), -EINVAL);
    CHECK_STR(err, "x-trigger-deployment-id is a token without a deployment claim");
    /* dots do not make a token: a bare id */
    set(PL_HDR_DEPLOYMENT_ID, "a.b.c");
    CHECK_EQ(key_of(OFF), 0);
    CHECK(key_is("a.b.c", "20250101.1", 0.5, 1));
    /* a claim no dispatch could name */
    set(PL_HDR_DEPLOYMENT_ID, mint("any-secret", CLAIMS("dep\\u0007", "20250101.1")));
    CHECK_EQ(key_of(OFF), -EINVAL);
    CHECK_STR(err, "x-trigger-deployment-id holds a control character");
}

static void test_token_logged(void)
{
    good();
    set(PL_HDR_DEPLOYMENT_ID, mint(SECRET, CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(LOG), 0);
    CHECK_EQ(token, PL_TOKEN_VALID);
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));
    CHECK(key.deployment == claims.deployment);

    /* refused tokens are counted, not refused: the claim still names the key */
    set(PL_HDR_DEPLOYMENT_ID, mint("wrong-secret", CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(LOG), 0);
    CHECK_EQ(token, PL_TOKEN_INVALID);
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));
    /* signed for another version than the poll's */
    set(PL_HDR_DEPLOYMENT_ID, mint(SECRET, CLAIMS("deployment_tok", "20250101.2")));
    CHECK_EQ(key_of(LOG), 0);
    CHECK_EQ(token, PL_TOKEN_INVALID);
    set(PL_HDR_DEPLOYMENT_ID, "deployment_abc123");
    CHECK_EQ(key_of(LOG), 0);
    CHECK_EQ(token, PL_TOKEN_LEGACY);
    CHECK(key_is("deployment_abc123", "20250101.1", 0.5, 1));
}

static void test_token_enforced(void)
{
    good();
    set(PL_HDR_DEPLOYMENT_ID, mint(SECRET, CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(ENFORCE), 0);
    CHECK_EQ(token, PL_TOKEN_VALID);
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));

    /* refused, the key still says what the poll claimed (the status page
     * names the deployment whose poll was refused) */
    set(PL_HDR_DEPLOYMENT_ID, mint("wrong-secret", CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(ENFORCE), -EACCES);
    CHECK_EQ(token, PL_TOKEN_INVALID);
    CHECK_STR(err, "invalid deployment token");
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));
    set(PL_HDR_DEPLOYMENT_ID, mint(SECRET, CLAIMS("deployment_tok", "20250101.2")));
    CHECK_EQ(key_of(ENFORCE), -EACCES);
    CHECK_STR(err, "invalid deployment token");
    CHECK(key_is("deployment_tok", "20250101.1", 0.5, 1));
    set(PL_HDR_DEPLOYMENT_ID, "deployment_abc123");
    CHECK_EQ(key_of(ENFORCE), -EACCES);
    CHECK_EQ(token, PL_TOKEN_LEGACY);
    CHECK_STR(err, "a signed deployment token is required");
    CHECK(key_is("deployment_abc123", "20250101.1", 0.5, 1));
    /* ... but no claim, or one no key could hold, is no deployment: still 401 */
    set(PL_HDR_DEPLOYMENT_ID, mint("wrong-secret", "{\"deployment_version\":\"1\"}"));
    CHECK_EQ(key_of(ENFORCE), -EACCES);
    CHECK_STR(err, "invalid deployment token");
    CHECK_EQ(key.deployment_len, 0);
    set(PL_HDR_DEPLOYMENT_ID, mint("wrong-secret", CLAIMS("dep\\u0007", "20250101.1")));
    CHECK_EQ(key_of(ENFORCE), -EACCES);
    CHECK_STR(err, "invalid deployment token");
    CHECK_EQ(key.deployment_len, 0);
    /* malformed headers are 400 before any token is looked at */
    set(PL_HDR_MACHINE_CPU, "lots");
    CHECK_EQ(key_of(ENFORCE), -EINVAL);
    CHECK_EQ(token, PL_TOKEN_UNCHECKED);
}

/* What each poll's deployment id was found to be, as its waiter's tag. */
static void test_trust_tags(void)
{
    good();
    CHECK_EQ(key_of(OFF), 0);
    CHECK_EQ(pl_poll_trust(token, &claims, &key, &req), PL_POLL_TRUST_BARE);
    set(PL_HDR_DEPLOYMENT_ID, mint("any-secret", CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(OFF), 0); /* a claim read, not verified */
    CHECK_EQ(pl_poll_trust(token, &claims, &key, &req), PL_POLL_TRUST_UNKNOWN);
    CHECK_EQ(key_of(LOG), 0); /* verified: a wrong secret */
    CHECK_EQ(pl_poll_trust(token, &claims, &key, &req), PL_POLL_TRUST_INVALID);
    set(PL_HDR_DEPLOYMENT_ID, mint(SECRET, CLAIMS("deployment_tok", "20250101.1")));
    CHECK_EQ(key_of(LOG), 0);
    CHECK_EQ(pl_poll_trust(token, &claims, &key, &req), PL_POLL_TRUST_CURRENT);
    claims.previous = 1;
    CHECK_EQ(pl_poll_trust(token, &claims, &key, &req), PL_POLL_TRUST_PREVIOUS);
}

static int judged(const pl_config *old, const pl_config *next, unsigned *tag, const char **why)
{
    pl_poll_rejudge r;
    const void *w = "unset";
    int rc;

    pl_poll_rejudge_init(&r, old, next);
    rc = pl_poll_rejudge_one(NULL, tag, &w, &r);
    *why = w;
    return rc;
}

/* A reload's rules applied to the tags: who is refused, with what, and
 * what each tag names after a change of secrets. */
static void test_rejudge(void)
{
    pl_config old, next;
    const char *why;
    unsigned tag;

    memset(&old, 0, sizeof(old));
    strcpy(old.token_secret, "s1");
    old.token_mode = PL_TOKEN_MODE_LOG;
    next = old;
    {
        pl_poll_rejudge r;
        CHECK_EQ(pl_poll_rejudge_init(&r, &old, &next), 0); /* nothing tightens */
    }
    /* enforce turned on: valid ones stay, the rest are refused */
    next.token_mode = PL_TOKEN_MODE_ENFORCE;
    tag = PL_POLL_TRUST_CURRENT;
    CHECK_EQ(judged(&old, &next, &tag, &why), 0);
    CHECK_EQ(tag, PL_POLL_TRUST_CURRENT);
    tag = PL_POLL_TRUST_BARE;
    CHECK(judged(&old, &next, &tag, &why) && strcmp(why, "a signed deployment token is required") == 0);
    tag = PL_POLL_TRUST_INVALID;
    CHECK(judged(&old, &next, &tag, &why) && strcmp(why, "invalid deployment token") == 0);
    tag = PL_POLL_TRUST_UNKNOWN; /* never verified: closed, asked again */
    CHECK(judged(&old, &next, &tag, &why) && why == NULL);
    /* a rotation under enforce: s1 becomes the previous secret, s2 new */
    old.token_mode = PL_TOKEN_MODE_ENFORCE;
    strcpy(next.token_secret, "s2");
    strcpy(next.token_secret_previous, "s1");
    tag = PL_POLL_TRUST_CURRENT;
    CHECK_EQ(judged(&old, &next, &tag, &why), 0);
    CHECK_EQ(tag, PL_POLL_TRUST_PREVIOUS);
    tag = PL_POLL_TRUST_INVALID; /* a new secret may verify it */
    CHECK(judged(&old, &next, &tag, &why) && why == NULL);
    /* s1 dropped: what it signed is invalid now */
    next.token_secret_previous[0] = '\0';
    tag = PL_POLL_TRUST_CURRENT;
    CHECK(judged(&old, &next, &tag, &why) && strcmp(why, "invalid deployment token") == 0);
    /* new secrets under log: tags follow, nobody is refused */
    next.token_mode = PL_TOKEN_MODE_LOG;
    tag = PL_POLL_TRUST_CURRENT;
    CHECK_EQ(judged(&old, &next, &tag, &why), 0);
    CHECK_EQ(tag, PL_POLL_TRUST_INVALID);
}

/* A poll near its controller's end is passed over: the margin is the
 * path's (two round trips, four deviations) and 10 ms; unknown, 1 ms. */
static void test_expiring(void)
{
    CHECK(!pl_poll_expiring(0, 0, 30000, 1000, 0));
    CHECK(!pl_poll_expiring(0, 29987, 30000, 1000, 0));     /* 29987 + 12 < 30000 */
    CHECK(pl_poll_expiring(0, 29988, 30000, 1000, 0));
    CHECK(pl_poll_expiring(0, 29988, 30000, 0, 0));          /* unknown: as 1 ms */
    CHECK(!pl_poll_expiring(0, 29749, 30000, 100000, 10000)); /* margin 250 */
    CHECK(pl_poll_expiring(0, 29750, 30000, 100000, 10000));
    CHECK(pl_poll_expiring(1000, 40000, 30000, 1000, 0));    /* past it */
    CHECK(!pl_poll_expiring(1000, 1000, 30000, 1000, 0));
}

int main(void)
{
    verifier = pl_token_verifier_new((const unsigned char *)SECRET, strlen(SECRET));
    CHECK(verifier != NULL);
    RUN(test_the_key);
    RUN(test_missing_or_empty_names_the_header);
    RUN(test_numbers);
    RUN(test_lengths);
    RUN(test_text_no_dispatch_could_name);
    RUN(test_text_at_every_offset);
    RUN(test_token_off);
    RUN(test_token_logged);
    RUN(test_token_enforced);
    RUN(test_trust_tags);
    RUN(test_rejudge);
    pl_token_verifier_free(verifier);
    RUN(test_expiring);
    return unit_finish();
}
