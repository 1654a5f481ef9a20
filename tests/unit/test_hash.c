/* test_hash.c -- pl_hash: every byte counts, the salt and the secret
 * change it, ids spread over the low bits uthash uses, no read past the
 * end (each input in a buffer of its exact size, for AddressSanitizer). */
#include <stdlib.h>

#include "pilotlight/hash.h"
#include "unit.h"

static void test_every_byte_and_bit_counts(void)
{
    for (size_t len = 0; len <= 40; len++) {
        unsigned char *b = malloc(len ? len : 1);
        for (size_t i = 0; i < len; i++)
            b[i] = (unsigned char)('a' + (i * 7) % 26);
        uint32_t h = pl_hash(b, len, 0);
        for (size_t i = 0; i < len; i++)
            for (int bit = 0; bit < 8; bit++) {
                b[i] ^= (unsigned char)(1u << bit);
                CHECK(pl_hash(b, len, 0) != h);
                b[i] ^= (unsigned char)(1u << bit);
            }
        CHECK_EQ(pl_hash(b, len, 0), h);
        free(b);
    }
}

static void test_length_counts(void)
{
    /* "a" and "a\0": the zero byte adds nothing to the word, the length does. */
    static const char z[24] = "a";
    for (size_t len = 0; len < sizeof(z); len++)
        CHECK(pl_hash(z, len, 0) != pl_hash(z, len + 1, 0));
}

static void test_salt_and_secret_change_it(void)
{
    static const char id[] = "controller_5d1d3c0c-8a1b-4f3e-9a57-0c1f2e3d4b5a";
    uint64_t saved = pl_hash_secret;
    uint32_t h = pl_hash(id, sizeof(id) - 1, 0);

    CHECK(pl_hash(id, sizeof(id) - 1, 1) != h);
    CHECK(pl_hash(id, sizeof(id) - 1, (uint64_t)1 << 32) != h);
    pl_hash_secret = 0x0123456789abcdefu;
    CHECK(pl_hash(id, sizeof(id) - 1, 0) != h);
    pl_hash_secret = saved;
    CHECK_EQ(pl_hash(id, sizeof(id) - 1, 0), h);
}

/* uthash takes a bucket from the low bits: ids that differ in a digit or
 * two must not crowd a few of them. */
static void test_ids_spread_over_low_bits(void)
{
    enum { N = 20000, BUCKETS = 1024 };
    static unsigned load[BUCKETS];
    unsigned max = 0;
    char id[64];

    for (int i = 0; i < N; i++) {
        int n = snprintf(id, sizeof(id), "controller_%d", i);
        unsigned b = pl_hash(id, (size_t)n, 0) & (BUCKETS - 1);
        if (++load[b] > max)
            max = load[b];
    }
    /* ~19.5 each; a fair hash puts no more than ~40 in any. */
    CHECK(max < 45);
}

static void test_init_draws_a_secret(void)
{
    pl_hash_secret = 0;
    pl_hash_init();
    CHECK(pl_hash_secret != 0);
}

int main(void)
{
    RUN(test_every_byte_and_bit_counts);
    RUN(test_length_counts);
    RUN(test_salt_and_secret_change_it);
    RUN(test_ids_spread_over_low_bits);
    RUN(test_init_draws_a_secret);
    return unit_finish();
}
