/* histogram.h -- a fixed-bucket histogram of durations, in seconds, the
 * shape Prometheus exposes (metrics.c renders it). */
#ifndef PILOTLIGHT_HISTOGRAM_H
#define PILOTLIGHT_HISTOGRAM_H

#include <stddef.h>
#include <stdint.h>

#define PL_HISTOGRAM_MAX_BUCKETS 16

typedef struct {
    const double *bounds; /* upper bounds in seconds, ascending */
    size_t nbounds;       /* at most PL_HISTOGRAM_MAX_BUCKETS - 1 */
    uint64_t counts[PL_HISTOGRAM_MAX_BUCKETS]; /* per bucket, not cumulative */
    uint64_t count;
    double sum;
} pl_histogram;

/* Counts one observation of <seconds> in <h>. */
static inline void pl_histogram_observe(pl_histogram *h, double seconds)
{
    size_t i = 0;

    while (i < h->nbounds && seconds > h->bounds[i])
        i++;
    h->counts[i]++; /* i == nbounds: only in +Inf */
    h->count++;
    h->sum += seconds;
}

#endif
