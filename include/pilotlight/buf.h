/* buf.h -- a growable byte buffer in the pools' size classes. */
#ifndef PILOTLIGHT_BUF_H
#define PILOTLIGHT_BUF_H

#include <stddef.h>
#include <stdint.h>

/* A growable byte buffer; all zero is an empty one. */
typedef struct {
    char *data;
    uint32_t len, cap;
} pl_buf;

/* Appends <n> bytes of <data>, growing by doubling; the bytes live in a
 * pool.h size class (the system allocator past PL_POOL_CLASS_MAX). Returns 0, or -ENOMEM
 * when out of memory or past 4 GiB (then <b> is unchanged). */
int pl_buf_append(pl_buf *b, const void *data, size_t n);

/* Makes room for <n> bytes in all, so appends up to that do not grow <b>
 * step by step. Returns 0, or -ENOMEM (<b> unchanged). */
int pl_buf_reserve(pl_buf *b, size_t n);

/* Frees the bytes; <b> is empty again. */
void pl_buf_free(pl_buf *b);

#endif
