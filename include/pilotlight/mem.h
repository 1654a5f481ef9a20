/* mem.h -- the one allocator wrapper: every pilotlight allocation goes here.
 *
 * Policy: allocation failure is reported to the caller (NULL), never turned
 * into exit(); each caller degrades one request, not the process. */
#ifndef PILOTLIGHT_MEM_H
#define PILOTLIGHT_MEM_H

#include <stddef.h>

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

/* The <type> whose <member> <ptr> points to: how a callback given an
 * embedded handle (a libuv handle, llhttp's parser) gets back to the
 * object around it. */
#define container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#endif
