/* test_utf8.c -- pl_utf8_len against a decoder written out the long way
 * (every lead byte, with every second byte and fixed continuations), and
 * the log's escaping, which relies on it for "valid JSON whatever a client
 * sent". */
#include <stdint.h>

#include "pilotlight/log.h"
#include "pilotlight/utf8.h"
#include "unit.h"

/* The definition, by decoding: the shortest form of a scalar value. */
static size_t reference(const unsigned char *p, size_t n)
{
    size_t len = p[0] < 0x80 ? 1 : p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC0 ? 2 : 0;
    uint32_t cp, min[] = {0, 0, 0x80, 0x800, 0x10000};

    if (len == 0 || len > n || p[0] >= 0xF8)
        return 0;
    cp = len == 1 ? p[0] : p[0] & (0x7Fu >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if (cp < min[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        return 0;
    return len;
}

static void test_matches_the_definition(void)
{
    unsigned char b[4];
    unsigned long disagree = 0;

    for (unsigned lead = 0; lead < 256; lead++)
        for (unsigned second = 0; second < 256; second++)
            for (size_t n = 1; n <= 4; n++) {
                b[0] = (unsigned char)lead;
                b[1] = (unsigned char)second;
                b[2] = b[3] = 0x80;
                if (pl_utf8_len(b, n) != reference(b, n))
                    disagree++;
            }
    CHECK_EQ(disagree, 0);
    CHECK_EQ(pl_utf8_len((const unsigned char *)"\xF4\x8F\xBF\xBF", 4), 4); /* U+10FFFF */
    CHECK_EQ(pl_utf8_len((const unsigned char *)"\xF4\x90\x80\x80", 4), 0); /* above it */
    CHECK_EQ(pl_utf8_len((const unsigned char *)"\xED\xA0\x80", 3), 0);     /* U+D800 */
    CHECK_EQ(pl_utf8_len((const unsigned char *)"\xE0\x9F\xBF", 3), 0);     /* overlong */
    CHECK_EQ(pl_utf8_len((const unsigned char *)"\xE2\x82\xAC", 2), 0);     /* cut short */
}

static void test_log_escape_replaces_what_is_not_utf8(void)
{
    char out[64];

    /* F8 once passed the log's own check as a three-byte lead. */
    pl_log_escape(out, sizeof(out), "a\xF8\x80\x80z", 5);
    CHECK_STR(out, "a\\ufffd\\ufffd\\ufffdz");
    pl_log_escape(out, sizeof(out), "\xE2\x82\xAC\xC0\xAF", 5);
    CHECK_STR(out, "\xE2\x82\xAC\\ufffd\\ufffd");
}

int main(void)
{
    RUN(test_matches_the_definition);
    RUN(test_log_escape_replaces_what_is_not_utf8);
    return unit_finish();
}
