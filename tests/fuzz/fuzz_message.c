/* fuzz_message.c -- libFuzzer target for the dispatch body parser.
 *
 * The whole input is a POST /warm-start body given to pl_message_parse().
 * On success:
 *   - the key is well formed (non-empty strings within PL_KEY_FIELD_MAX,
 *     finite numbers);
 *   - the payload is either a span of the input (the dequeuedMessage value's
 *     own bytes) or the parser's re-serialisation (m.owned);
 *   - the payload parses with cJSON, alone and whole, as a JSON object that
 *     is the same document as the dequeuedMessage the parser read (compared
 *     by cJSON's serialisation of both trees, which keeps duplicate names);
 *   - wrapped again as {"dequeuedMessage":PAYLOAD}, it parses to the same
 *     key (numbers within cJSON's printing tolerance when the payload is
 *     a re-serialisation), with the payload taken back byte for byte.
 * On failure, the error names something and nothing needs releasing.
 * Then the same input is parsed with an allocation failure injected (the
 * (1 + size % 13)th allocation, sticky for odd sizes): the answer must be
 * the first one, out of memory, or "not valid JSON" (cJSON's own failed
 * allocation), and nothing may leak.
 *
 * Build: meson -Dfuzzing=true (tests/fuzz/meson.build); run: tests/fuzz/run.sh. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "pilotlight/key.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"

#define CHECK(c)                        \
    do {                                \
        if (!(c))                       \
            check_failed(#c, __LINE__); \
    } while (0)

static void check_failed(const char *what, int line)
{
    fprintf(stderr, "fuzz_message.c:%d: check failed: %s\n", line, what);
    abort();
}

/* cJSON prints a number with 15 significant digits when that reads back
 * within its own tolerance (|a - b| <= max(|a|, |b|) * DBL_EPSILON), so a
 * re-serialised payload (m.owned) may carry a neighbouring double. */
static int near(double a, double b)
{
    double m = fabs(a) > fabs(b) ? fabs(a) : fabs(b);
    return a == b || fabs(a - b) <= m * 2 * DBL_EPSILON;
}

/* <loose>: numbers may differ as cJSON's printing allows. */
static int key_equal(const pl_key *a, const pl_key *b, int loose)
{
    return a->deployment_len == b->deployment_len &&
           memcmp(a->deployment, b->deployment, a->deployment_len) == 0 &&
           a->version_len == b->version_len &&
           memcmp(a->version, b->version, a->version_len) == 0 &&
           (loose ? near(a->cpu, b->cpu) && near(a->memory, b->memory)
                  : a->cpu == b->cpu && a->memory == b->memory);
}

static void check_key(const pl_key *k)
{
    CHECK(k->deployment != NULL && k->deployment_len > 0 &&
          k->deployment_len <= PL_KEY_FIELD_MAX);
    CHECK(k->version != NULL && k->version_len > 0 && k->version_len <= PL_KEY_FIELD_MAX);
    CHECK(isfinite(k->cpu) && isfinite(k->memory));
    CHECK(!signbit(k->cpu) || k->cpu != 0);     /* -0 reads as 0 */
    CHECK(!signbit(k->memory) || k->memory != 0);
}

/* The payload must be the dequeuedMessage object the parser read. */
static void check_payload(const pl_message *m, const char *body, size_t size)
{
    const cJSON *dm = cJSON_GetObjectItemCaseSensitive((const cJSON *)m->root, "dequeuedMessage");
    const char *end = NULL;
    cJSON *again;
    char *a, *b;

    if (m->owned == NULL)
        CHECK(m->payload >= body && m->payload + m->payload_len <= body + size);
    else
        CHECK(m->payload == m->owned && strlen(m->owned) == m->payload_len);
    CHECK(cJSON_IsObject(dm));
    again = cJSON_ParseWithLengthOpts(m->payload, m->payload_len, &end, 0);
    CHECK(again != NULL && cJSON_IsObject(again));
    CHECK(end == m->payload + m->payload_len); /* the value, exactly */
    a = cJSON_PrintUnformatted(dm);
    b = cJSON_PrintUnformatted(again);
    CHECK(a != NULL && b != NULL && strcmp(a, b) == 0);
    cJSON_free(a);
    cJSON_free(b);
    cJSON_Delete(again);
}

/* {"dequeuedMessage":PAYLOAD} must give back the same key and payload. */
static void check_rewrap(const pl_message *m)
{
    static const char head[] = "{\"dequeuedMessage\":";
    size_t hl = sizeof(head) - 1, n = hl + m->payload_len + 1;
    char *body = malloc(n);
    const char *err = NULL;
    pl_message m2;

    CHECK(body != NULL);
    memcpy(body, head, hl);
    memcpy(body + hl, m->payload, m->payload_len);
    body[n - 1] = '}';
    CHECK(pl_message_parse(body, n, &m2, &err) == 0);
    CHECK(key_equal(&m->key, &m2.key, m->owned != NULL));
    CHECK(m2.owned == NULL && m2.payload == body + hl && m2.payload_len == m->payload_len);
    pl_message_release(&m2);
    free(body);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    pl_message_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data, *err = NULL, *err2 = NULL;
    pl_message m, m2;
    int rc, rc2;

    rc = pl_message_parse(body, size, &m, &err);
    if (rc == 0) {
        CHECK(m.root != NULL && m.payload != NULL);
        check_key(&m.key);
        check_payload(&m, body, size);
        check_rewrap(&m);
    } else {
        CHECK(rc == PL_MESSAGE_EINVAL); /* no allocation fails here */
        CHECK(err != NULL && err[0] != '\0');
    }

    pl_mem_fail_after(1 + size % 13, (int)(size & 1));
    rc2 = pl_message_parse(body, size, &m2, &err2);
    pl_mem_fail_after(0, 0);
    if (rc2 == 0) {
        CHECK(rc == 0);
        CHECK(key_equal(&m.key, &m2.key, 0));
        CHECK(m2.payload_len == m.payload_len &&
              memcmp(m2.payload, m.payload, m.payload_len) == 0);
        pl_message_release(&m2);
    } else if (rc2 == PL_MESSAGE_EINVAL) {
        CHECK(err2 != NULL);
        CHECK((rc != 0 && strcmp(err, err2) == 0) ||
              strcmp(err2, "request body is not valid JSON") == 0);
    } else {
        CHECK(rc2 == PL_MESSAGE_ENOMEM);
    }
    if (rc == 0)
        pl_message_release(&m);
    return 0;
}
