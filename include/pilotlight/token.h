/* token.h -- deployment tokens: a JWT in the x-trigger-deployment-id header.
 *
 * Every reading of a token goes through pl_token_deployment(), so signature
 * verification can wrap this one place. */
#ifndef PILOTLIGHT_TOKEN_H
#define PILOTLIGHT_TOKEN_H

#include <stddef.h>

/* Returns 1 when <s> is three non-empty base64url segments joined by dots. */
int pl_token_is_jwt(const char *s, size_t len);

/* Decodes base64url (no padding) <in> into <out> (room for len*3/4+3 bytes).
 * Returns the decoded length, or -1 on a character outside the alphabet or
 * an impossible length. */
long pl_token_b64url_decode(const char *in, size_t len, unsigned char *out);

/* For a JWT-shaped <s>, copies the payload's "deployment" claim into <out>
 * (<cap> bytes, NUL-terminated). Returns its length, or -1 when the payload
 * is not base64url JSON or has no non-empty string "deployment" claim that
 * fits. */
long pl_token_deployment(const char *s, size_t len, char *out, size_t cap);

#endif
