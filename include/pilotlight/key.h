/* key.h -- the match key: deployment, version, machine cpu and memory.
 *
 * A key borrows its strings; it is a view, valid while they are. cpu and
 * memory are compared as numbers, so "1", 1 and 1.0 are one key. */
#ifndef PILOTLIGHT_KEY_H
#define PILOTLIGHT_KEY_H

#include <stddef.h>
#include <stdint.h>

/* Longest deployment or version accepted, in bytes. */
#define PL_KEY_FIELD_MAX 512
/* Size of the canonical encoding produced by pl_key_encode(), at most. */
#define PL_KEY_ENCODED_MAX (2 * PL_KEY_FIELD_MAX + 20)

typedef struct {
    const char *deployment;
    size_t deployment_len;
    const char *version;
    size_t version_len;
    double cpu;
    double memory;
} pl_key;

/* Parses a machine size given as text (a header value): a finite number in
 * JSON's grammar and nothing else. Returns 0 and sets *out, or -EINVAL
 * (leaving *out alone) when <s> is not such a number. */
int pl_key_parse_number(const char *s, size_t len, double *out);

/* The value of the JSON number token s[0..len) (grammar already checked)
 * when it takes no more than a double's precision to get exactly: up to 15
 * digits and a power of ten within 1e22. Returns 0 and sets *out, or -ERANGE:
 * then strtod() has to read it. */
int pl_key_number_exact(const char *s, size_t len, double *out);

/* Writes the canonical byte encoding of <k> into <buf> (PL_KEY_ENCODED_MAX
 * bytes) so equal keys encode equally. Returns its length, or 0 when a field
 * is empty or longer than PL_KEY_FIELD_MAX. */
size_t pl_key_encode(const pl_key *k, unsigned char *buf);

/* Reads back a key written by pl_key_encode(); its strings point into <buf>
 * and are not NUL-terminated. */
void pl_key_decode(const unsigned char *buf, size_t len, pl_key *k);

#endif
