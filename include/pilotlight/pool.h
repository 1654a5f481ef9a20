/* pool.h -- typed object pools carved from large chunks, and byte buffers in
 * power-of-two size classes built on them.
 *
 * Every object the hot path allocates (a connection, a request, a waiter, a
 * buffer) comes from a pool, so after warm-up steady traffic makes no call to
 * the system allocator and RSS is a function of what is in use. A chunk whose
 * objects are all free goes back to the system only in pl_pool_trim(), which
 * the transport calls when its count of open connections reaches a new low.
 *
 * Failure policy is mem.h's: a get returns NULL (also when pl_mem_fail_after()
 * injects a failure) and the caller degrades one request.
 *
 * Released objects are poisoned for AddressSanitizer and marked inaccessible
 * for valgrind, so a use after release is reported as it would be after
 * free(). */
#ifndef PILOTLIGHT_POOL_H
#define PILOTLIGHT_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Chunks are this large and aligned to it, so an object finds its chunk by
 * masking its address. */
#define PL_POOL_CHUNK_SIZE 65536

typedef struct pl_pool_chunk pl_pool_chunk;

/* Empty chunks a pool keeps mapped, their pages given back, at most (8 MiB
 * of address space). */
#define PL_POOL_BARE_MAX 128

/* A pool of objects of one size. Define one statically with PL_POOL_INIT;
 * it joins the registry (metrics, trim) on its first get. */
typedef struct pl_pool {
    const char *name;        /* the metrics label */
    size_t size;             /* object size as asked */
    pl_pool_chunk *avail;    /* chunks with a free object, freshest first */
    pl_pool_chunk *full;     /* chunks with none */
    struct pl_pool *next;    /* in the registry */
    uint64_t in_use;         /* objects handed out */
    uint64_t chunks;         /* chunks with objects carved, held now */
    void *bare[PL_POOL_BARE_MAX]; /* empty chunks kept mapped, pages returned */
    uint32_t nbare;
    uint32_t per_chunk;      /* objects a chunk holds; set with registered */
    uint64_t chunks_allocated, chunks_returned; /* ever */
    int registered;
} pl_pool;

#define PL_POOL_INIT(name_, size_) {.name = (name_), .size = (size_)}

/* Returns an object of <p>'s size (contents undefined), or NULL when out of
 * memory. */
void *pl_pool_get(pl_pool *p);

/* Gives <obj>, from pl_pool_get(<p>), back to <p>. NULL is fine. */
void pl_pool_put(pl_pool *p, void *obj);

/* Bytes of <size> from the smallest size class that holds them (64 B to
 * PL_POOL_CLASS_MAX); larger requests go to pl_malloc(). Sets *cap, if given,
 * to the usable size. Returns NULL when out of memory. */
void *pl_pool_alloc(size_t size, size_t *cap);

/* Frees <ptr> from pl_pool_alloc(); <size> is what was asked, or the *cap it
 * returned (both lead to the same class). NULL is fine. */
void pl_pool_free(void *ptr, size_t size);

#define PL_POOL_CLASS_MAX 16384

/* Gives back to the system the pages of every chunk whose objects are all
 * free, so RSS afterwards depends only on what is in use. Up to
 * PL_POOL_BARE_MAX such chunks per pool keep their address range (not
 * resident) for the pool's next chunks: traffic that comes back takes no
 * chunk from the system. Beyond, they are unmapped. Returns the number of
 * chunks unmapped. */
size_t pl_pool_trim(void);

/* Calls <fn> for every pool that has ever handed out an object. */
void pl_pool_each(void (*fn)(const pl_pool *p, void *arg), void *arg);

/* Bytes <p> holds mapped now (bare chunks included; their pages are not
 * resident). */
size_t pl_pool_reserved_bytes(const pl_pool *p);

/* Objects handed out from every pool and not yet given back (a leak check
 * at exit). */
uint64_t pl_pool_in_use_total(void);

#endif
