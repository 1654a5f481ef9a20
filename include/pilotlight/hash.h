/* hash.h -- the hash of the tables clients fill: waiters by key and by
 * controller id (engine.c), verified tokens (token.c), the member names of
 * a client's JSON document (json.c).
 *
 * Keyed with a secret drawn at start, so that a client cannot choose names
 * that all land in one bucket and turn each lookup into a list walk. Eight
 * bytes at a time (multiply and fold), the last eight read once even where
 * they overlap the previous word: ids and keys are 10-60 bytes. */
#ifndef PILOTLIGHT_HASH_H
#define PILOTLIGHT_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern uint64_t pl_hash_secret;

/* Draws the secret (getrandom(2); the clock and pid where that fails).
 * Before it is called the secret is 0: fine for unit tests. */
void pl_hash_init(void);

static inline uint32_t pl_hash(const void *data, size_t len, uint64_t salt)
{
    const uint64_t k = 0x9E3779B97F4A7C15u;
    const unsigned char *s = data, *end = s + len;
    uint64_t h = (pl_hash_secret ^ salt ^ len) * k, w = 0;

    if (len >= 8) {
        for (; end - s > 8; s += 8) {
            memcpy(&w, s, 8);
            h = (h ^ w) * k;
            h ^= h >> 29;
        }
        memcpy(&w, end - 8, 8);
    } else {
        for (; s < end; s++)
            w = w << 8 | *s;
    }
    /* A product's top byte reaches only its top bits: fold and multiply
     * once more, so the last bytes of an id move the low bits uthash uses. */
    h = (h ^ w) * k;
    h = (h ^ h >> 32) * k;
    return (uint32_t)(h >> 32);
}

#endif
