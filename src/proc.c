/* proc.c -- this process's CPU, memory, descriptors and start time. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pilotlight/proc.h"

/* Reads <path> into <buf>; returns the length, or -1. */
static ssize_t read_file(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "re");
    size_t n;

    if (f == NULL)
        return -1;
    n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (ssize_t)n;
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
            return -1;
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
        return -1;
    p += 2; /* ") " then field 3, the state letter */
    p = strchr(p, ' ');
    for (int i = 4; i <= 24 && p != NULL; i++) {
        v[i] = strtoull(p, &end, 10);
        if (end == p)
            return -1;
        p = end;
    }
    out->cpu_seconds = (double)(v[14] + v[15]) / ticks;
    out->start_time_seconds = boot + (double)v[22] / ticks;
    out->virtual_bytes = v[23];
    out->resident_bytes = v[24] * (unsigned long long)sysconf(_SC_PAGESIZE);
    return 0;
}

static int count_fds(uint64_t *out)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    uint64_t n = 0;

    if (d == NULL)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
            n++; /* not the descriptor this listing is read through */
    closedir(d);
    *out = n;
    return 0;
}

int pl_proc_read(pl_proc_stats *out)
{
    struct rlimit rl;

    memset(out, 0, sizeof(*out));
    if (read_stat(out) != 0 || count_fds(&out->open_fds) != 0)
        return -1;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        out->max_fds = rl.rlim_cur;
    return 0;
}
