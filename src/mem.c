/* mem.c -- the allocator wrapper, with failure injection for tests. */
#include <stdlib.h>

#include "pilotlight/mem.h"

static unsigned long fail_countdown;
static int fail_sticky;

int pl_mem_should_fail(void)
{
    if (fail_countdown == 0)
        return 0;
    if (fail_countdown > 1) {
        fail_countdown--;
        return 0;
    }
    if (!fail_sticky)
        fail_countdown = 0;
    return 1;
}

void *pl_malloc(size_t size)
{
    return pl_mem_should_fail() ? NULL : malloc(size);
}

void *pl_realloc(void *ptr, size_t size)
{
    return pl_mem_should_fail() ? NULL : realloc(ptr, size);
}

void pl_free(void *ptr)
{
    free(ptr);
}

void pl_mem_fail_after(unsigned long n, int sticky)
{
    fail_countdown = n;
    fail_sticky = sticky;
}
