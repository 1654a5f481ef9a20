/* test_json.c -- the strict reader: what it accepts and refuses, where it
 * says the error is, repeated names, the values it finds by path, the two
 * flags, the helpers that read what it found, and its scratch memory. */
#include <math.h>
#include <stdlib.h>

#include "pilotlight/json.h"
#include "pilotlight/mem.h"
#include "unit.h"

static pl_json_doc doc;

/* Reads <text> from an exact-size heap copy (no NUL after it: a read past
 * the end is caught by AddressSanitizer). */
static int read_with(const char *text, size_t len, unsigned flags, const pl_json_path *paths,
                     size_t npaths, pl_json_value *found)
{
    char *copy = malloc(len ? len : 1);
    int rc;

    memcpy(copy, text, len);
    rc = pl_json_read(copy, len, flags, paths, npaths, found, &doc);
    /* the values point into the copy: move them onto <text> */
    for (size_t i = 0; i < npaths; i++)
        if (found[i].type != PL_JSON_NONE)
            found[i].p = text + (found[i].p - copy);
    if (doc.root.type != PL_JSON_NONE)
        doc.root.p = text + (doc.root.p - copy);
    if (doc.dup != NULL)
        doc.dup = text + (doc.dup - copy);
    free(copy);
    return rc;
}

static int read_doc(const char *text, unsigned flags)
{
    return read_with(text, strlen(text), flags, NULL, 0, NULL);
}

#define CHECK_INVALID(text, what)                                             \
    do {                                                                      \
        CHECK_EQ(read_doc(text, 0), PL_JSON_EINVAL);                          \
        CHECK(doc.error != NULL && strstr(doc.error, what) != NULL);          \
        if (doc.error == NULL || strstr(doc.error, what) == NULL)             \
            fprintf(stderr, "  %s: %s, wanted %s\n", text,                    \
                    doc.error ? doc.error : "(no error)", what);              \
    } while (0)

static void test_values(void)
{
    static const struct {
        const char *text;
        pl_json_type type;
    } ok[] = {
        {"{}", PL_JSON_OBJECT},     {"[]", PL_JSON_ARRAY},       {"\"\"", PL_JSON_STRING},
        {"0", PL_JSON_NUMBER},      {"-0.5e+3", PL_JSON_NUMBER}, {"true", PL_JSON_TRUE},
        {"false", PL_JSON_FALSE},   {"null", PL_JSON_NULL},      {" \t\r\n[ 1 , {} ]\n", PL_JSON_ARRAY},
        {"1E-7", PL_JSON_NUMBER},   {"123456789012345678901234567890", PL_JSON_NUMBER},
    };

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        CHECK_EQ(read_doc(ok[i].text, 0), 0);
        CHECK_EQ(doc.root.type, ok[i].type);
        CHECK(doc.error == NULL && doc.dup == NULL);
        CHECK_EQ(doc.end, strlen(ok[i].text));
    }
    /* a container's bytes run from its bracket to the closing one */
    CHECK_EQ(read_doc("  [1,[2]] ", 0), 0);
    CHECK(doc.root.len == 7 && memcmp(doc.root.p, "[1,[2]]", 7) == 0);
    /* a string's are those between its quotes */
    CHECK_EQ(read_doc("\"a\\nb\"", 0), 0);
    CHECK(doc.root.len == 4 && doc.root.escaped);
}

/* What JSON.parse refuses, with the reason and where. */
static void test_refused(void)
{
    CHECK_INVALID("", "expected a value");
    CHECK_INVALID("   ", "expected a value");
    CHECK_INVALID("01", "leading zero");
    CHECK_INVALID("-01", "leading zero");
    CHECK_INVALID("1.", "digit after the decimal point");
    CHECK_INVALID(".5", "expected a value");
    CHECK_INVALID("+1", "expected a value");
    CHECK_INVALID("1e", "digit in the exponent");
    CHECK_INVALID("1e+", "digit in the exponent");
    CHECK_INVALID("-", "expected a value");
    CHECK_INVALID("NaN", "expected a value");
    CHECK_INVALID("tru", "expected a value");
    CHECK_INVALID("nul", "expected a value");
    CHECK_INVALID("'a'", "expected a value");
    CHECK_INVALID("[1,]", "expected a value");
    CHECK_INVALID("[1 2]", "expected ',' or ']'");
    CHECK_INVALID("{\"a\":1,}", "expected a member name");
    CHECK_INVALID("{a:1}", "expected a member name");
    CHECK_INVALID("{\"a\" 1}", "expected ':'");
    CHECK_INVALID("{\"a\":1 \"b\":2}", "expected ',' or '}'");
    CHECK_INVALID("\"abc", "unterminated string");
    CHECK_INVALID("\"a\tb\"", "control character");
    CHECK_INVALID("\"a\nb\"", "control character");
    CHECK_INVALID("\"\\x\"", "invalid escape");
    CHECK_INVALID("\"\\u12\"", "invalid escape");
    CHECK_INVALID("\"\\u12g4\"", "invalid escape");
    CHECK_INVALID("\"\xc0\xaf\"", "invalid UTF-8");         /* overlong '/' */
    CHECK_INVALID("\"\xed\xa0\x80\"", "invalid UTF-8");     /* a surrogate, raw */
    CHECK_INVALID("\"\xf4\x90\x80\x80\"", "invalid UTF-8"); /* above U+10FFFF */
    CHECK_INVALID("\"\xe2\x82\"", "invalid UTF-8");         /* cut short */
    CHECK_INVALID("\xef\xbb\xbf{}", "expected a value");     /* a byte order mark */
    CHECK_INVALID("{}\x0b", "unexpected bytes after the document");
    CHECK_INVALID("\x0c{}", "expected a value");
    CHECK_INVALID("{} {}", "unexpected bytes after the document");
    CHECK_INVALID("{}x", "unexpected bytes after the document");
    /* the byte where it went wrong */
    CHECK_EQ(read_doc("[1, 2, 03]", 0), PL_JSON_EINVAL);
    CHECK_EQ(doc.error_at, 8);
    CHECK_EQ(read_doc("{\"a\":\"b\x01\"}", 0), PL_JSON_EINVAL);
    CHECK_EQ(doc.error_at, 7);
    CHECK_EQ(doc.root.type, PL_JSON_NONE);
    /* a NUL byte is no whitespace and no string content */
    CHECK_EQ(read_with("{}\0", 3, 0, NULL, 0, NULL), PL_JSON_EINVAL);
    CHECK_EQ(read_with("\"\0\"", 3, 0, NULL, 0, NULL), PL_JSON_EINVAL);
    /* escapes JSON.parse reads: \u0000, lone surrogates, any pair */
    CHECK_EQ(read_doc("[\"\\u0000\",\"\\ud800\",\"\\udc00x\",\"\\uD83D\\uDE00\",\"\\/\"]", 0), 0);
}

static void test_depth(void)
{
    size_t n = PL_JSON_MAX_DEPTH + 1;
    char *text = malloc(2 * n);

    memset(text, '[', n);
    memset(text + n, ']', n);
    CHECK_EQ(read_with(text + 1, 2 * n - 2, 0, NULL, 0, NULL), 0);
    CHECK_EQ(read_with(text, 2 * n, 0, NULL, 0, NULL), PL_JSON_EINVAL);
    CHECK(doc.error != NULL && strstr(doc.error, "nested too deeply") != NULL);
    CHECK_EQ(doc.error_at, PL_JSON_MAX_DEPTH);
    free(text);
}

static void test_duplicates(void)
{
    static const char *const dup[] = {
        "{\"a\":1,\"a\":2}",
        "{\"a\":1,\"\\u0061\":2}",                         /* the same once decoded */
        "{\"\xf0\x9f\x98\x80\":1,\"\\ud83d\\ude00\":2}", /* a pair is the character */
        "{\"\\ud800\":1,\"\\uD800\":2}",                   /* a lone one is itself */
        "[{\"x\":{\"b\":1,\"c\":[],\"b\":2}}]",          /* anywhere */
        "{\"\":1,\"\":2}",
    };
    static const char *const not_dup[] = {
        "{\"a\":1,\"A\":2,\"a \":3,\"\\u0000a\":4,\"a\\u0000\":5}",
        "{\"\\ud83d\":1,\"\\ude00\":2,\"\\ud83d\\ude00\":3}",
        "{\"a\":{\"a\":{\"a\":1}},\"b\":[{\"a\":1},{\"a\":1}]}",
    };

    for (size_t i = 0; i < sizeof(dup) / sizeof(dup[0]); i++) {
        CHECK_EQ(read_doc(dup[i], 0), PL_JSON_EDUP);
        CHECK(doc.dup != NULL && doc.error == NULL);
    }
    for (size_t i = 0; i < sizeof(not_dup) / sizeof(not_dup[0]); i++)
        CHECK_EQ(read_doc(not_dup[i], 0), 0);
    /* the first repeat, as written */
    CHECK_EQ(read_doc("{\"x\":1,\"\\u0078\":2,\"y\":1,\"y\":2}", 0), PL_JSON_EDUP);
    CHECK(doc.dup_len == 6 && memcmp(doc.dup, "\\u0078", 6) == 0);
    /* a syntax error after a repeat is reported as the syntax error */
    CHECK_EQ(read_doc("{\"a\":1,\"a\":2,", 0), PL_JSON_EINVAL);
}

/* Objects past 16 names go to the hash table: repeats on either side of
 * that line are found, and the static table is left empty after each read
 * (a slot left behind would fill it and hang a later read). */
static void test_duplicates_in_large_objects(void)
{
    char text[4096];

    for (int dup_at = 1; dup_at < 40; dup_at++) {
        int n = snprintf(text, sizeof(text), "{\"o\":{");

        for (int i = 0; i < 40; i++)
            n += snprintf(text + n, sizeof(text) - (size_t)n, "%s\"m%d\":0", i ? "," : "",
                          i == dup_at ? dup_at / 2 : i);
        snprintf(text + n, sizeof(text) - (size_t)n, "},\"p\":{\"m1\":0,\"m30\":0}}");
        for (int k = 0; k < 100; k++) {
            CHECK_EQ(read_doc(text, 0), PL_JSON_EDUP);
            CHECK(doc.dup != NULL && doc.dup_len >= 2 && doc.dup[0] == 'm' &&
                  atoi(doc.dup + 1) == dup_at / 2);
        }
    }
    for (int k = 0; k < 3000; k++) {
        int n = snprintf(text, sizeof(text), "{\"o\":{");

        for (int i = 0; i < 40; i++)
            n += snprintf(text + n, sizeof(text) - (size_t)n, "%s\"m%d\":{\"m%d\":0}", i ? "," : "",
                          i, i);
        snprintf(text + n, sizeof(text) - (size_t)n, "}}");
        CHECK_EQ(read_doc(text, 0), 0);
    }
}

/* The values asked for, by path. */
static void test_paths(void)
{
    enum { A, B, C, D, E, NPATHS };
    static const pl_json_path paths[NPATHS] = {
        [A] = {PL_JSON_ROOT, 1, "a"},
        [B] = {1 + A, 1, "b"},
        [C] = {1 + B, 5, "c\0\xc3\xa9z"}, /* decoded names, NUL and all */
        [D] = {PL_JSON_ROOT, 1, "d"},
        [E] = {1 + D, 1, "e"},
    };
    pl_json_value found[NPATHS];
    const char *text = "{\"x\":{\"b\":1},\"\\u0061\":{\"b\":{\"c\\u0000\\u00e9z\":[1, 2]},\"c\":3},"
                       "\"d\":[{\"e\":1}],\"b\":2}";

    CHECK_EQ(read_with(text, strlen(text), 0, paths, NPATHS, found), 0);
    CHECK_EQ(found[A].type, PL_JSON_OBJECT);
    CHECK(found[A].p == strstr(text, "{\"b\":{"));
    CHECK_EQ(found[B].type, PL_JSON_OBJECT); /* a's b, not x's or the root's */
    CHECK_EQ(found[C].type, PL_JSON_ARRAY);
    CHECK(found[C].len == 6 && memcmp(found[C].p, "[1, 2]", 6) == 0);
    CHECK_EQ(found[D].type, PL_JSON_ARRAY);
    CHECK_EQ(found[E].type, PL_JSON_NONE); /* paths do not go through arrays */
    /* a path the document does not have; one whose parent is no object */
    CHECK_EQ(read_with("{\"a\":\"b\"}", 9, 0, paths, NPATHS, found), 0);
    CHECK_EQ(found[A].type, PL_JSON_STRING);
    CHECK(found[A].len == 1 && found[A].p[0] == 'b' && !found[A].escaped);
    CHECK_EQ(found[B].type, PL_JSON_NONE);
    CHECK_EQ(read_with("[{\"a\":1}]", 9, 0, paths, NPATHS, found), 0);
    CHECK_EQ(found[A].type, PL_JSON_NONE);
    /* a repeated name: refused, and the first value is the one found */
    CHECK_EQ(read_with("{\"a\":{\"b\":1},\"a\":{\"b\":2}}", 25, 0, paths, NPATHS, found),
             PL_JSON_EDUP);
    CHECK(found[B].type == PL_JSON_NUMBER && found[B].p[0] == '1');
    /* every type, as found */
    {
        static const pl_json_path top[] = {
            {PL_JSON_ROOT, 1, "s"}, {PL_JSON_ROOT, 1, "n"}, {PL_JSON_ROOT, 1, "t"},
            {PL_JSON_ROOT, 1, "f"}, {PL_JSON_ROOT, 1, "z"}, {PL_JSON_ROOT, 1, "e"},
        };
        static const pl_json_type want[] = {PL_JSON_STRING, PL_JSON_NUMBER, PL_JSON_TRUE,
                                            PL_JSON_FALSE, PL_JSON_NULL, PL_JSON_STRING};
        pl_json_value v[6];
        const char *t = "{\"s\":\"x\",\"n\":-1.5e3,\"t\":true,\"f\":false,\"z\":null,\"e\":\"\\t\"}";

        CHECK_EQ(read_with(t, strlen(t), 0, top, 6, v), 0);
        for (int i = 0; i < 6; i++)
            CHECK_EQ(v[i].type, want[i]);
        CHECK(v[1].len == 6 && memcmp(v[1].p, "-1.5e3", 6) == 0);
        CHECK(v[2].len == 4 && v[4].len == 4 && v[3].len == 5);
        CHECK(!v[0].escaped && v[5].escaped);
    }
}

/* Many paths whose names share the reader's buckets are all found. */
static void test_many_paths(void)
{
    static char names[64][8];
    pl_json_path paths[64];
    pl_json_value found[64];
    char text[2048];
    int n = snprintf(text, sizeof(text), "{");

    for (int i = 0; i < 64; i++) {
        snprintf(names[i], sizeof(names[i]), "k%d", i);
        paths[i] = (pl_json_path){PL_JSON_ROOT, (uint8_t)strlen(names[i]), names[i]};
        if (i % 3 != 0)
            n += snprintf(text + n, sizeof(text) - (size_t)n, "%s\"k%d\":%d", n > 1 ? "," : "",
                          i, i);
    }
    snprintf(text + n, sizeof(text) - (size_t)n, "}");
    CHECK_EQ(read_with(text, strlen(text), 0, paths, 64, found), 0);
    for (int i = 0; i < 64; i++) {
        CHECK_EQ(found[i].type, i % 3 != 0 ? PL_JSON_NUMBER : PL_JSON_NONE);
        if (i % 3 != 0)
            CHECK_EQ(atoi(found[i].p), i);
    }
}

static void test_prefix(void)
{
    static const pl_json_path alg[] = {{PL_JSON_ROOT, 3, "alg"}};
    pl_json_value found[1];
    const char *t = " {\"alg\":\"x\",\"alg\":\"y\"}garbage\x01";

    /* the first value only: what follows is not read */
    CHECK_EQ(read_with(t, strlen(t), PL_JSON_PREFIX, alg, 1, found), PL_JSON_EDUP);
    CHECK_EQ(doc.end, (size_t)(strchr(t, '}') - t) + 1);
    CHECK_EQ(doc.root.type, PL_JSON_OBJECT);
    CHECK(found[0].len == 1 && found[0].p[0] == 'x');
    CHECK_EQ(read_with("12]", 3, PL_JSON_PREFIX, NULL, 0, NULL), 0);
    CHECK_EQ(doc.end, 2);
    CHECK_EQ(read_with("true", 3, PL_JSON_PREFIX, NULL, 0, NULL), PL_JSON_EINVAL);
    CHECK_EQ(read_with("{\"a\":1", 6, PL_JSON_PREFIX, NULL, 0, NULL), PL_JSON_EINVAL);
    CHECK_EQ(read_with("", 0, PL_JSON_PREFIX, NULL, 0, NULL), PL_JSON_EINVAL);
    /* without the flag the same bytes are refused */
    CHECK_EQ(read_with(t, strlen(t), 0, alg, 1, found), PL_JSON_EINVAL);
}

static void test_text_only(void)
{
    static const char *const refused[] = {
        "[\"\\u0000\"]", "[\"a\\u0000\"]", "[\"\\ud800\"]", "[\"\\udc00\"]",
        "[\"\\ud800\\u0041\"]", "[\"\\ud800\\ud800\\udc00\"]", "[\"\\udc00\\ud800\"]",
        "{\"\\u0000\":1}", "{\"\\uDBFF\":1}", "[\"\\ud800\"", "[\"\\ud800\\",
    };
    static const char *const accepted[] = {
        "[\"\\ud800\\udc00\"]", "[\"\\uDBFF\\uDFFF x\"]", "[\"\\\\u0000\"]", "[\"\\u0001\\uffff\"]",
        "{\"\\ud83d\\ude00\":\"\\u00e9\"}",
    };

    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        CHECK_EQ(read_doc(refused[i], PL_JSON_TEXT), PL_JSON_EINVAL);
        CHECK(doc.error != NULL);
    }
    CHECK_EQ(read_doc("[\"ab\\ud800\"]", PL_JSON_TEXT), PL_JSON_EINVAL);
    CHECK(strstr(doc.error, "lone surrogate") != NULL && doc.error_at == 4);
    for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++)
        CHECK_EQ(read_doc(accepted[i], PL_JSON_TEXT), 0);
}

static pl_json_value found_string(const char *text)
{
    static const pl_json_path s[] = {{PL_JSON_ROOT, 1, "s"}};
    pl_json_value v;

    CHECK_EQ(pl_json_read(text, strlen(text), 0, s, 1, &v, &doc), 0);
    return v;
}

static void test_strings(void)
{
    char out[64];
    pl_json_value v = found_string("{\"s\":\"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20ac"
                                   "\\ud83d\\ude00\\ud800\\u0000z\"}");
    static const char want[] = "q\"\\/\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xed\xa0\x80\0z";
    long n = pl_json_string(&v, out, sizeof(out));

    CHECK_EQ(n, sizeof(want) - 1);
    CHECK(n == sizeof(want) - 1 && memcmp(out, want, sizeof(want) - 1) == 0);
    CHECK(n <= (long)v.len);
    CHECK(pl_json_equals(&v, want, sizeof(want) - 1));
    CHECK(!pl_json_equals(&v, want, sizeof(want) - 2));
    CHECK(!pl_json_equals(&v, "q", 1));
    CHECK(!pl_json_is_text(out, (size_t)n));
    /* room for exactly the text, and one byte less */
    CHECK_EQ(pl_json_string(&v, out, sizeof(want) - 1), sizeof(want) - 1);
    CHECK_EQ(pl_json_string(&v, out, sizeof(want) - 2), -ENOSPC);
    v = found_string("{\"s\":\"plain \xc3\xa9\"}");
    CHECK_EQ(pl_json_string(&v, out, sizeof(out)), 8);
    CHECK_EQ(pl_json_string(&v, out, 7), -ENOSPC);
    CHECK(pl_json_equals(&v, "plain \xc3\xa9", 8));
    CHECK(pl_json_is_text(out, 8));
    v = found_string("{\"s\":\"\\u0048S256\"}");
    CHECK(pl_json_equals(&v, "HS256", 5));
    CHECK(!pl_json_equals(&v, "HS2560", 6));
    CHECK(!pl_json_equals(&v, "HS25", 4));
    v = found_string("{\"s\":1}");
    CHECK_EQ(pl_json_string(&v, out, sizeof(out)), -EINVAL);
    CHECK(!pl_json_equals(&v, "1", 1));
    /* a path the document lacks: no bytes at all (UBSan checks no pointer
     * arithmetic is done on them) */
    v = (pl_json_value){NULL, 0, PL_JSON_NONE, 0};
    CHECK(!pl_json_equals(&v, "", 0));
    CHECK_EQ(pl_json_string(&v, out, sizeof(out)), -EINVAL);
    {
        const char *cursor = NULL;
        pl_json_value e;
        double d;

        CHECK_EQ(pl_json_number(&v, &d), -EINVAL);
        CHECK_EQ(pl_json_element(&v, &cursor, &e), 0);
    }
    /* text: no NUL, no lone surrogate; pairs and ED 80-9F are fine */
    CHECK(pl_json_is_text("\xed\x9f\xbf", 3));
    CHECK(!pl_json_is_text("\xed\xbf\xbf", 3));
    CHECK(!pl_json_is_text("a\0", 2));
    CHECK(pl_json_is_text("", 0));
}

static void test_numbers(void)
{
    static const pl_json_path n[] = {{PL_JSON_ROOT, 1, "n"}};
    static const struct {
        const char *text;
        double want;
        int rc;
    } cases[] = {
        {"{\"n\":0.5}", 0.5, 0},
        {"{\"n\":-0}", -0.0, 0},
        {"{\"n\":1750003600}", 1750003600.0, 0},
        {"{\"n\":1.7500036e9}", 1750003600.0, 0},
        {"{\"n\":0.1}", 0.1, 0},
        {"{\"n\":123456789012345678901234567890}", 123456789012345678901234567890.0, 0},
        {"{\"n\":2.2250738585072011e-308}", 2.2250738585072011e-308, 0},
        {"{\"n\":1e999}", 0, -ERANGE},
        {"{\"n\":-1e999}", 0, -ERANGE},
        {"{\"n\":\"1\"}", 0, -EINVAL},
        {"{\"n\":null}", 0, -EINVAL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pl_json_value v;
        double d = 42;

        CHECK_EQ(pl_json_read(cases[i].text, strlen(cases[i].text), 0, n, 1, &v, &doc), 0);
        CHECK_EQ(pl_json_number(&v, &d), cases[i].rc);
        if (cases[i].rc == 0)
            CHECK(d == cases[i].want && signbit(d) == signbit(cases[i].want));
        else
            CHECK(d == 42);
    }
}

static void test_elements(void)
{
    static const pl_json_path a[] = {{PL_JSON_ROOT, 1, "a"}};
    const char *text = "{\"a\":[ \"x\" , {\"k\":[1,2]},[],\"\\u0079\",-2.5 ,null ],\"b\":1}";
    static const pl_json_type want[] = {PL_JSON_STRING, PL_JSON_OBJECT, PL_JSON_ARRAY,
                                        PL_JSON_STRING, PL_JSON_NUMBER, PL_JSON_NULL};
    pl_json_value v, e;
    const char *cursor = NULL;
    size_t count = 0;
    double d;
    int rc;

    CHECK_EQ(pl_json_read(text, strlen(text), 0, a, 1, &v, &doc), 0);
    while ((rc = pl_json_element(&v, &cursor, &e)) == 1) {
        CHECK(count < 6 && e.type == want[count]);
        if (count == 1)
            CHECK(e.len == 11 && memcmp(e.p, "{\"k\":[1,2]}", 11) == 0);
        if (count == 3)
            CHECK(pl_json_equals(&e, "y", 1));
        if (count == 4)
            CHECK(pl_json_number(&e, &d) == 0 && d == -2.5);
        count++;
    }
    CHECK_EQ(rc, 0);
    CHECK_EQ(count, 6);
    CHECK_EQ(pl_json_element(&v, &cursor, &e), 0); /* stays at the end */
    /* an empty array, and a value that is none */
    CHECK_EQ(pl_json_read("{\"a\":[ ]}", 9, 0, a, 1, &v, &doc), 0);
    cursor = NULL;
    CHECK_EQ(pl_json_element(&v, &cursor, &e), 0);
    CHECK_EQ(pl_json_read("{\"a\":\"[1]\"}", 11, 0, a, 1, &v, &doc), 0);
    cursor = NULL;
    CHECK_EQ(pl_json_element(&v, &cursor, &e), 0);
}

/* A document with more names than the static scratch holds, and long
 * escaped names, needs heap scratch: each allocation failing in turn gives
 * ENOMEM, never another verdict, and nothing leaks (ASan). */
static void test_out_of_memory(void)
{
    size_t cap = 64 * 1024, n = 0;
    char *text = malloc(cap);
    int rc = -1;

    n += (size_t)snprintf(text + n, cap - n, "{\"x\":{");
    for (int i = 0; i < 2000; i++)
        n += (size_t)snprintf(text + n, cap - n, "%s\"\\u006e%d\":%d", i ? "," : "", i, i);
    for (int i = 0; i < 3; i++)
        n += (size_t)snprintf(text + n, cap - n, ",\"\\u0041%01500d\":0", i);
    n += (size_t)snprintf(text + n, cap - n, "}}");
    for (unsigned long k = 1; k < 20 && rc != 0; k++) {
        pl_mem_fail_after(k, 0);
        rc = pl_json_read(text, n, 0, NULL, 0, NULL, &doc);
        pl_mem_fail_after(0, 0);
        CHECK(rc == 0 || rc == PL_JSON_ENOMEM);
        CHECK(k > 1 || rc == PL_JSON_ENOMEM); /* it does allocate */
    }
    CHECK_EQ(rc, 0);
    /* the same names twice over: found across the heap scratch too */
    memcpy(text + n - 2, ",\"n1999\":0}}", 13);
    CHECK_EQ(pl_json_read(text, n + 10, 0, NULL, 0, NULL, &doc), PL_JSON_EDUP);
    CHECK(doc.dup_len == 5 && memcmp(doc.dup, "n1999", 5) == 0);
    /* and a small document afterwards reads as ever */
    CHECK_EQ(read_doc("{\"a\":{\"b\":1,\"b\":2}}", 0), PL_JSON_EDUP);
    CHECK_EQ(read_doc("{\"a\":{\"b\":1,\"c\":2}}", 0), 0);
    free(text);
}

int main(void)
{
    RUN(test_values);
    RUN(test_refused);
    RUN(test_depth);
    RUN(test_duplicates);
    RUN(test_duplicates_in_large_objects);
    RUN(test_paths);
    RUN(test_many_paths);
    RUN(test_prefix);
    RUN(test_text_only);
    RUN(test_strings);
    RUN(test_numbers);
    RUN(test_elements);
    RUN(test_out_of_memory);
    return unit_finish();
}
