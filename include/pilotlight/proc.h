/* proc.h -- this process's resource use, read from /proc at scrape time,
 * with the meanings of Prometheus's standard process collector. */
#ifndef PILOTLIGHT_PROC_H
#define PILOTLIGHT_PROC_H

#include <stdint.h>

typedef struct {
    double cpu_seconds;        /* user + system CPU time */
    double start_time_seconds; /* since the Unix epoch */
    uint64_t resident_bytes;
    uint64_t virtual_bytes;
    uint64_t open_fds;
    uint64_t max_fds; /* the soft RLIMIT_NOFILE; 0 when unlimited */
} pl_proc_stats;

/* Fills <out> for the calling process. Returns 0, or a negative errno when
 * /proc could not be read (-EIO: not as expected; then <out> is
 * unspecified). */
int pl_proc_read(pl_proc_stats *out);

#endif
