/* fuzz_message.c -- libFuzzer target for the dispatch body parser, with
 * Jansson (a strict RFC 8259 decoder) as the oracle.
 *
 * The whole input is a POST /warm-start body given to pl_message_parse().
 * Jansson decodes it with JSON_REJECT_DUPLICATES (no member name twice in
 * an object) after one rewrite: Jansson refuses \u0000 and lone surrogate
 * escapes, which JavaScript reads, so each is first replaced by the escape
 * of its own plane-15 private-use character (an injective rewrite: equal
 * names stay equal, different ones different); and Jansson skips raw NUL
 * bytes, so each becomes 0x01, which is as invalid as NUL everywhere.
 *
 * On success:
 *   - the key is well formed (non-empty strings within PL_KEY_FIELD_MAX,
 *     finite numbers, no -0), and the payload is a span of the input;
 *   - Jansson accepts the body: accepted => strict RFC 8259 without
 *     duplicate names;
 *   - the key is what Jansson reads: friendlyId and version byte for byte,
 *     cpu and memory the same doubles;
 *   - the payload alone decodes with Jansson to the value Jansson read as
 *     dequeuedMessage (json_equal);
 *   - wrapped again as {"dequeuedMessage":PAYLOAD} it parses to the same key
 *     and the same payload bytes.
 * On failure, the error names something and nothing needs releasing; and
 * when Jansson accepts the body, the error is one of pilotlight's own rules
 * (the key fields, dequeuedMessage's type, nesting), never "not valid JSON"
 * or a duplicate name.
 * Not compared: bodies holding a number beyond the double range (JavaScript
 * reads Infinity, Jansson refuses) or raw plane-15 characters that could
 * meet the rewrite's.
 * Then the same input is parsed with an allocation failure injected (the
 * (1 + size % 13)th allocation, sticky for odd sizes): the answer must be
 * the first one or out of memory, and nothing may leak.
 *
 * Build: meson -Dfuzzing=true (tests/fuzz/meson.build); run: tests/fuzz/run.sh. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

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

static int key_equal(const pl_key *a, const pl_key *b)
{
    return a->deployment_len == b->deployment_len &&
           memcmp(a->deployment, b->deployment, a->deployment_len) == 0 &&
           a->version_len == b->version_len &&
           memcmp(a->version, b->version, a->version_len) == 0 &&
           a->cpu == b->cpu && a->memory == b->memory;
}

static void check_key(const pl_key *k)
{
    CHECK(k->deployment != NULL && k->deployment_len > 0 &&
          k->deployment_len <= PL_KEY_FIELD_MAX);
    CHECK(k->version != NULL && k->version_len > 0 && k->version_len <= PL_KEY_FIELD_MAX);
    CHECK(isfinite(k->cpu) && isfinite(k->memory));
    CHECK(!signbit(k->cpu) || k->cpu != 0); /* -0 reads as 0 */
    CHECK(!signbit(k->memory) || k->memory != 0);
}

static int hex4(const char *p, unsigned *out)
{
    char buf[5];
    char *end;

    memcpy(buf, p, 4);
    buf[4] = '\0';
    if (strspn(buf, "0123456789abcdefABCDEF") != 4)
        return 0;
    *out = (unsigned)strtoul(buf, &end, 16);
    return 1;
}

/* The rewrite described above; <out> has room for 2 * <len>. */
static size_t for_jansson(const char *in, size_t len, char *out)
{
    size_t i = 0, o = 0;
    unsigned u, lo;

    while (i < len) {
        if (in[i] == '\0') {
            out[o++] = '\x01'; /* invalid anywhere, as NUL is: Jansson skips raw NULs */
            i++;
        } else if (in[i] != '\\' || i + 1 == len) {
            out[o++] = in[i++];
        } else if (in[i + 1] != 'u' || len - i < 6 || !hex4(in + i + 2, &u)) {
            out[o++] = in[i++]; /* a two-byte escape, or not one at all */
            out[o++] = in[i++];
        } else if (u >= 0xD800 && u <= 0xDBFF && len - i >= 12 && in[i + 6] == '\\' &&
                   in[i + 7] == 'u' && hex4(in + i + 8, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
            memcpy(out + o, in + i, 12); /* a pair: Jansson reads it */
            o += 12;
            i += 12;
        } else if (u == 0 || (u >= 0xD800 && u <= 0xDFFF)) {
            unsigned cp = 0xF0000 + (u == 0 ? 0x800 : u - 0xD800) - 0x10000;
            char esc[13];

            snprintf(esc, sizeof(esc), "\\u%04X\\u%04X", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            memcpy(out + o, esc, 12);
            o += 12;
            i += 6;
        } else {
            memcpy(out + o, in + i, 6);
            o += 6;
            i += 6;
        }
    }
    return o;
}

/* Jansson's reading of <s> (after the rewrite), or NULL with *err. */
static json_t *jansson(const char *s, size_t len, json_error_t *err)
{
    char *buf = malloc(2 * len + 1);
    json_t *v;

    CHECK(buf != NULL);
    v = json_loadb(buf, for_jansson(s, len, buf),
                   JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, err);
    free(buf);
    return v;
}

static const json_t *path(const json_t *v, const char *a, const char *b, const char *c)
{
    v = json_object_get(json_object_get(v, a), b);
    return c ? json_object_get(v, c) : v;
}

static int same_string(const json_t *v, const char *s, size_t len)
{
    return json_is_string(v) && json_string_length(v) == len &&
           memcmp(json_string_value(v), s, len) == 0;
}

static int same_number(const json_t *v, double d)
{
    double j = json_real_value(v);

    return json_is_real(v) && (j == 0 ? 0 : j) == d;
}

static void check_oracle(const pl_message *m, const json_t *doc)
{
    const json_t *dm = json_object_get(doc, "dequeuedMessage");
    json_error_t jerr;
    json_t *alone;

    CHECK(json_is_object(doc) && json_is_object(dm));
    CHECK(same_string(path(dm, "deployment", "friendlyId", NULL), m->key.deployment,
                      m->key.deployment_len));
    CHECK(same_string(path(dm, "backgroundWorker", "version", NULL), m->key.version,
                      m->key.version_len));
    CHECK(same_number(path(dm, "run", "machine", "cpu"), m->key.cpu));
    CHECK(same_number(path(dm, "run", "machine", "memory"), m->key.memory));
    alone = jansson(m->payload, m->payload_len, &jerr);
    CHECK(alone != NULL && json_equal(alone, dm));
    json_decref(alone);
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
    CHECK(key_equal(&m->key, &m2.key));
    CHECK(m2.payload == body + hl && m2.payload_len == m->payload_len);
    pl_message_release(&m2);
    free(body);
}

/* An error of pilotlight's own rules, on JSON that is valid and unambiguous. */
static int own_rule(const char *err)
{
    return strncmp(err, "dequeuedMessage", 15) == 0 || strstr(err, "nested too deeply") != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data, *err = NULL, *err2 = NULL;
    char errcopy[256] = "";
    pl_message m, m2;
    json_error_t jerr;
    json_t *doc;
    int rc, rc2, compare;

    rc = pl_message_parse(body, size, &m, &err);
    doc = jansson(body, size, &jerr);
    compare = memmem(body, size, "\xf3\xb0", 2) == NULL &&
              (doc != NULL || strstr(jerr.text, "real number overflow") == NULL);
    if (rc == 0) {
        CHECK(m.payload != NULL);
        CHECK(m.payload >= body && m.payload + m.payload_len <= body + size);
        check_key(&m.key);
        if (compare) {
            CHECK(doc != NULL); /* accepted => strict RFC 8259, no duplicate names */
            check_oracle(&m, doc);
        }
        check_rewrap(&m);
    } else {
        CHECK(rc == PL_MESSAGE_EINVAL); /* no allocation fails here */
        CHECK(err != NULL && err[0] != '\0');
        snprintf(errcopy, sizeof(errcopy), "%s", err);
        if (compare && doc != NULL && !own_rule(err)) {
            fprintf(stderr, "refused valid JSON: %s\n", err);
            CHECK(!"Jansson accepts what pilotlight calls invalid JSON");
        }
    }
    json_decref(doc);

    pl_mem_fail_after(1 + size % 13, (int)(size & 1));
    rc2 = pl_message_parse(body, size, &m2, &err2);
    pl_mem_fail_after(0, 0);
    if (rc2 == 0) {
        CHECK(rc == 0);
        CHECK(key_equal(&m.key, &m2.key));
        CHECK(m2.payload == m.payload && m2.payload_len == m.payload_len);
        pl_message_release(&m2);
    } else if (rc2 == PL_MESSAGE_EINVAL) {
        CHECK(rc != 0 && strcmp(errcopy, err2) == 0);
    } else {
        CHECK(rc2 == PL_MESSAGE_ENOMEM);
    }
    if (rc == 0)
        pl_message_release(&m);
    return 0;
}
