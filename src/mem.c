/* mem.c -- allocator wrapper with failure injection for tests. */
#include <stdlib.h>
#include <string.h>

#include "pilotlight/mem.h"

static unsigned long fail_countdown;
static int fail_sticky;

static int should_fail(void)
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
    return should_fail() ? NULL : malloc(size);
}

void *pl_realloc(void *ptr, size_t size)
{
    return should_fail() ? NULL : realloc(ptr, size);
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

int pl_buf_append(pl_buf *b, const void *data, size_t n)
{
    if (n > UINT32_MAX - b->len)
        return -1;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 512;
        char *p;
        while (cap < b->len + n)
            cap *= 2;
        if (cap > UINT32_MAX)
            cap = UINT32_MAX;
        p = pl_realloc(b->data, cap);
        if (p == NULL)
            return -1;
        b->data = p;
        b->cap = (uint32_t)cap;
    }
    memcpy(b->data + b->len, data, n);
    b->len += (uint32_t)n;
    return 0;
}

void pl_buf_free(pl_buf *b)
{
    pl_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
