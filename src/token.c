/* token.c -- reading deployment tokens (JWT-shaped deployment ids). */
#include <string.h>

#include <cjson/cJSON.h>

#include "pilotlight/mem.h"
#include "pilotlight/token.h"

static int b64url_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

int pl_token_is_jwt(const char *s, size_t len)
{
    size_t seg = 0, dots = 0;

    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (seg == 0 || ++dots > 2)
                return 0;
            seg = 0;
        } else if (b64url_value((unsigned char)s[i]) < 0) {
            return 0;
        } else {
            seg++;
        }
    }
    return dots == 2 && seg > 0;
}

long pl_token_b64url_decode(const char *in, size_t len, unsigned char *out)
{
    unsigned long acc = 0;
    int bits = 0;
    long n = 0;

    if (len % 4 == 1)
        return -1;
    for (size_t i = 0; i < len; i++) {
        int v = b64url_value((unsigned char)in[i]);
        if (v < 0)
            return -1;
        acc = (acc << 6) | (unsigned long)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
            acc &= (1UL << bits) - 1;
        }
    }
    return n;
}

long pl_token_deployment(const char *s, size_t len, char *out, size_t cap)
{
    const char *p = memchr(s, '.', len), *q;
    unsigned char *json;
    cJSON *root, *dep;
    long n, rc = -1;

    if (p == NULL || (q = memchr(p + 1, '.', len - (size_t)(p + 1 - s))) == NULL)
        return -1;
    json = pl_malloc((size_t)(q - p) * 3 / 4 + 4);
    if (json == NULL)
        return -1;
    n = pl_token_b64url_decode(p + 1, (size_t)(q - p - 1), json);
    root = n > 0 ? cJSON_ParseWithLength((const char *)json, (size_t)n) : NULL;
    dep = cJSON_GetObjectItemCaseSensitive(root, "deployment");
    if (cJSON_IsString(dep) && dep->valuestring[0] != '\0' &&
        strlen(dep->valuestring) < cap) {
        rc = (long)strlen(dep->valuestring);
        memcpy(out, dep->valuestring, (size_t)rc + 1);
    }
    cJSON_Delete(root);
    pl_free(json);
    return rc;
}
