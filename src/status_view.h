/* status_view.h -- what /status and /debug/status show, gathered once per
 * request: shared by status.c (which gathers it and writes the JSON) and
 * status_page.c (which writes the page). Nothing else includes it. */
#ifndef PILOTLIGHT_STATUS_VIEW_H
#define PILOTLIGHT_STATUS_VIEW_H

#include "pilotlight/broker-t.h"
#include "pilotlight/buf.h"
#include "pilotlight/status.h"

/* The page lists at most this many parked keys, and the keys dispatched to
 * lately that have none parked. */
#define PL_STATUS_PAGE_KEYS 200

/* A miss's diagnosis in words, the health line: two versions of 512 bytes
 * and the words around them fit. */
#define PL_STATUS_WORDS_MAX 2048

/* One key of the page: parked now, dispatched to lately, or both. */
typedef struct {
    uint32_t dep, ver;         /* offsets of the strings in the view's text */
    uint16_t dep_len, ver_len;
    double cpu, memory;
    size_t parked;
    uint64_t oldest_wait_ms;
    pl_diag_window w;
} pl_status_row;

typedef struct {
    const pl_engine *engine;
    const pl_diag *diag;
    const pl_metrics *m;
    const pl_config *cfg;
    const pl_peers *peers; /* NULL: no ring */
    uint64_t now;          /* loop ms */
    uint64_t wall_ms;      /* the time of day at <now>, ms since the epoch */
    int draining;
    size_t keys;           /* keys with a parked poll */
    pl_diag_window all;
    pl_status_row *rows;   /* most parked first, then most dispatched to */
    size_t nrows;
    int truncated;         /* more parked keys than PL_STATUS_PAGE_KEYS */
    pl_buf text;           /* the rows' strings */
    int failed;            /* out of memory while gathering */
    const char *state;     /* of the health line: ok, idle, warn, bad */
    char health[PL_STATUS_WORDS_MAX];
    int have_q;            /* some dispatch was answered: quantiles below */
    uint64_t q_us[3];      /* answer time p50, p90, p99, microseconds */
} pl_status_view;

/* Gathers <v> from <st>. Returns 0, or -ENOMEM; release <v> either way. */
int pl__status_view(pl_status *st, int draining, pl_status_view *v);
void pl__status_view_release(pl_status_view *v);

/* The time of day (ms since the epoch) of loop time <at>. */
uint64_t pl__status_wall(const pl_status_view *v, uint64_t at);

/* "hit", "miss", ... as the metrics label them. */
const char *pl__status_result_name(pl_dispatch_result r);

#endif
