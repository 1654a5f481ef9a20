/* cidr.c -- address ranges, parsed once, matched per connection. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <netinet/in.h>

#include "pilotlight/cidr.h"

static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

/* One range, "<addr>[/<bits>]" in s[0..len). Returns 0 or -EINVAL. */
static int parse_one(const char *s, size_t len, pl_cidr *out)
{
    char buf[INET6_ADDRSTRLEN + 8];
    const char *slash;
    unsigned long bits;
    unsigned max, extra;
    char *end;

    if (len == 0 || len >= sizeof(buf))
        return -EINVAL;
    memcpy(buf, s, len);
    buf[len] = '\0';
    slash = strchr(buf, '/');
    if (slash != NULL)
        buf[slash - buf] = '\0';
    memset(out, 0, sizeof(*out));
    if (inet_pton(AF_INET, buf, out->addr + 12) == 1) {
        memcpy(out->addr, v4_mapped, 12);
        max = 32;
        extra = 96;
    } else if (inet_pton(AF_INET6, buf, out->addr) == 1) {
        max = 128;
        extra = 0;
    } else {
        return -EINVAL;
    }
    bits = max;
    if (slash != NULL) {
        const char *b = slash + 1;
        if (!isdigit((unsigned char)b[0]) || (b[0] == '0' && b[1] != '\0'))
            return -EINVAL;
        errno = 0;
        bits = strtoul(b, &end, 10);
        if (*end != '\0' || errno != 0 || bits > max)
            return -EINVAL;
    }
    out->bits = (uint8_t)(bits + extra);
    /* no bit set past the prefix */
    for (unsigned i = out->bits; i < 128; i++)
        if (out->addr[i / 8] & (0x80 >> (i % 8)))
            return -EINVAL;
    return 0;
}

int pl_cidr_parse(const char *text, pl_cidr_list *out, char *err, size_t errlen)
{
    const char *p = text;

    memset(out, 0, sizeof(*out));
    while (*p != '\0') {
        const char *start, *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);

        start = p;
        while (len > 0 && isspace((unsigned char)*start)) {
            start++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)start[len - 1]))
            len--;
        if (out->n == PL_CIDR_MAX) {
            snprintf(err, errlen, "more than %d ranges", PL_CIDR_MAX);
            return -EINVAL;
        }
        if (parse_one(start, len, &out->r[out->n]) != 0) {
            snprintf(err, errlen, "'%.*s' is not an address or ADDRESS/BITS with no bit set "
                     "past BITS", (int)(len < 64 ? len : 64), start);
            return -EINVAL;
        }
        out->n++;
        if (comma == NULL)
            break;
        p = comma + 1;
        if (*p == '\0') {
            snprintf(err, errlen, "a comma with no range after it");
            return -EINVAL;
        }
    }
    return 0;
}

static int in_range(const pl_cidr *c, const uint8_t a[16])
{
    unsigned full = c->bits / 8, rest = c->bits % 8;

    if (memcmp(c->addr, a, full) != 0)
        return 0;
    return rest == 0 || ((c->addr[full] ^ a[full]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

int pl_cidr_match(const pl_cidr_list *l, const struct sockaddr *sa)
{
    uint8_t a[16];

    if (sa->sa_family == AF_INET) {
        memcpy(a, v4_mapped, 12);
        memcpy(a + 12, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        memcpy(a, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, 16);
    } else {
        return 0;
    }
    for (unsigned i = 0; i < l->n; i++)
        if (in_range(&l->r[i], a))
            return 1;
    return 0;
}
