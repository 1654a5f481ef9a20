/* lg_idle.c -- the idle (memory per parked poll) and churn (connect, park,
 * abort) scenarios. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lg.h"

static const lg_opts_t *opts;
static lg_conn_t *conns;
static long n_conns, connected, connecting, next_connect;
static long early_responses, dropped, closing_all;

static void send_poll(lg_conn_t *c)
{
  if (opts->proto == LG_PROTO_NCHAN) {
    char buf[512];
    size_t n = lg_req_nchan_poll(opts, buf, sizeof(buf), c->key, c);
    lg_conn_send(c, buf, n);
  } else {
    lg_conn_send_fixed(c);
  }
}

static int keys_for(long parked)
{
  /* Stay well under the default per-key cap of 10,000. */
  long k = opts->keys;
  if (parked / k > 5000)
    k = parked / 5000 + 1;
  return (int)k;
}

/* ---- idle ------------------------------------------------------------ */

static void idle_connect_more(void);

static void idle_resp(lg_conn_t *c, int status, const char *body, size_t len)
{
  (void)c;
  (void)status;
  (void)body;
  (void)len;
  early_responses++;
}

static void idle_connected(lg_conn_t *c, int err)
{
  connecting--;
  if (err == 0) {
    connected++;
    send_poll(c);
  }
  idle_connect_more();
}

static void idle_closed(lg_conn_t *c)
{
  (void)c;
  if (!closing_all)
    dropped++;
}

static long conn_limit; /* how many of conns[] this pass opens */

static void idle_connect_more(void)
{
  while (connecting < 512 && next_connect < conn_limit) {
    lg_conn_t *c = &conns[next_connect];
    if (lg_conn_connect(c, next_connect) == 0)
      connecting++;
    next_connect++;
  }
}

/* Waits until the server has parked <want> polls (by /metrics) or its CPU
 * time all but stood still for 200 ms. Returns parked_now or -1. */
static double settle(long want)
{
  lg_ledger_t l;
  for (int i = 0; i < 150; i++) {
    if (opts->metrics) {
      if (lg_scrape(&l) == 0 && l.parked_now == (double)want)
        return l.parked_now;
      lg_run_for(0.1, NULL);
    } else if (lg_server_quiet(opts->server_pid)) {
      return -1;
    }
  }
  return opts->metrics && lg_scrape(&l) == 0 ? l.parked_now : -1;
}

int lg_scenario_idle(const lg_opts_t *o)
{
  opts = o;
  n_conns = o->parked;
  int keys = keys_for(n_conns);
  connected = connecting = next_connect = 0;
  early_responses = dropped = closing_all = 0;
  int srcs = o->source_addrs > (int)(n_conns / 25000 + 1) ? o->source_addrs : (int)(n_conns / 25000 + 1);
  lg_conn_setup(lg_loop, o->host, o->port, srcs);
  if (!o->json_only)
    printf("== idle (%s)\n", o->label);
  conns = calloc((size_t)n_conns, sizeof(*conns));
  if (conns == NULL)
    abort();
  for (long i = 0; i < n_conns; i++) {
    conns[i].idx = i;
    conns[i].key = (int)(i % keys);
    conns[i].on_resp = idle_resp;
    conns[i].on_connect = idle_connected;
    conns[i].on_close = idle_closed;
    if (o->proto == LG_PROTO_WARMSTART)
      conns[i].fixed = lg_req_poll(o, 2000000 + i, conns[i].key, &conns[i].fixed_len);
  }
  long err0 = lg_conn_errors;
  /* Warm-up pass: a few polls parked and dropped, so code paths, JITs and
   * allocators have run once before the baseline is read. */
  long warm = o->idle_warmup < n_conns ? o->idle_warmup : n_conns;
  if (warm > 0) {
    conn_limit = warm;
    idle_connect_more();
    lg_run_until(&connected, warm, 60);
    settle(warm);
    closing_all = 1;
    for (long i = 0; i < warm; i++)
      lg_conn_close(&conns[i]);
    lg_run_until(&lg_conn_open, 0, 30);
    lg_run_for(1.0, NULL);
    settle(0);
    connected = connecting = next_connect = 0;
    closing_all = 0;
  }
  long rss0 = lg_proc_rss_kb(o->server_pid);
  uint64_t t0 = lg_now();
  conn_limit = n_conns;
  idle_connect_more();
  lg_run_until(&connected, n_conns, 120);
  double parked = settle(n_conns);
  double connect_s = (double)(lg_now() - t0) / 1e9;
  long rss1 = lg_proc_rss_kb(o->server_pid);
  long held = lg_conn_open;

  closing_all = 1;
  for (long i = 0; i < n_conns; i++)
    lg_conn_close(&conns[i]);
  lg_run_until(&lg_conn_open, 0, 30);
  lg_run_for(2.0, NULL);
  long rss2 = lg_proc_rss_kb(o->server_pid);
  char pbody[256];
  int probe = lg_http_get(o->probe_path, pbody, sizeof(pbody), 5.0);
  double after_parked = -1;
  lg_ledger_t l;
  if (o->metrics && lg_scrape(&l) == 0)
    after_parked = l.parked_now;
  long errors = lg_conn_errors - err0;
  for (long i = 0; i < n_conns; i++)
    lg_conn_release(&conns[i]);
  free(conns);
  lg_conn_setup(lg_loop, o->host, o->port, o->source_addrs);

  double per_poll = n_conns ? (double)(rss1 - rss0) * 1024.0 / (double)n_conns : 0;
  lg_row(o, "parked polls", "%ld requested, %ld held open, %d keys, %d source addrs, %.2f s",
         n_conns, held, keys, srcs, connect_s);
  lg_row(o, "warm-up", "%ld polls parked and closed before the baseline", warm);
  if (parked >= 0)
    lg_row(o, "server parked_now", "%.0f while held, %.0f after close", parked, after_parked);
  lg_row(o, "server RSS KiB", "before %ld, with %ld, 2 s after close %ld", rss0, rss1, rss2);
  lg_row(o, "RSS per parked poll", "%.0f bytes", per_poll);
  lg_row(o, "errors", "early responses %ld, dropped %ld, connection %ld", early_responses,
         dropped, errors);
  lg_row(o, "still answering", "GET %s -> %d", o->probe_path, probe);
  printf("{\"scenario\":\"idle\",\"label\":\"%s\",\"proto\":\"%s\",\"parked\":%ld,\"held\":%ld,"
         "\"keys\":%d,\"warmup\":%ld,\"source_addrs\":%d,\"connect_s\":%.3f,\"server_parked_now\":%.0f,"
         "\"rss_before_kb\":%ld,\"rss_with_kb\":%ld,\"rss_after_kb\":%ld,"
         "\"bytes_per_parked\":%.1f,\"early_responses\":%ld,\"dropped\":%ld,"
         "\"connection_errors\":%ld,\"probe_status\":%d,\"parked_after_close\":%.0f}\n",
         o->label, o->proto == LG_PROTO_NCHAN ? "nchan" : "warm-start", n_conns, held, keys,
         warm, srcs, connect_s, parked, rss0, rss1, rss2, per_poll, early_responses, dropped, errors,
         probe, after_parked);
  fflush(stdout);
  return 0;
}

/* ---- churn ----------------------------------------------------------- */

static long churn_target, churn_started, churn_done, churn_inflight;
static long rss_peak;
static uv_timer_t rss_timer;
static long churn_id_base = 10000000;

static void churn_start(lg_conn_t *c);

static void churn_connected(lg_conn_t *c, int err)
{
  if (err != 0)
    return; /* closed by the connection layer; churn_closed runs */
  if (opts->proto == LG_PROTO_NCHAN) {
    send_poll(c);
    return;
  }
  size_t n;
  char *req = lg_req_poll(opts, churn_id_base + c->idx, c->key, &n);
  lg_conn_send(c, req, n);
  free(req);
}

/* The poll is on the wire: abort it, as a controller whose fetch timed out. */
static void churn_written(lg_conn_t *c, int err)
{
  (void)err;
  if (opts->abort_rst)
    lg_conn_reset(c);
  else
    lg_conn_close(c);
}

static void churn_resp(lg_conn_t *c, int status, const char *body, size_t len)
{
  (void)c;
  (void)status;
  (void)body;
  (void)len;
  early_responses++;
}

/* With --rate, finished slots wait here for the pacer. */
static lg_conn_t *churn_free;
static uint64_t churn_t0;
static double churn_rate;
static uv_timer_t churn_timer;

static void churn_closed(lg_conn_t *c)
{
  churn_done++;
  churn_inflight--;
  if (churn_started >= churn_target)
    return;
  if (churn_rate > 0) {
    c->next = churn_free;
    churn_free = c;
  } else {
    churn_start(c);
  }
}

/* Starts the cycles due by now: cycle k is due at churn_t0 + k / rate. A
 * server that keeps up then never has more than a few aborted connections
 * queued, so its peak memory does not depend on how far it fell behind. */
static void churn_pace(uv_timer_t *t)
{
  (void)t;
  double due = (double)(lg_now() - churn_t0) * churn_rate / 1e9 + 1;
  while (churn_free != NULL && (double)churn_started < due && churn_started < churn_target) {
    lg_conn_t *c = churn_free;
    churn_free = c->next;
    churn_start(c);
  }
}

static void churn_start(lg_conn_t *c)
{
  long n = churn_started++;
  c->idx = n;
  c->key = (int)(n % opts->keys);
  churn_inflight++;
  if (lg_conn_connect(c, n) != 0 && c->state == LG_IDLE) {
    /* No handle was made, so no close callback will come. */
    lg_conn_errors++;
    churn_done++;
    churn_inflight--;
  }
}

static void rss_tick(uv_timer_t *t)
{
  (void)t;
  long r = lg_proc_rss_kb(opts->server_pid);
  if (r > rss_peak)
    rss_peak = r;
}

static void churn_run(long cycles, long base)
{
  int p = opts->concurrency;
  churn_id_base = base;
  churn_target = cycles;
  churn_started = churn_done = churn_inflight = 0;
  churn_rate = opts->rate;
  churn_free = NULL;
  churn_t0 = lg_now();
  if (churn_rate > 0) {
    for (int i = 0; i < p; i++) {
      conns[i].next = churn_free;
      churn_free = &conns[i];
    }
    uv_timer_init(lg_loop, &churn_timer);
    uv_timer_start(&churn_timer, churn_pace, 1, 1);
  } else {
    for (int i = 0; i < p && churn_started < churn_target; i++)
      churn_start(&conns[i]);
  }
  lg_run_until(&churn_done, cycles, 3600);
  if (churn_rate > 0) {
    uv_timer_stop(&churn_timer);
    uv_close((uv_handle_t *)&churn_timer, NULL);
    uv_run(lg_loop, UV_RUN_NOWAIT);
  }
}

int lg_scenario_churn(const lg_opts_t *o)
{
  opts = o;
  int p = o->concurrency;
  early_responses = 0;
  int srcs = o->source_addrs > 8 ? o->source_addrs : 8;
  lg_conn_setup(lg_loop, o->host, o->port, srcs);
  if (!o->json_only)
    printf("== churn (%s)\n", o->label);
  conns = calloc((size_t)p, sizeof(*conns));
  for (int i = 0; i < p; i++) {
    conns[i].on_connect = churn_connected;
    conns[i].on_write = churn_written;
    conns[i].on_resp = churn_resp;
    conns[i].on_close = churn_closed;
  }
  long err0 = lg_conn_errors;
  long rss_start = lg_proc_rss_kb(o->server_pid);
  churn_run(o->churn_warmup, 100000000);
  settle(0);
  lg_run_for(0.5, NULL);
  long rss_base = lg_proc_rss_kb(o->server_pid);
  lg_ledger_t l0, l1;
  int have0 = o->metrics && lg_scrape(&l0) == 0;

  rss_peak = rss_base;
  uv_timer_init(lg_loop, &rss_timer);
  uv_timer_start(&rss_timer, rss_tick, 20, 20);
  int64_t cpu0 = lg_proc_cpu_ns(o->server_pid);
  uint64_t t0 = lg_now();
  churn_run(o->cycles, 200000000);
  uint64_t t1 = lg_now();
  int64_t cpu1 = lg_proc_cpu_ns(o->server_pid);
  double secs = (double)(t1 - t0) / 1e9;
  settle(0);
  lg_run_for(1.0, NULL);
  uv_timer_stop(&rss_timer);
  uv_close((uv_handle_t *)&rss_timer, NULL);
  rss_tick(NULL);
  long rss_end = lg_proc_rss_kb(o->server_pid);
  int have1 = o->metrics && lg_scrape(&l1) == 0;
  long errors = lg_conn_errors - err0;
  for (int i = 0; i < p; i++)
    lg_conn_release(&conns[i]);
  free(conns);
  lg_conn_setup(lg_loop, o->host, o->port, o->source_addrs);

  double growth_pct = rss_base > 0 ? (double)(rss_end - rss_base) * 100.0 / (double)rss_base : 0;
  double cpu_us = cpu0 >= 0 ? (double)(cpu1 - cpu0) / 1000.0 / (double)o->cycles : -1;
  lg_row(o, "cycles", "%ld (+%ld warm-up) in %.2f s = %.0f/s, concurrency %d, %d source addrs",
         o->cycles, o->churn_warmup, secs, (double)o->cycles / secs, p, srcs);
  if (o->rate > 0)
    lg_row(o, "offered rate", "%.0f/s", o->rate);
  lg_row(o, "server RSS KiB", "start %ld, warmed %ld, peak %ld, end %ld", rss_start, rss_base,
         rss_peak, rss_end);
  lg_row(o, "RSS growth", "%+ld KiB (%+.2f%% of warmed baseline), %+ld KiB from start",
         rss_end - rss_base, growth_pct, rss_end - rss_start);
  lg_row(o, "server CPU per cycle", "%.2f us", cpu_us);
  lg_row(o, "errors", "early responses %ld, connection %ld", early_responses, errors);
  int ledger_ok = -1;
  double disc = 0;
  if (have1) {
    double lhs = l1.parked_now + l1.settled_sum;
    ledger_ok = l1.parked_now == 0 && lhs == l1.parked_total;
    disc = l1.settled[2] - (have0 ? l0.settled[2] : 0);
    lg_row(o, "ledger", "parked_now %.0f + settled %.0f = %.0f vs parked_total %.0f: %s",
           l1.parked_now, l1.settled_sum, lhs, l1.parked_total, ledger_ok ? "ok" : "BROKEN");
    lg_row(o, "disconnects settled", "%.0f of %ld cycles", disc, o->cycles);
  }
  printf("{\"scenario\":\"churn\",\"label\":\"%s\",\"proto\":\"%s\",\"cycles\":%ld,"
         "\"warmup_cycles\":%ld,\"rate\":%.0f,\"secs\":%.3f,\"cycles_per_s\":%.1f,\"concurrency\":%d,"
         "\"rss_start_kb\":%ld,\"rss_base_kb\":%ld,\"rss_peak_kb\":%ld,\"rss_end_kb\":%ld,"
         "\"rss_growth_kb\":%ld,\"rss_growth_pct\":%.3f,\"rss_growth_from_start_kb\":%ld,\"server_cpu_us_per_cycle\":%.3f,"
         "\"early_responses\":%ld,\"connection_errors\":%ld,\"ledger_ok\":%d,"
         "\"parked_now\":%.0f,\"parked_total\":%.0f,\"settled_sum\":%.0f,"
         "\"disconnects\":%.0f}\n",
         o->label, o->proto == LG_PROTO_NCHAN ? "nchan" : "warm-start", o->cycles,
         o->churn_warmup, o->rate, secs, (double)o->cycles / secs, p, rss_start, rss_base, rss_peak,
         rss_end, rss_end - rss_base, growth_pct, rss_end - rss_start, cpu_us, early_responses, errors, ledger_ok,
         have1 ? l1.parked_now : -1, have1 ? l1.parked_total : -1, have1 ? l1.settled_sum : -1,
         disc);
  fflush(stdout);
  return ledger_ok == 0 ? 1 : 0;
}
