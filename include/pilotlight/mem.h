/* mem.h -- the one allocator wrapper: every pilotlight allocation goes here.
 *
 * Policy: allocation failure is reported to the caller (NULL), never turned
 * into exit(); each caller degrades one request, not the process. */
#ifndef PILOTLIGHT_MEM_H
#define PILOTLIGHT_MEM_H

#include <stddef.h>
#include <stdint.h>

/* Like malloc/realloc/free. Return NULL on failure (or injected failure). */
void *pl_malloc(size_t size);
void *pl_realloc(void *ptr, size_t size);
void pl_free(void *ptr);

/* Test hook: make the <n>th allocation from now on fail (1 = the next one),
 * and every one after it while <sticky> is non-zero. n = 0 disables. */
void pl_mem_fail_after(unsigned long n, int sticky);

/* Takes one step of that countdown: returns 1 when this allocation is to
 * fail. For allocators built on this one (pool.h). */
int pl_mem_should_fail(void);

/* A growable byte buffer; all zero is an empty one. */
typedef struct {
    char *data;
    uint32_t len, cap;
} pl_buf;

/* Appends <n> bytes of <data>, growing by doubling; the bytes live in a
 * pool.h size class (the system allocator past PL_POOL_CLASS_MAX). Returns 0, or -1 when
 * out of memory (then <b> is unchanged). */
int pl_buf_append(pl_buf *b, const void *data, size_t n);

/* Makes room for <n> bytes in all, so appends up to that do not grow <b>
 * step by step. Returns 0, or -1 when out of memory (<b> unchanged). */
int pl_buf_reserve(pl_buf *b, size_t n);

/* Frees the bytes; <b> is empty again. */
void pl_buf_free(pl_buf *b);

#endif
