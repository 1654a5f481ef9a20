/* test_proc.c -- this process's own figures, as /metrics reports them. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "pilotlight/proc.h"
#include "unit.h"

static void test_descriptors_counted_as_opened(void)
{
    pl_proc_stats before, after;
    struct rlimit rl;
    int fds[5];

    CHECK_EQ(pl_proc_read(&before), 0);
    for (int i = 0; i < 5; i++)
        fds[i] = open("/dev/null", O_RDONLY);
    CHECK_EQ(pl_proc_read(&after), 0);
    CHECK_EQ(after.open_fds, before.open_fds + 5);
    for (int i = 0; i < 5; i++)
        close(fds[i]);
    CHECK_EQ(pl_proc_read(&after), 0);
    CHECK_EQ(after.open_fds, before.open_fds);
    CHECK(before.open_fds >= 3); /* stdin, stdout, stderr */
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    CHECK_EQ(before.max_fds, rl.rlim_cur == RLIM_INFINITY ? 0 : rl.rlim_cur);
}

static void test_memory_follows_use(void)
{
    pl_proc_stats before, after;
    size_t n = 64u << 20;
    char *p;

    CHECK_EQ(pl_proc_read(&before), 0);
    p = malloc(n);
    CHECK(p != NULL);
    if (p == NULL)
        return;
    for (size_t i = 0; i < n; i += 4096)
        p[i] = 1; /* touched, so resident */
    CHECK_EQ(pl_proc_read(&after), 0);
    CHECK(after.resident_bytes >= before.resident_bytes + n / 2);
    CHECK(after.virtual_bytes >= after.resident_bytes);
    free(p);
}

static void test_cpu_and_start_time(void)
{
    pl_proc_stats a, b;
    struct timespec t0, t;
    volatile unsigned long spin = 0;

    CHECK_EQ(pl_proc_read(&a), 0);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    do { /* burn 50 ms of CPU: five ticks at 100 Hz */
        spin++;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9 < 0.05);
    CHECK_EQ(pl_proc_read(&b), 0);
    CHECK(b.cpu_seconds >= a.cpu_seconds + 0.02);
    CHECK(b.cpu_seconds <= (double)t.tv_sec + (double)t.tv_nsec / 1e9 + 0.05);
    /* Started within the last hour, and not in the future. */
    CHECK(a.start_time_seconds <= (double)time(NULL) + 1);
    CHECK(a.start_time_seconds > (double)time(NULL) - 3600);
    CHECK(b.start_time_seconds == a.start_time_seconds);
}

int main(void)
{
    RUN(test_descriptors_counted_as_opened);
    RUN(test_memory_follows_use);
    RUN(test_cpu_and_start_time);
    return unit_finish();
}
