/* slow_start.c -- LD_PRELOAD shim for tests: the server's start is made
 * slow at a known point, after its own first instruction and before its
 * loop's signal handlers exist (uv_loop_init, called once, waits
 * PL_SLOW_START_MS first, 300 by default), so that a test can signal it
 * there on purpose rather than by luck. */
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>

#include <uv.h>

int uv_loop_init(uv_loop_t *loop)
{
    int (*real)(uv_loop_t *);
    const char *ms = getenv("PL_SLOW_START_MS");
    long wait = ms != NULL ? atol(ms) : 300;
    struct timespec ts = {wait / 1000, (wait % 1000) * 1000000L};

    *(void **)&real = dlsym(RTLD_NEXT, "uv_loop_init");

    while (nanosleep(&ts, &ts) != 0)
        ;
    return real != NULL ? real(loop) : -1;
}
