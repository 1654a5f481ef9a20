/* message.c -- one strict pass over a dispatch body: validate it, read the
 * key, find the payload bytes. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "pilotlight/hash.h"
#include "pilotlight/mem.h"
#include "pilotlight/message.h"
#include "pilotlight/utf8.h"

/* Where a value sits on the way to a key field. */
enum {
    AT_OTHER, AT_ROOT, AT_DM, AT_DEPLOYMENT, AT_WORKER, AT_RUN, AT_MACHINE,
    AT_FRIENDLY_ID, AT_VERSION, AT_CPU, AT_MEMORY,
};

static const struct {
    uint8_t from, to, len;
    const char *name;
} edges[] = {
    {AT_ROOT, AT_DM, 15, "dequeuedMessage"},
    {AT_DM, AT_DEPLOYMENT, 10, "deployment"},
    {AT_DM, AT_WORKER, 16, "backgroundWorker"},
    {AT_DM, AT_RUN, 3, "run"},
    {AT_RUN, AT_MACHINE, 7, "machine"},
    {AT_DEPLOYMENT, AT_FRIENDLY_ID, 10, "friendlyId"},
    {AT_WORKER, AT_VERSION, 7, "version"},
    {AT_MACHINE, AT_CPU, 3, "cpu"},
    {AT_MACHINE, AT_MEMORY, 6, "memory"},
};

/* A value's type as the key reader cares about it. */
enum { T_NONE, T_STRING, T_ESCAPED, T_NUMBER, T_OBJECT, T_OTHER };

typedef struct {
    const char *p; /* a string's bytes between its quotes, a number's token */
    size_t len;
    int type;
} found;

/* One member name: its decoded bytes, the object it belongs to, and the
 * previous name of that object (index + 1, 0 for none). Most objects are
 * small: their names are checked against each other along that chain,
 * which touches only this array, and only when the object's filter says
 * one of them may match. Past LINEAR_NAMES names an object's names
 * also go into the open-addressing table (slot: index + 1 there, 0 when
 * not in it, so the table can be cleared by name). */
typedef struct {
    const char *s;
    uint32_t len, obj, prev, hash, slot;
} name;

#define LINEAR_NAMES 16

/* The object whose members are being read; <seen> has one bit set per
 * name, chosen by its length, first and last byte. */
typedef struct {
    uint32_t id, last, count;
    uint64_t seen;
} object_names;

/* Typical bodies (a few hundred names) never touch the heap: the scratch
 * lives here and is cleared name by name after each parse. A body with more
 * names, or more escaped name bytes, gets heap scratch freed before
 * pl_message_parse() returns. */
#define SMALL_NAMES 1024
static name small_names[SMALL_NAMES];
static uint32_t small_slots[2 * SMALL_NAMES]; /* index + 1 into names, 0 free */
static char small_dec[4096];
static char errbuf[160];
static const char out_of_memory[] = "out of memory";

typedef struct {
    const char *body, *p, *end;
    const char *bad, *bad_at; /* the first syntax error and where */
    const char *dup;          /* the first duplicate name, as written */
    size_t dup_len;
    int nomem, depth;
    uint32_t nobj, nnames, cap; /* cap names, 2 * cap slots */
    name *names;
    uint32_t *slots;
    char *dec;
    size_t dec_used, dec_cap;
    found dm, field[4]; /* friendlyId, version, cpu, memory */
} reader;

static int fail(reader *r, const char *what)
{
    if (r->bad == NULL) {
        r->bad = what;
        r->bad_at = r->p;
    }
    return -1;
}

/* JSON's four whitespace bytes, and nothing else (cJSON took every byte up
 * to 0x20; JSON.parse does not). */
static void skip_ws(reader *r)
{
    const char *p = r->p;

    if (p < r->end && (unsigned char)*p > ' ')
        return; /* the usual case: compact JSON */
    while (p < r->end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    r->p = p;
}

static int is_digit(const char *p, const char *end)
{
    return p < end && *p >= '0' && *p <= '9';
}

/* Reads four hex digits at <p> (which has them). Returns -1 if not hex. */
static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;

    for (int i = 0; i < 4; i++) {
        unsigned c = (unsigned char)p[i], d;

        if (c >= '0' && c <= '9')
            d = c - '0';
        else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
            d = (c | 0x20) - 'a' + 10;
        else
            return -1;
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

/* 1 for a byte a string holds as it is: printable ASCII but '"' and '\\'.
 * (One load per byte: most of a body is string bytes.) */
#define ROW(x) x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x
static const unsigned char plain[256] = {
    ROW(0), ROW(0),                                 /* 0x00-0x1f */
    1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x20-0x2f: '"' */
    ROW(1), ROW(1),                                 /* 0x30-0x4f */
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, /* 0x50-0x5f: '\\' */
    ROW(1), ROW(1),                                 /* 0x60-0x7f; the rest 0 */
};
#undef ROW

/* Moves <p> to the first byte at or after it that is not plain (or to
 * <end>). Most of a body is string bytes: on x86-64 they are looked at 16
 * at a time, a signed compare catching both control bytes and bytes above
 * 0x7f, and the first special one is found from the mask. */
static const char *skip_plain(const char *p, const char *end)
{
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\'),
                  space = _mm_set1_epi8(0x20);

    while (end - p >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p);
        unsigned mask = (unsigned)_mm_movemask_epi8(
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                         _mm_cmplt_epi8(v, space)));
        if (mask != 0)
            return p + __builtin_ctz(mask);
        p += 16;
    }
#endif
    while (p < end && plain[(unsigned char)*p])
        p++;
    return p;
}

/* <r->p> is at an opening quote. Validates the string and moves past its
 * closing quote; <s>,<len> are the bytes between the quotes, *esc is set
 * when they hold an escape. Inlined into its two callers: a body is mostly
 * short strings, and the call cost ~2.4 k of a cycle's 36.8 k instructions. */
static inline __attribute__((always_inline)) int string(reader *r, const char **s, size_t *len,
                                                     int *esc)
{
    const char *p = r->p + 1, *end = r->end;
    unsigned u;

    *s = p;
    *esc = 0;
    for (;;) {
        unsigned char c;
        int n;

        p = skip_plain(p, end);
        r->p = p;
        if (p == end)
            return fail(r, "unterminated string");
        c = (unsigned char)*p;
        if (c == '"')
            break;
        if (c == '\\') {
            *esc = 1;
            if (end - p >= 2 && p[1] != '\0' && strchr("\"\\/bfnrt", p[1]) != NULL) {
                p += 2;
                continue;
            }
            if (end - p >= 6 && p[1] == 'u' && hex4(p + 2, &u) == 0) {
                p += 6;
                continue;
            }
            return fail(r, "invalid escape in a string");
        }
        if (c < 0x20)
            return fail(r, "control character in a string");
        n = (int)pl_utf8_len((const unsigned char *)p, (size_t)(end - p));
        if (n == 0)
            return fail(r, "invalid UTF-8 in a string");
        p += n;
    }
    *len = (size_t)(p - *s);
    r->p = p + 1;
    return 0;
}

static size_t put_utf8(char *o, unsigned u)
{
    if (u < 0x80) {
        o[0] = (char)u;
        return 1;
    }
    if (u < 0x800) {
        o[0] = (char)(0xC0 | u >> 6);
        o[1] = (char)(0x80 | (u & 0x3F));
        return 2;
    }
    if (u < 0x10000) { /* lone surrogates too: three bytes each */
        o[0] = (char)(0xE0 | u >> 12);
        o[1] = (char)(0x80 | (u >> 6 & 0x3F));
        o[2] = (char)(0x80 | (u & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | u >> 18);
    o[1] = (char)(0x80 | (u >> 12 & 0x3F));
    o[2] = (char)(0x80 | (u >> 6 & 0x3F));
    o[3] = (char)(0x80 | (u & 0x3F));
    return 4;
}

/* Writes the text of the validated string bytes <s>,<len> to <out> (at most
 * <len> bytes) and returns its length. A surrogate pair becomes one code
 * point, a lone surrogate three bytes of its own: two names decode to the
 * same bytes exactly when JavaScript's strings for them are equal. */
static size_t decode(const char *s, size_t len, char *out)
{
    const char *end = s + len;
    char *o = out;
    unsigned u = 0, lo;

    while (s < end) {
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        if (s[1] != 'u') {
            const char *c = strchr("b\bf\fn\nr\rt\t", s[1]);
            *o++ = c != NULL ? c[1] : s[1];
            s += 2;
            continue;
        }
        hex4(s + 2, &u);
        s += 6;
        if (u >= 0xD800 && u <= 0xDBFF && end - s >= 6 && s[0] == '\\' && s[1] == 'u' &&
            hex4(s + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
            u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            s += 6;
        }
        o += put_utf8(o, u);
    }
    return (size_t)(o - out);
}

static void place(reader *r, uint32_t idx)
{
    uint32_t mask = 2 * r->cap - 1, i = r->names[idx].hash & mask;

    while (r->slots[i] != 0)
        i = (i + 1) & mask;
    r->slots[i] = idx + 1;
    r->names[idx].slot = i + 1;
}

/* Empties the table the cheap way: only the slots names occupy. */
static void clear_small(reader *r)
{
    for (uint32_t i = 0; i < r->nnames; i++)
        if (r->names[i].slot != 0)
            small_slots[r->names[i].slot - 1] = 0;
}

static int grow_names(reader *r)
{
    uint32_t cap = r->cap * 2;
    name *names = pl_malloc(cap * sizeof(*names));
    uint32_t *slots = pl_malloc(2 * (size_t)cap * sizeof(*slots));

    if (names == NULL || slots == NULL) {
        pl_free(names);
        pl_free(slots);
        r->nomem = 1;
        return -1;
    }
    memcpy(names, r->names, r->nnames * sizeof(*names));
    memset(slots, 0, 2 * (size_t)cap * sizeof(*slots));
    if (r->names == small_names) {
        clear_small(r);
    } else {
        pl_free(r->names);
        pl_free(r->slots);
    }
    r->names = names;
    r->slots = slots;
    r->cap = cap;
    for (uint32_t i = 0; i < r->nnames; i++)
        if (names[i].slot != 0)
            place(r, i);
    return 0;
}

static void hash_in(reader *r, uint32_t idx)
{
    name *n = &r->names[idx];

    n->hash = pl_hash(n->s, n->len, (uint64_t)n->obj << 32);
    place(r, idx);
}

static int same(const name *n, const char *s, size_t len)
{
    return n->len == len && memcmp(n->s, s, len) == 0;
}

/* A name's bit in its object's filter: from its length, first and last
 * byte, spread over 64 by a multiply. */
static uint64_t filter_bit(const char *s, size_t len)
{
    uint32_t tag = len == 0 ? 0
                            : (uint32_t)len << 16 ^ (uint32_t)(unsigned char)s[0] << 8 ^
                                  (unsigned char)s[len - 1];

    return 1ULL << (tag * 0x9E3779B1u >> 26);
}

/* Records member name <s>,<len> (decoded) of object <o>; <raw>,<raw_len>
 * is how it was written, kept for the error when it repeats. */
static int remember(reader *r, object_names *o, const char *s, size_t len,
                    const char *raw, size_t raw_len)
{
    const name *dup = NULL;
    uint32_t h = 0;

    if (o->count < LINEAR_NAMES) {
        uint64_t bit = filter_bit(s, len);

        if (o->seen & bit)
            for (uint32_t i = o->last; i != 0 && dup == NULL; i = r->names[i - 1].prev)
                if (same(&r->names[i - 1], s, len))
                    dup = &r->names[i - 1];
        o->seen |= bit;
    } else {
        uint32_t mask = 2 * r->cap - 1;

        /* from now on by hash: the table gets the first ones (once: a
         * duplicate leaves the count where it is) */
        if (o->count == LINEAR_NAMES && r->names[o->last - 1].slot == 0)
            for (uint32_t i = o->last; i != 0; i = r->names[i - 1].prev)
                hash_in(r, i - 1);
        h = pl_hash(s, len, (uint64_t)o->id << 32);
        for (uint32_t i = h & mask; r->slots[i] != 0 && dup == NULL; i = (i + 1) & mask) {
            const name *n = &r->names[r->slots[i] - 1];

            if (n->hash == h && n->obj == o->id && same(n, s, len))
                dup = n;
        }
    }
    if (dup != NULL) {
        if (r->dup == NULL) {
            r->dup = raw;
            r->dup_len = raw_len;
        }
        return 0;
    }
    if (r->nnames == r->cap && grow_names(r) != 0)
        return -1;
    r->names[r->nnames] = (name){s, (uint32_t)len, o->id, o->last, h, 0};
    if (o->count >= LINEAR_NAMES)
        place(r, r->nnames);
    o->last = ++r->nnames;
    o->count++;
    return 0;
}

/* Decodes an escaped name into the scratch. The heap scratch, when the
 * static one is full, is as long as the body: all names together never
 * decode longer than that, so it never moves. */
static const char *decode_name(reader *r, const char *s, size_t *len)
{
    char *out;

    if (r->dec_cap - r->dec_used < *len) {
        if (r->dec != small_dec) {
            r->nomem = 1; /* cannot happen: see above */
            return NULL;
        }
        r->dec = pl_malloc((size_t)(r->end - r->body));
        if (r->dec == NULL) {
            r->nomem = 1;
            return NULL;
        }
        r->dec_cap = (size_t)(r->end - r->body);
        r->dec_used = 0;
    }
    out = r->dec + r->dec_used;
    *len = decode(s, *len, out);
    r->dec_used += *len;
    return out;
}

/* The node a member named <s>,<len> of a value at <at> leads to. */
static int child(int at, const char *s, size_t len)
{
    for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
        if (edges[i].from == at && edges[i].len == len && memcmp(edges[i].name, s, len) == 0)
            return edges[i].to;
    return AT_OTHER;
}

static int value(reader *r, int at, found *f);

/* Past '{' or '[': 1 when a member or element follows, 0 (past <close>)
 * when the container is empty. */
static int enter(reader *r, char close)
{
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    return 1;
}

/* After a member or element: 1 when another follows (past the comma), 0
 * past <close>, -1 for anything else. */
static int more(reader *r, char close, const char *what)
{
    skip_ws(r);
    if (r->p < r->end && *r->p == ',') {
        r->p++;
        skip_ws(r);
        return 1;
    }
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return 0;
    }
    return fail(r, what);
}

static int member(reader *r, int at, object_names *o)
{
    const char *raw, *s;
    size_t raw_len, len;
    int esc, to;
    found f;

    if (r->p == r->end || *r->p != '"')
        return fail(r, "expected a member name");
    if (string(r, &raw, &raw_len, &esc) != 0)
        return -1;
    s = raw;
    len = raw_len;
    if (esc && (s = decode_name(r, raw, &len)) == NULL)
        return -1;
    if (remember(r, o, s, len, raw, raw_len) != 0)
        return -1;
    skip_ws(r);
    if (r->p == r->end || *r->p != ':')
        return fail(r, "expected ':' after a member name");
    r->p++;
    skip_ws(r);
    to = at == AT_OTHER ? AT_OTHER : child(at, s, len);
    if (r->p < r->end && *r->p == '"') { /* most values: no call to value() */
        if (string(r, &f.p, &f.len, &esc) != 0)
            return -1;
        f.type = esc ? T_ESCAPED : T_STRING;
    } else if (value(r, to, &f) != 0) {
        return -1;
    }
    if (to == AT_DM)
        r->dm = f;
    else if (to >= AT_FRIENDLY_ID)
        r->field[to - AT_FRIENDLY_ID] = f;
    return 0;
}

static int object(reader *r, int at)
{
    object_names o = {r->nobj++, 0, 0, 0};
    int rc = enter(r, '}');

    while (rc == 1) {
        if (member(r, at, &o) != 0)
            return -1;
        rc = more(r, '}', "expected ',' or '}' in an object");
    }
    return rc;
}

static int array(reader *r)
{
    found f;
    int rc = enter(r, ']');

    while (rc == 1) {
        if (value(r, AT_OTHER, &f) != 0)
            return -1;
        rc = more(r, ']', "expected ',' or ']' in an array");
    }
    return rc;
}

/* RFC 8259 section 6: no leading zero, no bare or trailing dot, no '+'. */
static int number(reader *r)
{
    const char *p = r->p, *end = r->end;

    if (p < end && *p == '-')
        p++;
    if (p < end && *p == '0') {
        p++;
        if (is_digit(p, end)) {
            r->p = p;
            return fail(r, "leading zero in a number");
        }
    } else if (is_digit(p, end)) {
        while (is_digit(p, end))
            p++;
    } else {
        r->p = p;
        return fail(r, "expected a value");
    }
    if (p < end && *p == '.') {
        if (!is_digit(++p, end)) {
            r->p = p;
            return fail(r, "expected a digit after the decimal point");
        }
        while (is_digit(p, end))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (!is_digit(p, end)) {
            r->p = p;
            return fail(r, "expected a digit in the exponent");
        }
        while (is_digit(p, end))
            p++;
    }
    r->p = p;
    return 0;
}

static int literal(reader *r, const char *word, size_t len)
{
    if ((size_t)(r->end - r->p) < len || memcmp(r->p, word, len) != 0)
        return fail(r, "expected a value");
    r->p += len;
    return 0;
}

/* Reads the value at <r->p>, found at <at>; <f> says what it was. */
static int value(reader *r, int at, found *f)
{
    const char *start = r->p;
    int rc, esc;

    f->p = start;
    f->type = T_OTHER;
    if (r->p == r->end)
        return fail(r, "expected a value");
    switch (*r->p) {
    case '{':
    case '[':
        if (r->depth == PL_MESSAGE_MAX_DEPTH)
            return fail(r, "nested too deeply");
        r->depth++;
        rc = *r->p == '{' ? object(r, at) : array(r);
        r->depth--;
        f->type = *start == '{' ? T_OBJECT : T_OTHER;
        break;
    case '"':
        rc = string(r, &f->p, &f->len, &esc);
        f->type = esc ? T_ESCAPED : T_STRING;
        return rc;
    case 't':
        rc = literal(r, "true", 4);
        break;
    case 'f':
        rc = literal(r, "false", 5);
        break;
    case 'n':
        rc = literal(r, "null", 4);
        break;
    default:
        rc = number(r);
        f->type = T_NUMBER;
    }
    f->len = (size_t)(r->p - start);
    return rc;
}

/* A key string as JavaScript reads it: escapes decoded (into <buf>, which
 * has room), but never to a NUL (cJSON's reading ended there, and a header
 * cannot carry one) or a lone surrogate (not text a header can carry). */
static const char *read_string(const found *f, char *buf, const char **s, size_t *len,
                               const char *err_type, const char *err_char,
                               const char *err_long)
{
    if ((f->type != T_STRING && f->type != T_ESCAPED) || f->len == 0)
        return err_type;
    *s = f->p;
    *len = f->len;
    if (f->type == T_ESCAPED) {
        *len = decode(f->p, f->len, buf);
        *s = buf;
        if (memchr(buf, '\0', *len) != NULL)
            return err_char;
        for (const char *e = buf; (e = memchr(e, 0xED, (size_t)(buf + *len - e))) != NULL; e++)
            if ((unsigned char)e[1] >= 0xA0) /* raw UTF-8 has 80-9F after ED */
                return err_char;
    }
    return *len > PL_KEY_FIELD_MAX ? err_long : NULL;
}

/* The token is valid JSON inside a complete object, so a byte that ends
 * it follows within the body and strtod() reads exactly the token (glibc's
 * is correctly rounded, as JavaScript's Number parsing is). */
static const char *read_number(const found *f, double *out, const char *err)
{
    if (f->type != T_NUMBER)
        return err;
    if (pl_key_number_exact(f->p, f->len, out) != 0)
        *out = strtod(f->p, NULL);
    if (!isfinite(*out))
        return err;
    if (*out == 0)
        *out = 0; /* -0 is the key 0 */
    return NULL;
}

#define FIELD(a, b) "dequeuedMessage." a "." b

static const char *read_key(const reader *r, pl_message *m)
{
    pl_key *k = &m->key;
    const found *dep = &r->field[0], *ver = &r->field[1];
    size_t need = (dep->type == T_ESCAPED ? dep->len : 0) + (ver->type == T_ESCAPED ? ver->len : 0);
    const char *err;

    if (need > 0 && (m->owned = pl_malloc(need)) == NULL)
        return out_of_memory;
    err = read_string(dep, m->owned, &k->deployment, &k->deployment_len,
                      FIELD("deployment", "friendlyId") " must be a non-empty string",
                      FIELD("deployment", "friendlyId") " must not contain \\\\u0000 or a lone surrogate",
                      FIELD("deployment", "friendlyId") " is too long");
    if (err == NULL)
        err = read_string(ver, dep->type == T_ESCAPED ? m->owned + dep->len : m->owned,
                          &k->version, &k->version_len,
                          FIELD("backgroundWorker", "version") " must be a non-empty string",
                          FIELD("backgroundWorker", "version") " must not contain \\\\u0000 or a lone surrogate",
                          FIELD("backgroundWorker", "version") " is too long");
    if (err == NULL)
        err = read_number(&r->field[2], &k->cpu,
                          FIELD("run.machine", "cpu") " must be a number");
    if (err == NULL)
        err = read_number(&r->field[3], &k->memory,
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

static int verdict(reader *r, pl_message *m, const char **err)
{
    if (r->nomem) {
        *err = out_of_memory;
        return PL_MESSAGE_ENOMEM;
    }
    if (r->bad != NULL) {
        snprintf(errbuf, sizeof(errbuf), "request body is not valid JSON: %s at byte %zu",
                 r->bad, (size_t)(r->bad_at - r->body));
        *err = errbuf;
    } else if (r->dup != NULL) {
        int n = name_prefix(r->dup, r->dup_len, 64);

        snprintf(errbuf, sizeof(errbuf), "duplicate member name \\\"%.*s\\\"%s", n, r->dup,
                 (size_t)n < r->dup_len ? " (cut)" : "");
        *err = errbuf;
    } else if (r->dm.type != T_OBJECT) {
        *err = "dequeuedMessage must be an object";
    } else if ((*err = read_key(r, m)) != NULL) {
        pl_message_release(m);
        return *err == out_of_memory ? PL_MESSAGE_ENOMEM : PL_MESSAGE_EINVAL;
    }
    if (*err != NULL)
        return PL_MESSAGE_EINVAL;
    m->payload = r->dm.p;
    m->payload_len = r->dm.len;
    return 0;
}

int pl_message_parse(const char *body, size_t len, pl_message *m,
                     const char **err)
{
    reader r = {0};
    found top;
    int rc;

    memset(m, 0, sizeof(*m));
    r.body = r.p = body;
    r.end = body + len;
    r.names = small_names;
    r.slots = small_slots;
    r.cap = SMALL_NAMES;
    r.dec = small_dec;
    r.dec_cap = sizeof(small_dec);
    skip_ws(&r);
    if (value(&r, AT_ROOT, &top) == 0) {
        skip_ws(&r);
        if (r.p != r.end)
            fail(&r, "unexpected bytes after the document");
    }
    rc = verdict(&r, m, err);
    if (r.names == small_names) {
        clear_small(&r);
    } else {
        pl_free(r.names);
        pl_free(r.slots);
    }
    if (r.dec != small_dec)
        pl_free(r.dec);
    return rc;
}

void pl_message_release(pl_message *m)
{
    pl_free(m->owned);
    memset(m, 0, sizeof(*m));
}
