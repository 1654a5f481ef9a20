/* test_pool.c -- the object pools and size classes (pool.h), and byte
 * buffers on them (mem.h). Run with the argument "use-after-release" it
 * checks that AddressSanitizer catches a released pooled object being read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pilotlight/buf.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"
#include "unit.h"

typedef struct {
    char bytes[200];
} thing;

static pl_pool things = PL_POOL_INIT("thing", sizeof(thing));

static void test_get_put_reuses_freshest(void)
{
    thing *a = pl_pool_get(&things), *b = pl_pool_get(&things), *c;

    CHECK(a != NULL && b != NULL && a != b);
    CHECK_EQ(things.in_use, 2);
    CHECK_EQ(things.chunks, 1);
    memset(a, 'a', sizeof(*a));
    memset(b, 'b', sizeof(*b));
    CHECK(b->bytes[199] == 'b'); /* objects do not overlap */
    pl_pool_put(&things, a);
    CHECK_EQ(things.in_use, 1);
    c = pl_pool_get(&things);
    CHECK(c == a); /* the one released last, still in cache */
    pl_pool_put(&things, b);
    pl_pool_put(&things, c);
    pl_pool_put(&things, NULL);
    CHECK_EQ(things.in_use, 0);
}

/* Pages of <chunk> resident in memory. */
static int resident_pages(const void *chunk)
{
    unsigned char vec[PL_POOL_CHUNK_SIZE / 4096];
    int n = 0;

    if (mincore((void *)chunk, PL_POOL_CHUNK_SIZE, vec) != 0)
        return -1;
    for (size_t i = 0; i < sizeof(vec); i++)
        n += vec[i] & 1;
    return n;
}

static void *chunk_of(const void *obj)
{
    return (void *)((uintptr_t)obj & ~(uintptr_t)(PL_POOL_CHUNK_SIZE - 1));
}

/* Pages resident in the chunks of <objs>, each chunk counted once. */
static int resident_total(thing **objs, int n)
{
    void *seen[64];
    int nseen = 0, total = 0, j;

    for (int i = 0; i < n; i++) {
        void *c = chunk_of(objs[i]);
        for (j = 0; j < nseen && seen[j] != c; j++)
            ;
        if (j == nseen && nseen < 64) {
            seen[nseen++] = c;
            total += resident_pages(c);
        }
    }
    return total;
}

static void test_chunks_and_trim(void)
{
    enum { N = 2000 };
    static thing *objs[N];
    uint64_t allocated = things.chunks_allocated, held;
    void *first;

    for (int i = 0; i < N; i++) {
        objs[i] = pl_pool_get(&things);
        CHECK(objs[i] != NULL);
        memset(objs[i], 'x', sizeof(thing));
        /* every object lies inside the aligned chunk its address masks to */
        CHECK(((uintptr_t)objs[i] & (PL_POOL_CHUNK_SIZE - 1)) + sizeof(thing) <=
              PL_POOL_CHUNK_SIZE);
    }
    held = things.chunks;
    CHECK(held >= 2);
    CHECK(things.chunks_allocated - allocated <= held);
    CHECK_EQ(pl_pool_reserved_bytes(&things), held * PL_POOL_CHUNK_SIZE);
    first = chunk_of(objs[0]);
    CHECK(resident_pages(first) == PL_POOL_CHUNK_SIZE / 4096);

    /* Half released, interleaved: no chunk is wholly free, nothing moves. */
    for (int i = 0; i < N; i += 2)
        pl_pool_put(&things, objs[i]);
    CHECK_EQ(pl_pool_trim(), 0);
    CHECK_EQ(things.chunks, held);
    CHECK(resident_pages(first) == PL_POOL_CHUNK_SIZE / 4096);
    /* All released: every page goes back but the first object's of one
     * spare chunk (a lone connection after a trim finds it resident), the
     * address ranges stay, and traffic coming back takes no chunk from the
     * system. */
    for (int i = 1; i < N; i += 2)
        pl_pool_put(&things, objs[i]);
    CHECK_EQ(pl_pool_trim(), 0);
    CHECK_EQ(things.chunks, 1);
    CHECK_EQ(pl_pool_reserved_bytes(&things), held * PL_POOL_CHUNK_SIZE);
    CHECK_EQ(resident_total(objs, N), 1);
    objs[0] = pl_pool_get(&things);
    CHECK_EQ((uintptr_t)objs[0] & (PL_POOL_CHUNK_SIZE - 1), 64); /* its first object */
    CHECK_EQ(resident_total(objs, N), 1); /* and no fresh page */
    pl_pool_put(&things, objs[0]);
    allocated = things.chunks_allocated;
    for (int i = 0; i < N; i++)
        objs[i] = pl_pool_get(&things);
    CHECK_EQ(things.chunks_allocated, allocated);
    CHECK_EQ(things.chunks, held);
    CHECK(objs[N - 1] != NULL);
    for (int i = 0; i < N; i++)
        pl_pool_put(&things, objs[i]);
}

/* More empty chunks than a pool keeps bare: the rest are unmapped. */
static void test_bare_chunks_bounded(void)
{
    enum { N = PL_POOL_BARE_MAX + 3 };
    static pl_pool big = PL_POOL_INIT("big", 40000); /* one per chunk */
    static void *objs[N];

    for (int i = 0; i < N; i++)
        objs[i] = pl_pool_get(&big);
    CHECK_EQ(big.chunks, N);
    for (int i = 0; i < N; i++)
        pl_pool_put(&big, objs[i]);
    CHECK_EQ(pl_pool_trim(), 2); /* one stays as the spare */
    CHECK_EQ(big.chunks_returned, 2);
    CHECK_EQ(pl_pool_reserved_bytes(&big), (size_t)(PL_POOL_BARE_MAX + 1) * PL_POOL_CHUNK_SIZE);
    objs[0] = pl_pool_get(&big);
    CHECK_EQ(big.chunks_allocated, N); /* the spare */
    pl_pool_put(&big, objs[0]);
}

/* Warm traffic that stays within what was reserved allocates no chunk. */
static void test_steady_churn_is_flat(void)
{
    thing *live[300] = {0};
    uint64_t allocated;

    for (int i = 0; i < 300; i++)
        live[i] = pl_pool_get(&things);
    for (int i = 0; i < 300; i++) {
        pl_pool_put(&things, live[i]);
        live[i] = NULL;
    }
    allocated = things.chunks_allocated;
    for (int round = 0; round < 10000; round++) {
        int i = (round * 7919) % 300;
        if (live[i] == NULL) {
            live[i] = pl_pool_get(&things);
        } else {
            pl_pool_put(&things, live[i]);
            live[i] = NULL;
        }
    }
    CHECK_EQ(things.chunks_allocated, allocated);
    for (int i = 0; i < 300; i++)
        pl_pool_put(&things, live[i]);
}

static void test_injected_failure(void)
{
    thing *t;

    pl_mem_fail_after(1, 0);
    CHECK(pl_pool_get(&things) == NULL);
    pl_mem_fail_after(1, 0);
    CHECK(pl_pool_alloc(100, NULL) == NULL);
    CHECK_EQ(things.in_use, 0);
    t = pl_pool_get(&things); /* one failure only */
    CHECK(t != NULL);
    pl_pool_put(&things, t);
    pl_mem_fail_after(0, 0);
}

static void test_size_classes(void)
{
    size_t cap;
    char *p = pl_pool_alloc(1, &cap), *q, *big;

    CHECK(p != NULL);
    CHECK_EQ(cap, 64);
    pl_pool_free(p, 1);
    q = pl_pool_alloc(1000, &cap);
    CHECK_EQ(cap, 1024);
    memset(q, 1, cap);
    pl_pool_free(q, cap); /* the cap leads to the same class */
    q = pl_pool_alloc(1025, &cap);
    CHECK_EQ(cap, 2048);
    pl_pool_free(q, 1025);
    big = pl_pool_alloc(PL_POOL_CLASS_MAX + 1, &cap);
    CHECK(big != NULL);
    CHECK_EQ(cap, PL_POOL_CLASS_MAX + 1);
    memset(big, 2, cap);
    pl_pool_free(big, cap);
    pl_pool_free(NULL, 10);
    for (size_t n = 0, want = 64; n <= PL_POOL_CLASS_MAX + 1; n++) {
        if (n > want)
            want *= 2; /* the least power of two from 64 that holds n */
        p = pl_pool_alloc(n, &cap);
        pl_pool_free(p, n);
        if (cap != (n > PL_POOL_CLASS_MAX ? n : want)) {
            CHECK_EQ(cap, n > PL_POOL_CLASS_MAX ? n : want); /* the first wrong one */
            break;
        }
    }
}

static void test_buf_through_classes(void)
{
    pl_buf b = {0};
    char chunk[1000];

    memset(chunk, 'x', sizeof(chunk));
    CHECK_EQ(pl_buf_append(&b, "hello", 5), 0);
    CHECK_EQ(b.cap, 256);
    for (int i = 0; i < 40; i++) /* past the largest class */
        CHECK_EQ(pl_buf_append(&b, chunk, sizeof(chunk)), 0);
    CHECK_EQ(b.len, 40005);
    CHECK(b.cap >= b.len);
    CHECK(memcmp(b.data, "hello", 5) == 0 && b.data[40004] == 'x');
    pl_mem_fail_after(1, 0);
    CHECK_EQ(pl_buf_append(&b, chunk, 30000), -ENOMEM);
    CHECK_EQ(b.len, 40005); /* unchanged */
    pl_mem_fail_after(0, 0);
    pl_buf_free(&b);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
}

static void test_everything_returned(void)
{
    CHECK_EQ(pl_pool_in_use_total(), 0);
}

#if defined(__SANITIZE_ADDRESS__)
#define ASAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ASAN_BUILD 1
#endif
#endif

/* The child reads a pooled object after releasing it; ASan must stop it
 * with a use-after-poison report. Exits 77 (meson: skipped) in a build
 * without ASan, where nothing can catch it. */
static int use_after_release(void)
{
#ifdef ASAN_BUILD
    int fds[2], status;
    char report[8192];
    size_t got = 0;
    ssize_t n;
    pid_t pid;

    if (pipe(fds) != 0)
        return 1;
    pid = fork();
    if (pid == 0) {
        volatile thing *t = pl_pool_get(&things);
        dup2(fds[1], 2);
        t->bytes[0] = 'a';
        pl_pool_put(&things, (thing *)t);
        return t->bytes[0] == 'a' ? 0 : 0; /* must not get here */
    }
    close(fds[1]);
    while (got < sizeof(report) - 1 &&
           (n = read(fds[0], report + got, sizeof(report) - 1 - got)) > 0)
        got += (size_t)n;
    report[got] = '\0';
    waitpid(pid, &status, 0);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(strstr(report, "use-after-poison") != NULL);
    printf("%s use_after_release_is_caught\n", unit_failures ? "FAIL" : "ok  ");
    return unit_failures != 0;
#else
    printf("skip use_after_release_is_caught (not an AddressSanitizer build)\n");
    return 77;
#endif
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "use-after-release") == 0)
        return use_after_release();
    RUN(test_get_put_reuses_freshest);
    RUN(test_chunks_and_trim);
    RUN(test_bare_chunks_bounded);
    RUN(test_steady_churn_is_flat);
    RUN(test_injected_failure);
    RUN(test_size_classes);
    RUN(test_buf_through_classes);
    RUN(test_everything_returned);
    return unit_finish();
}
