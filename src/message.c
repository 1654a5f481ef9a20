/* message.c -- a dispatch body: the strict JSON reader finds the key fields
 * and the payload bytes; this checks and reads them. */
#include <stdio.h>
#include <string.h>

#include "pilotlight/json.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/utf8.h"

/* The values read, by member names from the document (found[] follows this
 * table). */
enum { DM, DEPLOYMENT, WORKER, RUN, MACHINE, FRIENDLY_ID, VERSION, CPU, MEMORY, NPATHS };

static const pl_json_path paths[NPATHS] = {
    [DM] = {PL_JSON_ROOT, 15, "dequeuedMessage"},
    [DEPLOYMENT] = {1 + DM, 10, "deployment"},
    [WORKER] = {1 + DM, 16, "backgroundWorker"},
    [RUN] = {1 + DM, 3, "run"},
    [MACHINE] = {1 + RUN, 7, "machine"},
    [FRIENDLY_ID] = {1 + DEPLOYMENT, 10, "friendlyId"},
    [VERSION] = {1 + WORKER, 7, "version"},
    [CPU] = {1 + MACHINE, 3, "cpu"},
    [MEMORY] = {1 + MACHINE, 6, "memory"},
};

static char errbuf[160];
static const char out_of_memory[] = "out of memory";

/* A key string as JavaScript reads it: escapes decoded (into <buf>, which
 * has room), but never to a NUL (a C reading ends there, and a header
 * cannot carry one) or a lone surrogate (not text a header can carry). */
static const char *read_string(const pl_json_value *v, char *buf, const char **s, size_t *len,
                               const char *err_type, const char *err_char,
                               const char *err_long)
{
    if (v->type != PL_JSON_STRING || v->len == 0)
        return err_type;
    *s = v->p;
    *len = v->len;
    if (v->escaped) {
        *len = (size_t)pl_json_string(v, buf, v->len);
        *s = buf;
        if (!pl_json_is_text(buf, *len))
            return err_char;
    }
    return *len > PL_KEY_FIELD_MAX ? err_long : NULL;
}

static const char *read_number(const pl_json_value *v, double *out, const char *err)
{
    if (pl_json_number(v, out) != 0)
        return err;
    if (*out == 0)
        *out = 0; /* -0 is the key 0 */
    return NULL;
}

#define FIELD(a, b) "dequeuedMessage." a "." b

static const char *read_key(const pl_json_value *found, pl_message *m)
{
    pl_key *k = &m->key;
    const pl_json_value *dep = &found[FRIENDLY_ID], *ver = &found[VERSION];
    size_t need = (dep->escaped ? dep->len : 0) + (ver->escaped ? ver->len : 0);
    const char *err;

    if (need > 0 && (m->owned = pl_malloc(need)) == NULL)
        return out_of_memory;
    err = read_string(dep, m->owned, &k->deployment, &k->deployment_len,
                      FIELD("deployment", "friendlyId") " must be a non-empty string",
                      FIELD("deployment", "friendlyId") " must not contain \\\\u0000 or a lone surrogate",
                      FIELD("deployment", "friendlyId") " is too long");
    if (err == NULL)
        err = read_string(ver, dep->escaped ? m->owned + dep->len : m->owned,
                          &k->version, &k->version_len,
                          FIELD("backgroundWorker", "version") " must be a non-empty string",
                          FIELD("backgroundWorker", "version") " must not contain \\\\u0000 or a lone surrogate",
                          FIELD("backgroundWorker", "version") " is too long");
    if (err == NULL)
        err = read_number(&found[CPU], &k->cpu, FIELD("run.machine", "cpu") " must be a number");
    if (err == NULL)
        err = read_number(&found[MEMORY], &k->memory,
                          FIELD("run.machine", "memory") " must be a number");
    return err;
}

/* The first units of the name <s>,<len> as written (valid JSON string
 * content), never cutting an escape or a UTF-8 sequence: at most <max>. */
static int name_prefix(const char *s, size_t len, size_t max)
{
    size_t n = 0;

    while (n < len) {
        size_t u = 1;

        if (s[n] == '\\')
            u = s[n + 1] == 'u' ? 6 : 2;
        else if ((unsigned char)s[n] >= 0x80)
            u = pl_utf8_len((const unsigned char *)s + n, len - n);
        if (n + u > max)
            break;
        n += u;
    }
    return (int)n;
}

int pl_message_parse(const char *body, size_t len, pl_message *m,
                     const char **err)
{
    pl_json_value found[NPATHS];
    pl_json_doc doc;
    int rc;

    memset(m, 0, sizeof(*m));
    rc = pl_json_read(body, len, 0, paths, NPATHS, found, &doc);
    if (rc == PL_JSON_ENOMEM) {
        *err = out_of_memory;
        return PL_MESSAGE_ENOMEM;
    }
    if (rc == PL_JSON_EINVAL) {
        snprintf(errbuf, sizeof(errbuf), "request body is not valid JSON: %s at byte %zu",
                 doc.error, doc.error_at);
        *err = errbuf;
        return PL_MESSAGE_EINVAL;
    }
    if (rc == PL_JSON_EDUP) {
        int n = name_prefix(doc.dup, doc.dup_len, 64);

        snprintf(errbuf, sizeof(errbuf), "duplicate member name \\\"%.*s\\\"%s", n, doc.dup,
                 (size_t)n < doc.dup_len ? " (cut)" : "");
        *err = errbuf;
        return PL_MESSAGE_EINVAL;
    }
    if (found[DM].type != PL_JSON_OBJECT) {
        *err = "dequeuedMessage must be an object";
        return PL_MESSAGE_EINVAL;
    }
    if ((*err = read_key(found, m)) != NULL) {
        pl_message_release(m);
        return *err == out_of_memory ? PL_MESSAGE_ENOMEM : PL_MESSAGE_EINVAL;
    }
    m->payload = found[DM].p;
    m->payload_len = found[DM].len;
    return 0;
}

void pl_message_release(pl_message *m)
{
    pl_free(m->owned);
    memset(m, 0, sizeof(*m));
}
