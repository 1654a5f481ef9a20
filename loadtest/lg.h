/* lg.h -- shared declarations of pl-loadgen, the warm-start load generator. */
#ifndef PL_LOADGEN_H
#define PL_LOADGEN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>
#include "llhttp.h"

/* Which URL scheme the server speaks. */
typedef enum {
  LG_PROTO_WARMSTART, /* pilotlight and the reference brokers: /warm-start */
  LG_PROTO_NCHAN      /* nginx + Nchan: GET /sub/<key>, POST /pub/<key> */
} lg_proto_t;

/* Options shared by every scenario (filled by main from argv). */
typedef struct {
  const char *host;
  int port;
  lg_proto_t proto;
  int server_pid;       /* 0: no /proc readings */
  const char *label;    /* system name echoed in the JSON line */
  int metrics;          /* 1: scrape /metrics for the ledger */
  int source_addrs;     /* 127.0.0.1 .. 127.0.0.<n>; 0 = automatic */
  int json_only;
  double duration_s;
  double warmup_s;
  int controllers;
  int dispatchers;
  double rate;          /* dispatches/s; 0 = closed loop */
  int spin;             /* rate pacing by busy polling (1) or a 1 ms timer (0) */
  double hold_ms;       /* cycle: a controller's pause after a payload (its run) */
  int keys;
  long parked;          /* idle */
  long idle_warmup;     /* idle: polls parked and dropped before the baseline */
  long cycles;          /* churn */
  long churn_warmup;
  int concurrency;      /* churn */
  int abort_rst;        /* churn: abort with RST instead of FIN */
  int scale_small;
  int scale_large;
  long scale_misskeys;
  double scale_rate;
  const char *probe_path;
  unsigned seed;
} lg_opts_t;

/* ---- connections (lg_conn.c) ---------------------------------------- */

typedef struct lg_conn lg_conn_t;
/* Called once per complete response; <body> is valid only during the call. */
typedef void (*lg_resp_cb)(lg_conn_t *c, int status, const char *body, size_t len);
/* Called when a connect finished (<err> 0 or a negative errno). */
typedef void (*lg_conn_cb)(lg_conn_t *c, int err);
/* Called from the close callback: the struct may be reused or freed. */
typedef void (*lg_close_cb)(lg_conn_t *c);

enum { LG_IDLE = 0, LG_CONNECTING, LG_OPEN, LG_CLOSING };

struct lg_conn {
  uv_tcp_t tcp;
  llhttp_t parser;
  int state;
  int busy;             /* a request is outstanding */
  int keep_alive;
  int opened;           /* connected, counted in lg_conn_open */
  int status;
  char *body;           /* response body being collected (owned) */
  size_t body_len, body_cap;
  char *fixed;          /* a request prepared once (owned, may be NULL) */
  size_t fixed_len;
  char etag[48];        /* nchan long-poll position */
  char lastmod[48];
  int hdr_want;         /* 1 etag, 2 last-modified */
  lg_resp_cb on_resp;
  lg_conn_cb on_connect;
  lg_conn_cb on_write;  /* a write finished (err 0 or negative errno) */
  lg_close_cb on_close;
  void *ud;
  long idx;
  int key;
  uint64_t t0;          /* when the outstanding request was due */
  uint64_t seq;
  struct lg_conn *next; /* free/retry lists */
};

/* Sets the loop, the server address and the source-address count. */
void lg_conn_setup(uv_loop_t *loop, const char *host, int port, int source_addrs);
/* Starts connecting <c> (state must be IDLE). Returns 0 or a negative errno. */
int lg_conn_connect(lg_conn_t *c, long which);
/* Writes <len> bytes from <buf> (the caller may reuse <buf> at once).
 * Returns 0 or a negative errno (the connection is then closing). */
int lg_conn_send(lg_conn_t *c, const char *buf, size_t len);
/* Writes the request prepared in c->fixed without copying it. */
int lg_conn_send_fixed(lg_conn_t *c);
/* Closes <c>; on_close runs later. Safe to call twice. */
void lg_conn_close(lg_conn_t *c);
/* Closes <c> with a reset (SO_LINGER 0): no TIME_WAIT on our side. */
void lg_conn_reset(lg_conn_t *c);
/* Frees the buffers of a closed connection. */
void lg_conn_release(lg_conn_t *c);
/* Total connect failures and read errors seen. */
extern long lg_conn_errors;
/* Connections connected and not yet closed. */
extern long lg_conn_open;

/* ---- request bodies and keys (lg_body.c) --------------------------- */

/* Fills <dep>, <ver>, <cpu>, <mem> for key number <k> (never-parked keys
 * use <prefix> 'n', normal keys 'd'). */
void lg_key_fields(long k, char prefix, char *dep, size_t dn, const char **ver,
                   const char **cpu, const char **mem);
/* Writes a whole controller poll for key <k> into a new malloc'd buffer. */
char *lg_req_poll(const lg_opts_t *o, long ctl_id, long k, size_t *len);
/* Writes a dispatch request for key <k> carrying run id <seq> into <buf>. */
size_t lg_req_dispatch(const lg_opts_t *o, char *buf, size_t cap, long k, char prefix,
                       uint64_t seq);
/* Writes a plain GET for <path> into <buf>. */
size_t lg_req_get(const lg_opts_t *o, char *buf, size_t cap, const char *path);
/* Writes an nchan long-poll for key <k> (<c> is the connection it goes on). */
size_t lg_req_nchan_poll(const lg_opts_t *o, char *buf, size_t cap, long k,
                         const lg_conn_t *c);
/* Finds "run_lg<digits>" in a delivered payload. Returns 0 and the run id, or -1. */
int lg_find_run(const char *body, size_t len, uint64_t *seq);

/* ---- measurement (lg_stats.c) --------------------------------------- */

typedef struct {
  uint64_t *v;
  size_t n, cap;
} lg_samples_t;

void lg_samples_add(lg_samples_t *s, uint64_t ns);
void lg_samples_reset(lg_samples_t *s);
/* Sorts and returns the <q> quantile (0..1) in microseconds. */
double lg_samples_q(lg_samples_t *s, double q);
void lg_samples_free(lg_samples_t *s);

/* User+system CPU time of <pid> in nanoseconds (all threads), or -1. */
int64_t lg_proc_cpu_ns(int pid);
/* Resident set size of <pid> in KiB, or -1. */
long lg_proc_rss_kb(int pid);
/* CPU time of this process in nanoseconds. */
int64_t lg_self_cpu_ns(void);
/* Runs the loop for 200 ms and returns whether <pid> meanwhile used under
 * 1 ms of CPU: quiet apart from periodic housekeeping (pilotlight samples
 * its event-loop lag ten times a second). True when it cannot be read. */
int lg_server_quiet(int pid);

/* The /metrics ledger. */
typedef struct {
  double parked_now, parked_total, settled_sum, open_conns;
  double settled[6]; /* matched timeout disconnect replaced shutdown rejected */
  int ok;
} lg_ledger_t;
/* Parses Prometheus text into <l>. */
void lg_ledger_parse(const char *text, size_t len, lg_ledger_t *l);

/* ---- the loop driver (lg_run.c) ------------------------------------- */

extern uv_loop_t *lg_loop;
/* Sets up the loop and the connections for <o> (which must outlive the run);
 * lg_run_stop() closes what it started. */
void lg_run_start(const lg_opts_t *o);
void lg_run_stop(void);
uint64_t lg_now(void);
/* Runs the loop for <secs>; with <pace> set, calls it between iterations. */
void lg_run_for(double secs, void (*pace)(void));
/* Runs the loop until *<flag> != 0 or <secs> passed. Returns *flag. */
int lg_run_until(volatile long *flag, long want, double secs);
/* A blocking GET on a fresh connection: returns the status (or <0) and
 * copies up to <cap> bytes of the body. */
int lg_http_get(const char *path, char *body, size_t cap, double timeout_s);
/* Output helpers: a row of the human table. */
void lg_row(const lg_opts_t *o, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Scrapes /metrics (lg_stats.c). Returns 0 when parsed. */
int lg_scrape(lg_ledger_t *l);

/* The scenarios (lg_cycle.c, lg_idle.c). Each prints its table and JSON line
 * and returns 0 when it ran (errors are reported, not fatal). */
int lg_scenario_cycle(const lg_opts_t *o);
int lg_scenario_scale(const lg_opts_t *o);
int lg_scenario_idle(const lg_opts_t *o);
int lg_scenario_churn(const lg_opts_t *o);

#endif
