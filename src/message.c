/* message.c -- validating a dispatch body and finding its payload bytes. */
#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "pilotlight/mem.h"
#include "pilotlight/message.h"

/* cJSON allocates a node per value and a copy per string; a dispatch body
 * is parsed, read and freed within one request, so those come from a bump
 * arena instead of malloc, reset when its last allocation is freed (trees
 * may nest: the arena just grows until all are gone). What does not fit
 * goes to pl_malloc. */
static struct {
    _Alignas(16) char buf[32768];
    size_t used, live;
} arena;

static void *json_alloc(size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n <= sizeof(arena.buf) - arena.used) {
        void *p = arena.buf + arena.used;
        arena.used += n;
        arena.live++;
        return p;
    }
    return pl_malloc(n);
}

static void json_free(void *p)
{
    if ((char *)p >= arena.buf && (char *)p < arena.buf + sizeof(arena.buf)) {
        if (--arena.live == 0)
            arena.used = 0;
        return;
    }
    pl_free(p);
}

void pl_message_init(void)
{
    cJSON_Hooks hooks = {json_alloc, json_free};
    cJSON_InitHooks(&hooks);
}

/* cJSON skips every byte up to 0x20 as whitespace: so must we, or the bytes
 * we hand over would differ from what it validated. */
static int is_ws(char c)
{
    return (unsigned char)c <= 0x20;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && is_ws(*p))
        p++;
    return p;
}

/* <p> is at an opening quote of a string in valid JSON; returns the byte
 * after its closing quote and sets *escaped if it held a backslash or a raw
 * NUL (where cJSON would end a member name early). */
static const char *skip_string(const char *p, const char *end, int *escaped)
{
    for (p++; p < end && *p != '"'; p++) {
        if (*p == '\0')
            *escaped = 1;
        if (*p == '\\') {
            *escaped = 1;
            p++;
        }
    }
    return p + 1;
}

/* <p> is at the start of a value in valid JSON; returns the byte after it. */
static const char *skip_value(const char *p, const char *end)
{
    int depth = 0, escaped = 0;

    if (*p == '"')
        return skip_string(p, end, &escaped);
    if (*p != '{' && *p != '[') { /* a number or a literal */
        while (p < end && *p != ',' && *p != '}' && *p != ']' && !is_ws(*p))
            p++;
        return p;
    }
    do {
        if (*p == '"') {
            p = skip_string(p, end, &escaped);
            continue;
        }
        if (*p == '{' || *p == '[')
            depth++;
        else if (*p == '}' || *p == ']')
            depth--;
        p++;
    } while (p < end && depth > 0);
    return p;
}

/* Finds the bytes of the top-level member "dequeuedMessage" in <body>, which
 * cJSON has already accepted. Returns 0, or -1 when a member name before it
 * is escaped (it could spell the same name: let cJSON decide instead). */
static int find_payload(const char *body, size_t len, pl_message *m)
{
    static const char name[] = "dequeuedMessage";
    const char *end = body + len, *p = skip_ws(body, end);

    for (p = skip_ws(p + 1, end); p < end && *p == '"'; ) {
        const char *k = p + 1, *v;
        size_t klen;
        int escaped = 0;

        p = skip_string(p, end, &escaped);
        if (escaped)
            return -1;
        klen = (size_t)(p - 1 - k);
        p = skip_ws(p, end);
        v = skip_ws(p + 1, end); /* past the colon */
        p = skip_value(v, end);
        if (klen == sizeof(name) - 1 && memcmp(k, name, klen) == 0) {
            m->payload = v;
            m->payload_len = (size_t)(p - v);
            return 0;
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',')
            p = skip_ws(p + 1, end);
    }
    return -1;
}

/* Reads a non-empty string at <obj>.<a>.<b>; NULL if absent or not one. */
static const cJSON *get_path(const cJSON *obj, const char *a, const char *b,
                             const char *c)
{
    obj = cJSON_GetObjectItemCaseSensitive(obj, a);
    obj = cJSON_GetObjectItemCaseSensitive(obj, b);
    return c ? cJSON_GetObjectItemCaseSensitive(obj, c) : obj;
}

static const char *read_string(const cJSON *v, const char **s, size_t *len,
                               const char *err_type, const char *err_long)
{
    if (!cJSON_IsString(v) || v->valuestring[0] == '\0')
        return err_type;
    *s = v->valuestring;
    *len = strlen(v->valuestring);
    return *len > PL_KEY_FIELD_MAX ? err_long : NULL;
}

static const char *read_number(const cJSON *v, double *out, const char *err)
{
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return err;
    *out = v->valuedouble == 0 ? 0 : v->valuedouble;
    return NULL;
}

static const char *read_key(const cJSON *dm, pl_key *k)
{
    const char *err;

    err = read_string(get_path(dm, "deployment", "friendlyId", NULL),
                      &k->deployment, &k->deployment_len,
                      "dequeuedMessage.deployment.friendlyId must be a non-empty string",
                      "dequeuedMessage.deployment.friendlyId is too long");
    if (err == NULL)
        err = read_string(get_path(dm, "backgroundWorker", "version", NULL),
                          &k->version, &k->version_len,
                          "dequeuedMessage.backgroundWorker.version must be a non-empty string",
                          "dequeuedMessage.backgroundWorker.version is too long");
    if (err == NULL)
        err = read_number(get_path(dm, "run", "machine", "cpu"), &k->cpu,
                          "dequeuedMessage.run.machine.cpu must be a number");
    if (err == NULL)
        err = read_number(get_path(dm, "run", "machine", "memory"), &k->memory,
                          "dequeuedMessage.run.machine.memory must be a number");
    return err;
}

int pl_message_parse(const char *body, size_t len, pl_message *m,
                     const char **err)
{
    const char *parse_end = NULL;
    cJSON *root, *dm;

    memset(m, 0, sizeof(*m));
    root = cJSON_ParseWithLengthOpts(body, len, &parse_end, 0);
    if (root != NULL && skip_ws(parse_end, body + len) != body + len) {
        cJSON_Delete(root); /* trailing bytes after the document */
        root = NULL;
    }
    if (root == NULL) {
        *err = "request body is not valid JSON";
        return PL_MESSAGE_EINVAL;
    }
    dm = cJSON_GetObjectItemCaseSensitive(root, "dequeuedMessage");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(dm)) {
        *err = "dequeuedMessage must be an object";
        cJSON_Delete(root);
        return PL_MESSAGE_EINVAL;
    }
    *err = read_key(dm, &m->key);
    if (*err != NULL) {
        cJSON_Delete(root);
        return PL_MESSAGE_EINVAL;
    }
    m->root = root;
    if (find_payload(body, len, m) != 0) {
        m->owned = cJSON_PrintUnformatted(dm);
        if (m->owned == NULL) {
            cJSON_Delete(root);
            return PL_MESSAGE_ENOMEM;
        }
        m->payload = m->owned;
        m->payload_len = strlen(m->owned);
    }
    return 0;
}

void pl_message_release(pl_message *m)
{
    cJSON_Delete(m->root);
    cJSON_free(m->owned);
    memset(m, 0, sizeof(*m));
}
