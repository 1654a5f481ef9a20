/* utf8.h -- what counts as well-formed UTF-8, for every reader of a
 * client's bytes: the JSON reader (json.c: dispatch bodies, token
 * segments), error texts naming a member (message.c) and the log's
 * escaping (log.c). RFC 3629: no overlong form, no surrogate,
 * nothing above U+10FFFF -- what JavaScript's decoder takes as it is
 * rather than replacing with U+FFFD. */
#ifndef PILOTLIGHT_UTF8_H
#define PILOTLIGHT_UTF8_H

#include <stddef.h>

/* Length of the well-formed sequence at <p> (<n> >= 1 bytes there): 1 for
 * ASCII, 2 to 4, or 0 when it is not one. The second byte's range rules
 * out the overlong forms and the surrogates without decoding. */
static inline size_t pl_utf8_len(const unsigned char *p, size_t n)
{
    unsigned c = p[0], lo = 0x80, hi = 0xBF;
    size_t len;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

#endif
