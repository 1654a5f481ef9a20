/* uvmem.c -- give back the all-zero pages of libuv's descriptor table. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>
#include <uv.h>

#include "pilotlight/uvmem.h"

/* Smaller blocks are not worth a scan: the table is 8 KiB at 1,024
 * descriptors, the size where it starts to matter. */
#define TRACK_MIN (16 * 1024)

/* libuv's threadpool allocates and frees too: the block is read only
 * under the lock, and freed only after it was forgotten under it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *block;
static size_t block_size;

static void forget(void *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&lock);
    if (p == block)
        block = NULL;
    pthread_mutex_unlock(&lock);
}

static void *uv_realloc_fn(void *p, size_t n)
{
    void *q;

    forget(p);
    q = realloc(p, n);
    if (q != NULL && n >= TRACK_MIN) {
        pthread_mutex_lock(&lock);
        if (n >= block_size || block == NULL) {
            block = q;
            block_size = n;
        }
        pthread_mutex_unlock(&lock);
    }
    return q;
}

static void uv_free_fn(void *p)
{
    forget(p);
    free(p);
}

int pl_uvmem_install(void)
{
    return uv_replace_allocator(malloc, uv_realloc_fn, calloc, uv_free_fn) == 0 ? 0 : -1;
}

static int all_zero(const char *p, size_t n)
{
    static const char zeros[256];

    for (size_t i = 0; i < n; i += sizeof(zeros))
        if (memcmp(p + i, zeros, sizeof(zeros)) != 0)
            return 0;
    return 1;
}

void pl_uvmem_trim(void)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *p, *end, *run = NULL;

    pthread_mutex_lock(&lock);
    if (block != NULL) {
        /* Whole pages inside the block only: what lies around it (the
         * allocator's own headers) is never touched. */
        p = (char *)(((uintptr_t)block + page - 1) & ~(uintptr_t)(page - 1));
        end = (char *)(((uintptr_t)block + block_size) & ~(uintptr_t)(page - 1));
        for (; p < end; p += page) {
            if (all_zero(p, page)) {
                if (run == NULL)
                    run = p;
                continue;
            }
            if (run != NULL)
                madvise(run, (size_t)(p - run), MADV_DONTNEED);
            run = NULL;
        }
        if (run != NULL)
            madvise(run, (size_t)(end - run), MADV_DONTNEED);
    }
    pthread_mutex_unlock(&lock);
}
