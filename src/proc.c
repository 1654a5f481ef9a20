/* proc.c -- this process's CPU, memory, descriptors and start time. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pilotlight/proc.h"

/* Reads <path> into <buf>; returns the length, or -errno. No stdio: a FILE
 * and its buffer would be a malloc per scrape (see count_fds). */
static ssize_t read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    size_t len = 0;

    if (fd < 0)
        return -errno;
    while (len < cap - 1 && ((n = read(fd, buf + len, cap - 1 - len)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            len += (size_t)n;
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The boot time (btime in /proc/stat), seconds since the epoch; read once,
 * as it does not change. */
static int boot_time(double *out)
{
    static double btime = -1;
    char buf[8192];
    const char *p;

    if (btime < 0) {
        if (read_file("/proc/stat", buf, sizeof(buf)) < 0 ||
            (p = strstr(buf, "\nbtime ")) == NULL)
            return -EIO;
        btime = strtod(p + 7, NULL);
    }
    *out = btime;
    return 0;
}

/* Fields 14 (utime), 15 (stime), 22 (starttime), 23 (vsize) and 24 (rss) of
 * /proc/self/stat; the command name before them may hold spaces and
 * parentheses, so counting starts after its last ')'. */
static int read_stat(pl_proc_stats *out)
{
    char buf[1024], *p, *end;
    double ticks = (double)sysconf(_SC_CLK_TCK), boot;
    unsigned long long v[25] = {0};

    if (read_file("/proc/self/stat", buf, sizeof(buf)) < 0 ||
        (p = strrchr(buf, ')')) == NULL || boot_time(&boot) != 0 || ticks <= 0)
        return -EIO;
    p += 2; /* ") " then field 3, the state letter */
    p = strchr(p, ' ');
    for (int i = 4; i <= 24 && p != NULL; i++) {
        v[i] = strtoull(p, &end, 10);
        if (end == p)
            return -EIO;
        p = end;
    }
    out->cpu_seconds = (double)(v[14] + v[15]) / ticks;
    out->start_time_seconds = boot + (double)v[22] / ticks;
    out->virtual_bytes = v[23];
    out->resident_bytes = v[24] * (unsigned long long)sysconf(_SC_PAGESIZE);
    return 0;
}

/* Counts the entries of /proc/self/fd with getdents64 into a static buffer:
 * opendir() would malloc a 32 KiB buffer per scrape, and whether its pages
 * are resident afterwards would depend on whether a trim came after it. */
static int count_fds(uint64_t *out)
{
    static char buf[4096] __attribute__((aligned(8)));
    int fd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    uint64_t n = 0;
    long got;

    if (fd < 0)
        return -errno;
    while ((got = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0) {
        for (long off = 0; off < got;) {
            struct dirent64 *e = (struct dirent64 *)(void *)(buf + off);
            if (e->d_name[0] != '.' && atoi(e->d_name) != fd)
                n++; /* not the descriptor this listing is read through */
            off += e->d_reclen;
        }
    }
    if (got < 0)
        got = -errno;
    close(fd);
    if (got < 0)
        return (int)got;
    *out = n;
    return 0;
}

int pl_proc_read(pl_proc_stats *out)
{
    struct rlimit rl;

    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = read_stat(out)) != 0 || (rc = count_fds(&out->open_fds)) != 0)
        return rc;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        out->max_fds = rl.rlim_cur;
    return 0;
}
