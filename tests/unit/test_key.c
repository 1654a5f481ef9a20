/* test_key.c -- number parsing and canonical encoding of the match key. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pilotlight/key.h"
#include "unit.h"

static int parse(const char *s, double *out)
{
    return pl_key_parse_number(s, strlen(s), out);
}

static void test_parse_rejects_non_numbers(void)
{
    static const char *const bad[] = {
        "", "abc", "1x", " 1", "1 ", "0x10", "inf", "-inf", "Infinity",
        "nan", "NaN", "1e999", "-1e999", "-", "e5", "1e", "1,5", "1\t",
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        double v = 12345;
        int rc = parse(bad[i], &v);
        if (rc != -EINVAL)
            fprintf(stderr, "  accepted \"%s\" as %g\n", bad[i], v);
        CHECK_EQ(rc, -EINVAL);
    }
}

static void test_parse_accepts_numbers(void)
{
    double v = -1;

    CHECK_EQ(parse("1", &v), 0);
    CHECK(v == 1.0);
    CHECK_EQ(parse("1.0", &v), 0);
    CHECK(v == 1.0);
    CHECK_EQ(parse("0.25", &v), 0);
    CHECK(v == 0.25);
    CHECK_EQ(parse("5e-1", &v), 0);
    CHECK(v == 0.5);
    CHECK_EQ(parse("2E3", &v), 0);
    CHECK(v == 2000.0);
    CHECK_EQ(parse("1024", &v), 0);
    CHECK(v == 1024.0);
    CHECK_EQ(parse("-0", &v), 0);
    CHECK(v == 0.0);
    CHECK(!signbit(v)); /* -0 and 0 must be one key */
}

/* The input is a header value, not a C string: only <len> bytes count. */
static void test_parse_honours_length(void)
{
    double v = 0;

    CHECK_EQ(pl_key_parse_number("12", 1, &v), 0);
    CHECK(v == 1.0);
    CHECK_EQ(pl_key_parse_number("0.5xyz", 3, &v), 0);
    CHECK(v == 0.5);
    CHECK_EQ(pl_key_parse_number("1", 0, &v), -EINVAL);
}

/* The fast reading must be exactly strtod()'s (correctly rounded, as
 * JavaScript's), bit for bit, wherever it answers; and it must decline what
 * needs more than a double's precision rather than round it twice. */
static void test_exact_numbers_match_strtod(void)
{
    static const char *const edge[] = {
        "0", "-0", "0.1", "0.2", "0.3", "0.5", "1.7976931348623157", "9007199254740993",
        "123456789012345", "1234567890123456", "999999999999999e22", "1e22", "1e23",
        "1e-22", "1e-23", "4.35", "0.000001", "0.0000000000000001", "2.5E+3", "7e-0",
        "1e100", "1e0100", "8.589973e9", "89255e-22", "3.14159265358979",
    };
    unsigned long long rng = 0x9e3779b97f4a7c15ULL;
    char buf[64];
    int fast = 0;

    for (int i = 0; i < 200000; i++) {
        const char *s = buf;
        double v = -1, want;
        size_t n = 0;
        if (i < (int)(sizeof(edge) / sizeof(edge[0]))) {
            s = edge[i];
        } else {
            /* Random tokens in JSON's grammar: digits, a fraction, an exponent. */
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            int ip = 1 + (int)(rng % 12), fp = (int)(rng >> 8) % 10, ex = (int)(rng >> 16) % 61 - 30;
            if (rng >> 63)
                buf[n++] = '-';
            for (int d = 0; d < ip; d++)
                buf[n++] = (char)('0' + (d == 0 ? 1 + (rng >> (20 + d)) % 9 : (rng >> (20 + 3 * d)) % 10));
            if (fp > 0) {
                buf[n++] = '.';
                for (int d = 0; d < fp; d++)
                    buf[n++] = (char)('0' + (rng >> (d * 5 + 3)) % 10);
            }
            if ((rng >> 40) & 1)
                n += (size_t)snprintf(buf + n, sizeof(buf) - n, "e%d", ex);
            buf[n] = '\0';
        }
        want = strtod(s, NULL);
        if (pl_key_number_exact(s, strlen(s), &v) == 0) {
            fast++;
            if (memcmp(&v, &want, sizeof(v)) != 0)
                fprintf(stderr, "  %s: %.17g, strtod %.17g\n", s, v, want);
            CHECK(memcmp(&v, &want, sizeof(v)) == 0);
        }
        if (isfinite(want) && want != 0) {
            CHECK_EQ(parse(s, &v), 0);
            CHECK(v == want);
        }
    }
    CHECK(fast > 100000); /* the fast path is the common one */
    CHECK_EQ(pl_key_number_exact("1234567890123456", 16, &(double){0}), -ERANGE);
    CHECK_EQ(pl_key_number_exact("1e23", 4, &(double){0}), -ERANGE);
}

static pl_key key(const char *dep, const char *ver, double cpu, double mem)
{
    pl_key k = {dep, strlen(dep), ver, strlen(ver), cpu, mem};
    return k;
}

/* 1 when <a> and <b> encode to the same bytes. Both must encode. */
static int same_encoding(const pl_key *a, const pl_key *b)
{
    unsigned char ea[PL_KEY_ENCODED_MAX], eb[PL_KEY_ENCODED_MAX];
    size_t la = pl_key_encode(a, ea), lb = pl_key_encode(b, eb);

    CHECK(la > 0);
    CHECK(lb > 0);
    return la == lb && memcmp(ea, eb, la) == 0;
}

static double num(const char *s)
{
    double v = -12345;

    CHECK_EQ(parse(s, &v), 0);
    return v;
}

static void test_encode_numbers_as_numbers(void)
{
    pl_key a = key("dep", "v1", num("1"), num("512"));
    pl_key b = key("dep", "v1", num("1.0"), num("5.12e2"));
    pl_key c = key("dep", "v1", num("0.5"), num("512"));
    pl_key d = key("dep", "v1", num("5e-1"), num("512"));
    pl_key f = key("dep", "v1", num("0.25"), num("512"));
    pl_key g = key("dep", "v1", num("0.5"), num("1024"));
    pl_key z = key("dep", "v1", num("0"), num("512"));
    pl_key nz = key("dep", "v1", num("-0"), num("512"));
    pl_key raw_nz = key("dep", "v1", -0.0, 512);

    CHECK(same_encoding(&a, &b));
    CHECK(same_encoding(&c, &d));
    CHECK(!same_encoding(&c, &f));
    CHECK(!same_encoding(&c, &g));
    CHECK(!same_encoding(&a, &c));
    CHECK(same_encoding(&z, &nz));
    CHECK(same_encoding(&z, &raw_nz)); /* even when not from the parser */
}

static void test_encode_strings_by_content(void)
{
    char dep1[] = "deployment_abc", dep2[] = "deployment_abc";
    pl_key a = key(dep1, "20240101.1", 1, 1024);
    pl_key b = key(dep2, "20240101.1", 1, 1024);
    pl_key c = key("deployment_abd", "20240101.1", 1, 1024);
    pl_key d = key("deployment_abc", "20240101.2", 1, 1024);

    CHECK(same_encoding(&a, &b));
    CHECK(!same_encoding(&a, &c));
    CHECK(!same_encoding(&a, &d));
}

/* The same bytes split differently between deployment and version are two
 * different keys. */
static void test_encode_split_differs(void)
{
    pl_key a = key("ab", "c", 1, 1);
    pl_key b = key("a", "bc", 1, 1);
    pl_key c = key("abc", "x", 1, 1);
    pl_key d = key("ab", "cx", 1, 1);

    CHECK(!same_encoding(&a, &b));
    CHECK(!same_encoding(&c, &d));
}

static void test_encode_limits(void)
{
    static char big[PL_KEY_FIELD_MAX + 2];
    unsigned char buf[PL_KEY_ENCODED_MAX];
    pl_key k;

    memset(big, 'x', sizeof(big) - 1);
    k = key("", "v", 1, 1);
    CHECK_EQ(pl_key_encode(&k, buf), 0);
    k = key("d", "", 1, 1);
    CHECK_EQ(pl_key_encode(&k, buf), 0);

    k = key(big, big, 1, 1);
    k.deployment_len = PL_KEY_FIELD_MAX;
    k.version_len = PL_KEY_FIELD_MAX;
    {
        size_t n = pl_key_encode(&k, buf);
        CHECK(n > 2 * PL_KEY_FIELD_MAX);
        CHECK(n <= PL_KEY_ENCODED_MAX);
    }
    k.deployment_len = PL_KEY_FIELD_MAX + 1;
    CHECK_EQ(pl_key_encode(&k, buf), 0);
    k.deployment_len = PL_KEY_FIELD_MAX;
    k.version_len = PL_KEY_FIELD_MAX + 1;
    CHECK_EQ(pl_key_encode(&k, buf), 0);
}

int main(void)
{
    RUN(test_parse_rejects_non_numbers);
    RUN(test_parse_accepts_numbers);
    RUN(test_parse_honours_length);
    RUN(test_exact_numbers_match_strtod);
    RUN(test_encode_numbers_as_numbers);
    RUN(test_encode_strings_by_content);
    RUN(test_encode_split_differs);
    RUN(test_encode_limits);
    return unit_finish();
}
