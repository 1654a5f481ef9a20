/* test_uvmem.c -- libuv's descriptor table: its zero pages given back. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "pilotlight/uvmem.h"
#include "unit.h"

/* A descriptor this high makes libuv's table 4,096 slots (32 KiB), past
 * the size uvmem tracks. */
#define HIGH_FD 2047

static void on_poll(uv_poll_t *p, int status, int events)
{
    (void)p, (void)status, (void)events;
}

/* The whole pages inside [start, start + len): how many there are, how
 * many are resident, and how many hold a byte that is not zero. */
static void scan_pages(const void *start, size_t len, size_t *pages, size_t *resident,
                       size_t *nonzero)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)start + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)start + len) & ~(uintptr_t)(page - 1);
    unsigned char vec[64];

    *pages = hi > lo ? (hi - lo) / page : 0;
    *resident = *nonzero = 0;
    CHECK(*pages > 0 && *pages <= sizeof(vec));
    if (*pages == 0 || *pages > sizeof(vec) || mincore((void *)lo, hi - lo, vec) != 0)
        return;
    for (size_t i = 0; i < *pages; i++) /* before the reads below fault any in */
        *resident += vec[i] & 1;
    for (size_t i = 0; i < *pages; i++)
        for (size_t j = 0; j < page; j++)
            if (((const char *)lo)[i * page + j] != 0) {
                (*nonzero)++;
                break;
            }
}

static void watch_high_fd(uv_loop_t *loop, uv_poll_t *poll)
{
    CHECK_EQ(uv_poll_init(loop, poll, HIGH_FD), 0);
    CHECK_EQ(uv_poll_start(poll, UV_READABLE, on_poll), 0);
}

static void unwatch(uv_loop_t *loop, uv_poll_t *poll)
{
    uv_poll_stop(poll);
    uv_close((uv_handle_t *)poll, NULL);
    CHECK_EQ(uv_run(loop, UV_RUN_DEFAULT), 0);
}

/* Trims, then checks that only pages of zeros went, and that libuv reads
 * back exactly what it wrote. */
static void trim_and_check(uv_loop_t *loop, size_t len)
{
    size_t pages, resident, nonzero;
    char *copy = malloc(len);

    CHECK(copy != NULL);
    memcpy(copy, loop->watchers, len);
    pl_uvmem_trim();
    scan_pages(loop->watchers, len, &pages, &resident, &nonzero);
    CHECK_EQ(resident, nonzero);
    CHECK(memcmp(copy, loop->watchers, len) == 0);
    free(copy);
}

static void test_zero_pages_given_back(void)
{
    struct rlimit rl;
    uv_loop_t loop;
    uv_poll_t poll;
    size_t pages, resident, nonzero, len;
    int fds[2];

    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur <= HIGH_FD) {
        rl.rlim_cur = HIGH_FD + 1;
        CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    }
    CHECK_EQ(pipe(fds), 0);
    CHECK_EQ(dup2(fds[0], HIGH_FD), HIGH_FD);
    CHECK_EQ(uv_loop_init(&loop), 0);

    watch_high_fd(&loop, &poll); /* the table grows, every slot written */
    len = (loop.nwatchers + 2) * sizeof(loop.watchers[0]);
    CHECK(len >= 32768);
    scan_pages(loop.watchers, len, &pages, &resident, &nonzero);
    CHECK(pages >= 7);
    CHECK_EQ(resident, pages);
    CHECK_EQ(nonzero, 1); /* the watched slot, mid-table; libuv's own are low */

    trim_and_check(&loop, len); /* zeros on both sides of the watched slot */
    unwatch(&loop, &poll);
    trim_and_check(&loop, len); /* zeros to the end */
    scan_pages(loop.watchers, len, &pages, &resident, &nonzero);
    CHECK(nonzero <= 1);
    watch_high_fd(&loop, &poll); /* libuv goes on using its table */
    unwatch(&loop, &poll);

    /* Freed with the loop, the table is forgotten: a trim after it must
     * not touch the freed block (AddressSanitizer would say so). */
    CHECK_EQ(uv_loop_close(&loop), 0);
    pl_uvmem_trim();
    close(HIGH_FD);
    close(fds[0]);
    close(fds[1]);
}

int main(void)
{
    /* Before libuv allocates anything, as main.c does. */
    if (pl_uvmem_install() != 0) {
        fprintf(stderr, "pl_uvmem_install failed\n");
        return 1;
    }
    RUN(test_zero_pages_given_back);
    return unit_finish();
}
