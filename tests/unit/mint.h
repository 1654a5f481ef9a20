/* mint.h -- deployment tokens for the unit tests: base64url and a JWT signed
 * with HMAC, made with libcrypto as Trigger.dev's jose makes them. */
#ifndef PILOTLIGHT_UNIT_MINT_H
#define PILOTLIGHT_UNIT_MINT_H

#include <stddef.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

/* Writes <n> bytes of <in> as unpadded base64url into <out> (room for
 * n * 4 / 3 + 2 bytes and a NUL). Returns its length. */
static inline size_t b64url(const unsigned char *in, size_t n, char *out)
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;
    unsigned long acc = 0;
    int bits = 0;

    for (size_t i = 0; i < n; i++) {
        acc = (acc << 8) | in[i];
        bits += 8;
        while (bits >= 6) {
            bits -= 6;
            out[o++] = abc[(acc >> bits) & 63];
        }
    }
    if (bits > 0)
        out[o++] = abc[(acc << (6 - bits)) & 63];
    out[o] = '\0';
    return o;
}

/* Writes "b64(header).b64(payload).b64(HMAC)" into <out> (big enough),
 * the HMAC keyed with <secret> using <md>. */
static inline void mint_with(const EVP_MD *md, const char *secret, const char *header,
                             const char *payload, char *out)
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    size_t n = b64url((const unsigned char *)header, strlen(header), out);

    out[n++] = '.';
    n += b64url((const unsigned char *)payload, strlen(payload), out + n);
    HMAC(md, secret, (int)strlen(secret), (unsigned char *)out, n, mac, &mac_len);
    out[n++] = '.';
    b64url(mac, mac_len, out + n);
}

#endif
