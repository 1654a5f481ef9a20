/* hash.c -- the secret that keys pl_hash (see hash.h). */
#include "pilotlight/hash.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t pl_hash_secret;

void pl_hash_init(void)
{
    struct timespec ts;

    if (getrandom(&pl_hash_secret, sizeof(pl_hash_secret), GRND_NONBLOCK) ==
        (ssize_t)sizeof(pl_hash_secret))
        return;
    /* No entropy yet (early boot): weaker, but not a constant. */
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pl_hash_secret = ((uint64_t)ts.tv_nsec << 32 ^ (uint64_t)ts.tv_sec ^ (uint64_t)getpid()) *
                     0x9E3779B97F4A7C15u;
}
