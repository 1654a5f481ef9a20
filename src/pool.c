/* pool.c -- typed object pools in 64 KiB chunks, and size classes on them. */
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>
#include <utlist.h>

#include "pilotlight/mem.h"
#include "pilotlight/pool.h"

/* Released objects are made untouchable for the sanitizers: ASan through
 * its poisoning interface, valgrind through its client requests (no-ops
 * when not running under valgrind). */
#if defined(__SANITIZE_ADDRESS__)
#define PL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PL_ASAN 1
#endif
#endif
#ifdef PL_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#if __has_include(<valgrind/memcheck.h>)
#include <valgrind/memcheck.h>
#else
#define VALGRIND_MAKE_MEM_NOACCESS(p, n) ((void)(p), (void)(n))
#define VALGRIND_MAKE_MEM_UNDEFINED(p, n) ((void)(p), (void)(n))
#define VALGRIND_MAKE_MEM_DEFINED(p, n) ((void)(p), (void)(n))
#endif

#define HEADER_SIZE 64 /* objects start a cache line into the chunk */

struct pl_pool_chunk {
    pl_pool_chunk *prev, *next; /* in its pool's avail or full list */
    void *free;                 /* released objects, a singly linked list */
    uint32_t used;              /* objects handed out */
    uint32_t carved;            /* objects ever handed out; the rest of the
                                 * chunk was never touched, so is not RSS */
};

static pl_pool *registry;

static pl_pool classes[] = {
    PL_POOL_INIT("bytes64", 64),     PL_POOL_INIT("bytes128", 128),
    PL_POOL_INIT("bytes256", 256),   PL_POOL_INIT("bytes512", 512),
    PL_POOL_INIT("bytes1024", 1024), PL_POOL_INIT("bytes2048", 2048),
    PL_POOL_INIT("bytes4096", 4096), PL_POOL_INIT("bytes8192", 8192),
    PL_POOL_INIT("bytes16384", 16384),
};

static size_t stride(const pl_pool *p)
{
    return (p->size + 7) & ~(size_t)7; /* pointer alignment is all they need */
}

static char *object_at(pl_pool_chunk *c, const pl_pool *p, uint32_t i)
{
    return (char *)c + HEADER_SIZE + (size_t)i * stride(p);
}

/* Maps a chunk aligned to its own size: map twice as much, unmap the ends. */
static pl_pool_chunk *chunk_map(void)
{
    size_t n = PL_POOL_CHUNK_SIZE;
    char *raw = mmap(NULL, 2 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uintptr_t start;

    if (raw == MAP_FAILED)
        return NULL;
    start = ((uintptr_t)raw + n - 1) & ~(uintptr_t)(n - 1);
    if (start > (uintptr_t)raw)
        munmap(raw, start - (uintptr_t)raw);
    munmap((char *)start + n, (uintptr_t)raw + n - start);
    return (pl_pool_chunk *)start;
}

/* A chunk for <p>: a bare one it kept mapped (its pages come back as it is
 * used; no call to the system), else a new mapping. */
static pl_pool_chunk *chunk_new(pl_pool *p)
{
    pl_pool_chunk *c;

    if (p->nbare > 0) {
        c = p->bare[--p->nbare];
    } else {
        c = chunk_map();
        if (c == NULL)
            return NULL;
        p->chunks_allocated++;
    }
    UNPOISON(c, HEADER_SIZE);
    VALGRIND_MAKE_MEM_UNDEFINED(c, HEADER_SIZE);
    memset(c, 0, sizeof(*c));
    POISON((char *)c + HEADER_SIZE, PL_POOL_CHUNK_SIZE - HEADER_SIZE);
    VALGRIND_MAKE_MEM_NOACCESS((char *)c + HEADER_SIZE, PL_POOL_CHUNK_SIZE - HEADER_SIZE);
    DL_PREPEND(p->avail, c);
    p->chunks++;
    if (!p->registered) {
        p->registered = 1;
        p->per_chunk = (uint32_t)((PL_POOL_CHUNK_SIZE - HEADER_SIZE) / stride(p));
        p->next = registry;
        registry = p;
    }
    return c;
}

void *pl_pool_get(pl_pool *p)
{
    pl_pool_chunk *c;
    char *obj;

    if (pl_mem_should_fail())
        return NULL;
    if (p->avail == NULL && chunk_new(p) == NULL)
        return NULL;
    c = p->avail;
    if (c->free != NULL) {
        obj = c->free;
        UNPOISON(obj, sizeof(void *));
        VALGRIND_MAKE_MEM_DEFINED(obj, sizeof(void *));
        memcpy(&c->free, obj, sizeof(void *));
    } else {
        obj = object_at(c, p, c->carved++);
    }
    UNPOISON(obj, p->size);
    VALGRIND_MAKE_MEM_UNDEFINED(obj, p->size);
    if (++c->used == p->per_chunk) {
        DL_DELETE(p->avail, c);
        DL_PREPEND(p->full, c);
    }
    p->in_use++;
    return obj;
}

void pl_pool_put(pl_pool *p, void *obj)
{
    pl_pool_chunk *c;

    if (obj == NULL)
        return;
    c = (pl_pool_chunk *)((uintptr_t)obj & ~(uintptr_t)(PL_POOL_CHUNK_SIZE - 1));
    if (c->used-- == p->per_chunk) {
        DL_DELETE(p->full, c);
        DL_PREPEND(p->avail, c);
    }
    memcpy(obj, &c->free, sizeof(void *));
    c->free = obj;
    POISON(obj, p->size);
    VALGRIND_MAKE_MEM_NOACCESS(obj, p->size);
    p->in_use--;
}

/* The classes are the powers of two from 64 bytes: a size's class is the
 * bit length of size - 1, less that of 63. */
static pl_pool *class_of(size_t size)
{
    size_t i = size <= 64 ? 0 : (size_t)(64 - __builtin_clzll((unsigned long long)size - 1)) - 6;

    return i < sizeof(classes) / sizeof(classes[0]) ? &classes[i] : NULL;
}

void *pl_pool_alloc(size_t size, size_t *cap)
{
    pl_pool *p = class_of(size);

    if (cap)
        *cap = p ? p->size : size;
    return p ? pl_pool_get(p) : pl_malloc(size);
}

void pl_pool_free(void *ptr, size_t size)
{
    pl_pool *p = class_of(size);

    if (p)
        pl_pool_put(p, ptr);
    else
        pl_free(ptr);
}

static void chunk_unmap(pl_pool *p, void *c)
{
    /* Unpoison first: the sanitizers must not see a later mapping at this
     * address as poisoned. */
    UNPOISON(c, PL_POOL_CHUNK_SIZE);
    VALGRIND_MAKE_MEM_UNDEFINED(c, PL_POOL_CHUNK_SIZE);
    munmap(c, PL_POOL_CHUNK_SIZE);
    p->chunks_returned++;
}

/* Gives an empty chunk's pages back. Its address range is kept (bare, up
 * to PL_POOL_BARE_MAX, at no cost in RSS) for the pool's next chunk, else
 * unmapped. */
static void chunk_release(pl_pool *p, pl_pool_chunk *c)
{
    DL_DELETE(p->avail, c);
    p->chunks--;
    if (p->nbare == PL_POOL_BARE_MAX) {
        chunk_unmap(p, c);
        return;
    }
    madvise(c, PL_POOL_CHUNK_SIZE, MADV_DONTNEED);
    POISON(c, PL_POOL_CHUNK_SIZE);
    VALGRIND_MAKE_MEM_NOACCESS(c, PL_POOL_CHUNK_SIZE);
    p->bare[p->nbare++] = c;
}

/* Empties <c> back to uncarved, keeping resident only the pages of its
 * first object: a connection that comes alone after a trim (a scrape, a
 * health check) takes that object and touches no fresh page, so what is
 * resident at rest does not depend on whether a trim came after it. */
static void chunk_keep_first(pl_pool *p, pl_pool_chunk *c)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t keep = (HEADER_SIZE + stride(p) + page - 1) & ~(page - 1);

    if (keep < PL_POOL_CHUNK_SIZE)
        madvise((char *)c + keep, PL_POOL_CHUNK_SIZE - keep, MADV_DONTNEED);
    c->free = NULL;
    c->carved = 0;
    POISON((char *)c + HEADER_SIZE, PL_POOL_CHUNK_SIZE - HEADER_SIZE);
    VALGRIND_MAKE_MEM_NOACCESS((char *)c + HEADER_SIZE, PL_POOL_CHUNK_SIZE - HEADER_SIZE);
}

static size_t pool_trim(pl_pool *p)
{
    uint64_t returned = p->chunks_returned;
    pl_pool_chunk *c, *next, *spare = p->avail;

    /* A spare only where no chunk with a free object would remain. */
    DL_FOREACH(p->avail, c)
        if (c->used != 0)
            spare = NULL;
    DL_FOREACH_SAFE(p->avail, c, next)
        if (c->used == 0 && c != spare)
            chunk_release(p, c);
    if (spare != NULL)
        chunk_keep_first(p, spare);
    return (size_t)(p->chunks_returned - returned);
}

size_t pl_pool_trim(void)
{
    size_t n = 0;

    for (pl_pool *p = registry; p != NULL; p = p->next)
        n += pool_trim(p);
    return n;
}

void pl_pool_each(void (*fn)(const pl_pool *p, void *arg), void *arg)
{
    for (pl_pool *p = registry; p != NULL; p = p->next)
        fn(p, arg);
}

size_t pl_pool_reserved_bytes(const pl_pool *p)
{
    return (size_t)(p->chunks + p->nbare) * PL_POOL_CHUNK_SIZE;
}

uint64_t pl_pool_in_use_total(void)
{
    uint64_t n = 0;

    for (pl_pool *p = registry; p != NULL; p = p->next)
        n += p->in_use;
    return n;
}
