/* buf.c -- growable byte buffers, their bytes in the pools. */
#include <errno.h>
#include <string.h>

#include "pilotlight/buf.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"

/* Moves <b>'s bytes to a block of at least <want> bytes: a size class up
 * to PL_POOL_CLASS_MAX, the system allocator past it. */
static int buf_grow(pl_buf *b, size_t want)
{
    size_t cap;
    char *p;

    if (want > PL_POOL_CLASS_MAX && b->cap > PL_POOL_CLASS_MAX) {
        p = pl_realloc(b->data, want);
        cap = want;
    } else {
        p = pl_pool_alloc(want, &cap);
        if (p != NULL && b->len > 0)
            memcpy(p, b->data, b->len);
        if (p != NULL)
            pl_pool_free(b->data, b->cap);
    }
    if (p == NULL)
        return -ENOMEM;
    b->data = p;
    b->cap = (uint32_t)cap;
    return 0;
}

int pl_buf_append(pl_buf *b, const void *data, size_t n)
{
    if (n > UINT32_MAX - b->len)
        return -ENOMEM;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        if (cap > UINT32_MAX)
            cap = UINT32_MAX;
        if (buf_grow(b, cap) != 0)
            return -ENOMEM;
    }
    memcpy(b->data + b->len, data, n);
    b->len += (uint32_t)n;
    return 0;
}

int pl_buf_reserve(pl_buf *b, size_t n)
{
    if (n > UINT32_MAX)
        return -ENOMEM;
    return n <= b->cap ? 0 : buf_grow(b, n);
}

void pl_buf_free(pl_buf *b)
{
    pl_pool_free(b->data, b->cap);
    b->data = NULL;
    b->len = b->cap = 0;
}
