/* json.c -- the strict one-pass JSON reader: validate a client's document,
 * refuse repeated member names, hand back the values asked for by path. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "pilotlight/hash.h"
#include "pilotlight/json.h"
#include "pilotlight/key.h"
#include "pilotlight/mem.h"
#include "pilotlight/utf8.h"

/* The node of a value no path leads to (paths are numbered from 1, the
 * document is PL_JSON_ROOT). */
#define UNTRACKED (-1)

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

/* Typical documents (a few hundred names) never touch the heap: the scratch
 * lives here and is cleared name by name after each read. A document with
 * more names, or more escaped name bytes, gets heap scratch freed before
 * pl_json_read() returns. */
#define SMALL_NAMES 1024
static name small_names[SMALL_NAMES];
static uint32_t small_slots[2 * SMALL_NAMES]; /* index + 1 into names, 0 free */
static char small_dec[4096];

typedef struct {
    const char *text, *p, *end;
    const char *bad, *bad_at; /* the first syntax error and where */
    const char *dup;          /* the first duplicate name, as written */
    size_t dup_len;
    int nomem, depth, hashed; /* hashed: some name went into the table */
    unsigned flags;
    uint32_t nobj, nnames, cap; /* cap names, 2 * cap slots */
    name *names;
    uint32_t *slots;
    char *dec;
    size_t dec_used, dec_cap;
    const pl_json_path *paths;
    pl_json_value *found;
    /* The paths by their name's filter bit: <wanted> has all their bits (a
     * test per member); first path + 1 per bit, each one's next + 1. */
    uint64_t wanted;
    uint8_t first[64];
    uint8_t *next;
} reader;

static int fail(reader *r, const char *what)
{
    if (r->bad == NULL) {
        r->bad = what;
        r->bad_at = r->p;
    }
    return -EINVAL;
}

static int fail_at(reader *r, const char *p, const char *what)
{
    r->p = p;
    return fail(r, what);
}

/* Past JSON's four whitespace bytes, and nothing else (cJSON takes every
 * byte up to 0x20; JSON.parse does not). */
static const char *ws_end(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
        p++;
    return p;
}

static void skip_ws(reader *r)
{
    const char *p = r->p;

    if (p < r->end && (unsigned char)*p > ' ')
        return; /* the usual case: compact JSON */
    r->p = ws_end(p, r->end);
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
        unsigned c = (unsigned char)p[i], l = c | 0x20; /* a letter in lower case */

        if (c - '0' > 9 && l - 'a' > 5)
            return -EINVAL;
        v = v << 4 | (c - '0' <= 9 ? c - '0' : l - 'a' + 10);
    }
    *out = v;
    return 0;
}

/* 1 when <p> (<end> - <p> bytes) starts with \u and a low surrogate. */
static int low_surrogate_at(const char *p, const char *end, unsigned *lo)
{
    return end - p >= 6 && p[0] == '\\' && p[1] == 'u' && hex4(p + 2, lo) == 0 &&
           *lo >= 0xDC00 && *lo <= 0xDFFF;
}

/* Under PL_JSON_TEXT: the length of the escape \u<u> at <p> (12 for a
 * surrogate pair), or 0 for \u0000 and a lone surrogate. */
static int text_escape(const char *p, const char *end, unsigned u)
{
    unsigned lo;

    if (u == 0 || (u >= 0xDC00 && u <= 0xDFFF))
        return 0;
    if (u >= 0xD800 && u <= 0xDBFF)
        return low_surrogate_at(p + 6, end, &lo) ? 12 : 0;
    return 6;
}

/* 1 for a byte a string holds as it is: printable ASCII but '"' and '\\'.
 * (One load per byte: most of a document is string bytes.) */
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
 * <end>). Most of a document is string bytes: on x86-64 they are looked at
 * 16 at a time, a signed compare catching both control bytes and bytes
 * above 0x7f, and the first special one is found from the mask. */
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
 * when they hold an escape. Inlined into its callers: a dispatch body is
 * mostly short strings, and the call cost ~2.4 k of a match cycle's
 * 36.8 k instructions. */
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
                n = r->flags & PL_JSON_TEXT ? text_escape(p, end, u) : 6;
                if (n == 0)
                    return fail(r, "escaped NUL or lone surrogate in a string");
                p += n;
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

/* The UTF-8 bytes of code point <u> (a lone surrogate too: three bytes). */
static size_t put_utf8(char *o, unsigned u)
{
    static const unsigned char lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    size_t n = u < 0x80 ? 1 : u < 0x800 ? 2 : u < 0x10000 ? 3 : 4;

    if (n == 1) {
        *o = (char)u;
        return 1;
    }
    for (size_t i = n - 1; i > 0; i--, u >>= 6)
        o[i] = (char)(0x80 | (u & 0x3F));
    o[0] = (char)(lead[n] | u);
    return n;
}

/* Decodes the character at *s (in validated string bytes ending at <end>)
 * into <o> (4 bytes) and moves *s past it. A surrogate pair becomes one
 * code point, a lone surrogate three bytes of its own: two strings decode
 * to the same bytes exactly when JavaScript's strings for them are equal. */
static size_t decode_char(const char **sp, const char *end, char *o)
{
    const char *s = *sp, *c;
    unsigned u = 0, lo;

    if (*s != '\\' || s[1] != 'u') { /* a byte as it is, or a two-byte escape */
        c = *s == '\\' ? strchr("b\bf\fn\nr\rt\t", s[1]) : NULL;
        *o = *s != '\\' ? *s : c != NULL ? c[1] : s[1];
        *sp = s + (*s == '\\' ? 2 : 1);
        return 1;
    }
    hex4(s + 2, &u);
    s += 6;
    if (u >= 0xD800 && u <= 0xDBFF && low_surrogate_at(s, end, &lo)) {
        u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        s += 6;
    }
    *sp = s;
    return put_utf8(o, u);
}

/* Writes the text of the validated string bytes <s>,<len> (never longer
 * than they are) to <out>. Returns its length, or -ENOSPC past <cap> bytes.
 * Out of line: escapes are rare, and inlined it crowds the member loop. */
static __attribute__((noinline)) long decode(const char *s, size_t len, char *out, size_t cap)
{
    const char *end = s + len;
    size_t n = 0, k;
    char c[4];

    for (; s < end; n += k)
        if ((k = decode_char(&s, end, c)) > cap - n)
            return -ENOSPC;
        else
            memcpy(out + n, c, k);
    return (long)n;
}

static void place(reader *r, uint32_t idx)
{
    uint32_t mask = 2 * r->cap - 1, i = r->names[idx].hash & mask;

    while (r->slots[i] != 0)
        i = (i + 1) & mask;
    r->slots[i] = idx + 1;
    r->names[idx].slot = i + 1;
    r->hashed = 1;
}

/* Empties the table the cheap way: only the slots names occupy (none, for
 * a document whose objects all stayed small). */
static void clear_small(reader *r)
{
    if (!r->hashed)
        return;
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
        return -ENOMEM;
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

/* memcmp() == 0 for the short names of a document, without a call: a
 * name of 4 to 16 bytes is two overlapping words. */
static inline int same_bytes(const char *a, const char *b, size_t n)
{
    uint64_t x, y, u, v;
    uint32_t x4, y4, u4, v4;

    if (n > 16)
        return memcmp(a, b, n) == 0;
    if (n >= 8) {
        memcpy(&x, a, 8), memcpy(&y, b, 8);
        memcpy(&u, a + n - 8, 8), memcpy(&v, b + n - 8, 8);
        return ((x ^ y) | (u ^ v)) == 0;
    }
    if (n >= 4) {
        memcpy(&x4, a, 4), memcpy(&y4, b, 4);
        memcpy(&u4, a + n - 4, 4), memcpy(&v4, b + n - 4, 4);
        return ((x4 ^ y4) | (u4 ^ v4)) == 0;
    }
    return n == 0 || (a[0] == b[0] && a[n / 2] == b[n / 2] && a[n - 1] == b[n - 1]);
}

static int same(const name *n, const char *s, size_t len)
{
    return n->len == len && same_bytes(n->s, s, len);
}

/* A name's bit in its object's filter (and, as the bit's index, its
 * bucket among the paths' names): from its length, first and last byte,
 * spread over 64 by a multiply. */
static uint64_t filter_bit(const char *s, size_t len)
{
    uint32_t tag = len == 0 ? 0
                            : (uint32_t)len << 16 ^ (uint32_t)(unsigned char)s[0] << 8 ^
                                  (unsigned char)s[len - 1];

    return 1ULL << (tag * 0x9E3779B1u >> 26);
}

/* Records member name <s>,<len> (decoded, filter bit <bit>) of object <o>;
 * <raw>,<raw_len> is how it was written, kept for the error when it
 * repeats. */
static int remember(reader *r, object_names *o, const char *s, size_t len, uint64_t bit,
                    const char *raw, size_t raw_len)
{
    const name *dup = NULL;
    uint32_t h = 0;

    if (o->count < LINEAR_NAMES) {
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
            for (uint32_t i = o->last; i != 0; i = r->names[i - 1].prev) {
                name *n = &r->names[i - 1];

                n->hash = pl_hash(n->s, n->len, (uint64_t)n->obj << 32);
                place(r, i - 1);
            }
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
        return -EINVAL;
    r->names[r->nnames] = (name){s, (uint32_t)len, o->id, o->last, h, 0};
    if (o->count >= LINEAR_NAMES)
        place(r, r->nnames);
    o->last = ++r->nnames;
    o->count++;
    return 0;
}

/* Decodes an escaped name into the scratch. The heap scratch, when the
 * static one is full, is as long as the document: all names together never
 * decode longer than that, so it never moves. */
static const char *decode_name(reader *r, const char *s, size_t *len)
{
    char *out;

    if (r->dec_cap - r->dec_used < *len) {
        if (r->dec != small_dec) {
            r->nomem = 1; /* cannot happen: see above */
            return NULL;
        }
        r->dec = pl_malloc((size_t)(r->end - r->text));
        if (r->dec == NULL) {
            r->nomem = 1;
            return NULL;
        }
        r->dec_cap = (size_t)(r->end - r->text);
        r->dec_used = 0;
    }
    out = r->dec + r->dec_used;
    *len = (size_t)decode(s, *len, out, *len);
    r->dec_used += *len;
    return out;
}

/* The node a member named <s>,<len> (filter bit <bit>) of the object at
 * node <at> leads to. */
static int child(const reader *r, int at, const char *s, size_t len, uint64_t bit)
{
    for (unsigned i = r->first[__builtin_ctzll(bit)]; i != 0; i = r->next[i - 1]) {
        const pl_json_path *e = &r->paths[i - 1];

        if (e->from == at && e->len == len && same_bytes(e->name, s, len))
            return (int)i;
    }
    return UNTRACKED;
}

static int value(reader *r, int at, pl_json_value *f);

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
    if (r->p < r->end && *r->p == ',') { /* compact JSON: no whitespace first */
        r->p++;
        skip_ws(r);
        return 1;
    }
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
    uint64_t bit;
    pl_json_value f;

    if (r->p == r->end || *r->p != '"')
        return fail(r, "expected a member name");
    if (string(r, &raw, &raw_len, &esc) != 0)
        return -EINVAL;
    s = raw;
    len = raw_len;
    if (esc && (s = decode_name(r, raw, &len)) == NULL)
        return -EINVAL;
    bit = filter_bit(s, len);
    to = at != UNTRACKED && (r->wanted & bit) ? child(r, at, s, len, bit) : UNTRACKED;
    if (remember(r, o, s, len, bit, raw, raw_len) != 0)
        return -EINVAL;
    if (r->p == r->end || *r->p != ':') { /* compact JSON: the colon at once */
        skip_ws(r);
        if (r->p == r->end || *r->p != ':')
            return fail(r, "expected ':' after a member name");
    }
    r->p++;
    skip_ws(r);
    if (r->p < r->end && *r->p == '"') { /* most values: no call to value() */
        if (string(r, &f.p, &f.len, &esc) != 0)
            return -EINVAL;
        f.type = PL_JSON_STRING;
        f.escaped = (uint8_t)esc;
    } else if (value(r, to, &f) != 0) {
        return -EINVAL;
    }
    if (to > 0 && r->found[to - 1].type == PL_JSON_NONE)
        r->found[to - 1] = f;
    return 0;
}

static int object(reader *r, int at)
{
    object_names o = {r->nobj++, 0, 0, 0};
    int rc = enter(r, '}');

    while (rc == 1) {
        if (member(r, at, &o) != 0)
            return -EINVAL;
        rc = more(r, '}', "expected ',' or '}' in an object");
    }
    return rc;
}

static int array(reader *r)
{
    pl_json_value f;
    int rc = enter(r, ']');

    while (rc == 1) {
        if (value(r, UNTRACKED, &f) != 0)
            return -EINVAL;
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
        if (is_digit(++p, end))
            return fail_at(r, p, "leading zero in a number");
    } else if (!is_digit(p, end)) {
        return fail_at(r, p, "expected a value");
    }
    while (is_digit(p, end))
        p++;
    if (p < end && *p == '.') {
        if (!is_digit(++p, end))
            return fail_at(r, p, "expected a digit after the decimal point");
        while (is_digit(p, end))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        if (++p < end && (*p == '+' || *p == '-'))
            p++;
        if (!is_digit(p, end))
            return fail_at(r, p, "expected a digit in the exponent");
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

/* Reads the value at <r->p>, found at node <at>, into <f>. */
static int value(reader *r, int at, pl_json_value *f)
{
    const char *start = r->p;
    int rc, esc;

    f->p = start;
    f->type = PL_JSON_NONE;
    f->escaped = 0;
    if (r->p == r->end)
        return fail(r, "expected a value");
    switch (*r->p) {
    case '{':
    case '[':
        if (r->depth == PL_JSON_MAX_DEPTH)
            return fail(r, "nested too deeply");
        r->depth++;
        rc = *r->p == '{' ? object(r, at) : array(r);
        r->depth--;
        f->type = *start == '{' ? PL_JSON_OBJECT : PL_JSON_ARRAY;
        break;
    case '"':
        rc = string(r, &f->p, &f->len, &esc);
        f->type = PL_JSON_STRING;
        f->escaped = (uint8_t)esc;
        return rc;
    case 't':
        rc = literal(r, "true", 4);
        f->type = PL_JSON_TRUE;
        break;
    case 'f':
        rc = literal(r, "false", 5);
        f->type = PL_JSON_FALSE;
        break;
    case 'n':
        rc = literal(r, "null", 4);
        f->type = PL_JSON_NULL;
        break;
    default:
        rc = number(r);
        f->type = PL_JSON_NUMBER;
    }
    f->len = (size_t)(r->p - start);
    return rc;
}

static int verdict(const reader *r, pl_json_doc *doc)
{
    doc->end = (size_t)(r->p - r->text);
    doc->error = r->bad;
    doc->error_at = r->bad != NULL ? (size_t)(r->bad_at - r->text) : 0;
    doc->dup = r->dup;
    doc->dup_len = r->dup_len;
    if (r->nomem)
        return PL_JSON_ENOMEM;
    if (r->bad != NULL) {
        doc->root.type = PL_JSON_NONE;
        return PL_JSON_EINVAL;
    }
    return r->dup != NULL ? PL_JSON_EDUP : 0;
}

int pl_json_read(const char *text, size_t len, unsigned flags, const pl_json_path *paths,
                 size_t npaths, pl_json_value *found, pl_json_doc *doc)
{
    uint8_t next[PL_JSON_PATHS_MAX];
    reader r = {.text = text, .p = text, .end = text + len, .flags = flags, .paths = paths,
                .found = found, .next = next, .names = small_names, .slots = small_slots,
                .cap = SMALL_NAMES, .dec = small_dec, .dec_cap = sizeof(small_dec)};
    int rc;

    for (size_t i = 0; i < npaths; i++) {
        uint64_t bit = filter_bit(paths[i].name, paths[i].len);
        unsigned idx = (unsigned)__builtin_ctzll(bit);

        found[i] = (pl_json_value){NULL, 0, PL_JSON_NONE, 0};
        if (i >= PL_JSON_PATHS_MAX)
            continue; /* a node number is a byte */
        r.wanted |= bit;
        next[i] = r.first[idx];
        r.first[idx] = (uint8_t)(i + 1);
    }
    skip_ws(&r);
    if (value(&r, npaths > 0 ? PL_JSON_ROOT : UNTRACKED, &doc->root) == 0 &&
        !(flags & PL_JSON_PREFIX)) {
        skip_ws(&r);
        if (r.p != r.end)
            fail(&r, "unexpected bytes after the document");
    }
    rc = verdict(&r, doc);
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

/* ---- reading what was found ------------------------------------------- */

long pl_json_string(const pl_json_value *v, char *out, size_t cap)
{
    if (v->type != PL_JSON_STRING)
        return -EINVAL;
    if (!v->escaped && v->len > cap)
        return -ENOSPC;
    if (v->escaped)
        return decode(v->p, v->len, out, cap);
    memcpy(out, v->p, v->len);
    return (long)v->len;
}

int pl_json_equals(const pl_json_value *v, const char *s, size_t len)
{
    const char *p = v->p, *end;
    size_t i = 0, n;
    char c[4];

    if (v->type != PL_JSON_STRING)
        return 0; /* an absent value has no bytes at all (p is NULL) */
    for (end = p + v->len; p < end; i += n)
        if ((n = decode_char(&p, end, c)) > len - i || memcmp(c, s + i, n) != 0)
            return 0;
    return i == len;
}

int pl_json_is_text(const char *s, size_t len)
{
    if (memchr(s, '\0', len) != NULL)
        return 0;
    /* decoded, a lone surrogate is ED A0-BF ..; well-formed UTF-8 has
     * 80-9F after ED */
    for (const char *e = s; (e = memchr(e, 0xED, (size_t)(s + len - e))) != NULL; e++)
        if (e + 1 < s + len && (unsigned char)e[1] >= 0xA0)
            return 0;
    return 1;
}

/* The token is valid JSON inside an object or array, so a byte that ends
 * it follows and strtod() reads exactly the token (glibc's is correctly
 * rounded, as JavaScript's Number parsing is). */
int pl_json_number(const pl_json_value *v, double *out)
{
    double d;

    if (v->type != PL_JSON_NUMBER)
        return -EINVAL;
    if (pl_key_number_exact(v->p, v->len, &d) != 0)
        d = strtod(v->p, NULL);
    if (!isfinite(d))
        return -ERANGE;
    *out = d;
    return 0;
}

int pl_json_element(const pl_json_value *v, const char **cursor, pl_json_value *out)
{
    const char *p, *end;
    pl_json_doc doc;
    int rc;

    if (v->type != PL_JSON_ARRAY)
        return 0;
    end = v->p + v->len - 1; /* the closing bracket */
    p = ws_end(*cursor == NULL ? v->p + 1 : *cursor, end);
    if (p < end && *p == ',')
        p = ws_end(p + 1, end);
    if (p >= end)
        return 0;
    /* the array was read whole: its elements are valid, and one more read
     * of one of them is the simplest way to find where it ends */
    rc = pl_json_read(p, (size_t)(end - p), PL_JSON_PREFIX, NULL, 0, NULL, &doc);
    if (rc != 0)
        return rc == PL_JSON_ENOMEM ? rc : 0;
    *out = doc.root;
    *cursor = p + doc.end;
    return 1;
}
