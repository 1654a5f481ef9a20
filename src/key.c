/* key.c -- parsing and canonical encoding of the match key. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pilotlight/key.h"

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* Returns 1 when s[0..len) is a number in JSON's grammar: what JavaScript's
 * String(number) writes for the sizes controllers send. */
static int json_number_syntax(const char *s, size_t len)
{
    size_t i = 0;

    if (i < len && s[i] == '-')
        i++;
    if (i < len && s[i] == '0')
        i++;
    else if (i < len && is_digit(s[i]))
        while (i < len && is_digit(s[i]))
            i++;
    else
        return 0;
    if (i < len && s[i] == '.') {
        if (++i >= len || !is_digit(s[i]))
            return 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= len || !is_digit(s[i]))
            return 0;
        while (i < len && is_digit(s[i]))
            i++;
    }
    return i == len;
}

int pl_key_number_exact(const char *s, size_t len, double *out)
{
    /* Every power of ten up to 1e22 is a double exactly. */
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    const char *p = s, *end = s + len;
    uint64_t m = 0;
    int digits = 0, exp10 = 0, e = 0, eneg = 0;
    double v;

    if (p < end && *p == '-')
        p++;
    for (; p < end && is_digit(*p); p++, digits++)
        m = m * 10 + (uint64_t)(*p - '0');
    if (p < end && *p == '.')
        for (p++; p < end && is_digit(*p); p++, digits++, exp10--)
            m = m * 10 + (uint64_t)(*p - '0');
    /* Up to 15 digits fit a double's 53 bits, exactly (and m cannot wrap). */
    if (digits > 15)
        return -ERANGE;
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            eneg = *p++ == '-';
        for (; p < end && is_digit(*p); p++)
            if ((e = e * 10 + (*p - '0')) > 100)
                return -ERANGE;
        exp10 += eneg ? -e : e;
    }
    if (exp10 < -22 || exp10 > 22)
        return -ERANGE;
    /* Two exact operands and one IEEE operation: correctly rounded, as
     * strtod() and JavaScript's Number parsing are (Clinger's fast path). */
    v = exp10 < 0 ? (double)m / pow10[-exp10] : (double)m * pow10[exp10];
    *out = *s == '-' ? -v : v;
    return 0;
}

int pl_key_parse_number(const char *s, size_t len, double *out)
{
    char buf[64];
    double v;

    if (len == 0 || len >= sizeof(buf) || !json_number_syntax(s, len))
        return -EINVAL;
    if (pl_key_number_exact(s, len, &v) != 0) {
        memcpy(buf, s, len);
        buf[len] = '\0';
        v = strtod(buf, NULL);
    }
    if (!isfinite(v))
        return -EINVAL;
    *out = v == 0 ? 0 : v; /* -0 and 0 are one key */
    return 0;
}

static unsigned char *put_number(unsigned char *p, double v)
{
    if (v == 0)
        v = 0;
    memcpy(p, &v, sizeof(v));
    return p + sizeof(v);
}

size_t pl_key_encode(const pl_key *k, unsigned char *buf)
{
    unsigned char *p = buf;
    uint16_t dlen;

    if (k->deployment_len == 0 || k->deployment_len > PL_KEY_FIELD_MAX ||
        k->version_len == 0 || k->version_len > PL_KEY_FIELD_MAX)
        return 0;
    p = put_number(p, k->cpu);
    p = put_number(p, k->memory);
    /* The deployment's length goes first so no (deployment, version) split
     * of the same bytes can collide. */
    dlen = (uint16_t)k->deployment_len;
    memcpy(p, &dlen, sizeof(dlen));
    p += sizeof(dlen);
    memcpy(p, k->deployment, k->deployment_len);
    p += k->deployment_len;
    memcpy(p, k->version, k->version_len);
    p += k->version_len;
    return (size_t)(p - buf);
}

void pl_key_decode(const unsigned char *buf, size_t len, pl_key *k)
{
    uint16_t dlen;

    memcpy(&k->cpu, buf, sizeof(double));
    memcpy(&k->memory, buf + sizeof(double), sizeof(double));
    memcpy(&dlen, buf + 2 * sizeof(double), sizeof(dlen));
    k->deployment = (const char *)buf + 2 * sizeof(double) + sizeof(dlen);
    k->deployment_len = dlen;
    k->version = k->deployment + dlen;
    k->version_len = len - 2 * sizeof(double) - sizeof(dlen) - dlen;
}
