/* lg_cycle.c -- the cycle and scale scenarios: controllers that re-poll and
 * dispatchers that post, closed loop or at a fixed offered rate. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lg.h"

typedef struct {
  int controllers, dispatchers, keys;
  double rate;      /* 0 = closed loop */
  double hit_share; /* share of dispatches aimed at parked keys */
  long miss_keys;   /* never-parked key space for the rest */
  double warmup_s, duration_s;
} cyc_cfg_t;

typedef struct {
  double secs, disp_per_s, deliv_per_s, hit_ratio;
  long dispatches, hits, misses, deliveries, disp_errors, ctl_errors, conn_errors, lost;
  long polls_204, reconnects;
  double disp_q[6], deliv_q[6]; /* p50 p90 p99 p99.9 max mean */
  double srv_cpu_us_per_cycle, srv_cpu_pct, gen_cpu_pct;
  long rss_kb;
} cyc_res_t;

#define RING (1u << 21)
static const lg_opts_t *opts;
static cyc_cfg_t cfg;
static lg_conn_t *ctl, *disp;
static lg_conn_t *free_disp;
static lg_conn_t *retry_list;
static lg_conn_t *held, *held_tail; /* --hold: controllers in their run, oldest first */
static uint64_t *sent_at;
static uint64_t next_seq, measure_seq;
static int running, measuring, dispatching;
static long polls_sent, ctl_ready, disp_ready;
static long connecting, to_connect_next;
static uint64_t rate_start, rate_issued;
static cyc_res_t R;
static lg_samples_t disp_lat, deliv_lat;
static uv_timer_t retry_timer, pace_timer, hold_timer;

static unsigned long long rng_state = 88172645463325252ULL;
static uint64_t rnd(void)
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static void send_poll(lg_conn_t *c)
{
  if (c->state != LG_OPEN || c->busy)
    return;
  if (opts->proto == LG_PROTO_NCHAN) {
    char buf[512];
    size_t n = lg_req_nchan_poll(opts, buf, sizeof(buf), c->key, c);
    lg_conn_send(c, buf, n);
  } else {
    lg_conn_send_fixed(c);
  }
  polls_sent++;
}

static void retry_cb(uv_timer_t *t)
{
  (void)t;
  lg_conn_t *c = retry_list;
  retry_list = NULL;
  while (c != NULL) {
    lg_conn_t *n = c->next;
    if (running)
      send_poll(c);
    c = n;
  }
}

static void ctl_resp(lg_conn_t *c, int status, const char *body, size_t len)
{
  uint64_t seq;
  int payload = status == 200 || (opts->proto == LG_PROTO_NCHAN && status == 201);
  if (payload) {
    if (lg_find_run(body, len, &seq) == 0) {
      /* Payloads of dispatches sent in the window count, even when they
       * arrive during the short drain after it. */
      if (seq >= measure_seq && seq < next_seq) {
        R.deliveries++;
        lg_samples_add(&deliv_lat, lg_now() - sent_at[seq & (RING - 1)]);
      }
    } else if (measuring) {
      R.ctl_errors++;
    }
  } else if (status == 204 || status == 304 || status == 408) {
    /* Park timeout (nchan answers 304 or 408 on its own timeout). */
    R.polls_204++;
  } else {
    if (measuring)
      R.ctl_errors++;
    c->next = retry_list;
    retry_list = c;
    return;
  }
  if (!running)
    return;
  if (opts->hold_ms > 0 && payload) {
    /* Its run: one pause of the same length for all, so the list stays
     * in the order the pauses end. */
    c->t0 = lg_now() + (uint64_t)(opts->hold_ms * 1e6);
    c->next = NULL;
    if (held_tail != NULL)
      held_tail->next = c;
    else
      held = c;
    held_tail = c;
    return;
  }
  send_poll(c);
}

/* Every millisecond: the controllers whose run is over poll again. */
static void hold_cb(uv_timer_t *t)
{
  uint64_t now = lg_now();
  (void)t;
  while (held != NULL && held->t0 <= now) {
    lg_conn_t *c = held;
    held = c->next;
    if (held == NULL)
      held_tail = NULL;
    c->t0 = 0;
    if (running)
      send_poll(c);
  }
}

static void connect_more(void);

static void ctl_connected(lg_conn_t *c, int err)
{
  connecting--;
  if (err == 0) {
    ctl_ready++;
    if (c->t0 == 0) /* else it is in its run, and hold_cb sends the poll */
      send_poll(c);
  }
  connect_more();
}

static void ctl_closed(lg_conn_t *c)
{
  if (running) {
    R.reconnects++;
    lg_conn_connect(c, c->idx);
    connecting++;
  }
}

static void disp_issue(lg_conn_t *d, uint64_t due)
{
  char buf[4096];
  long k;
  char prefix = 'd';
  int parked_keys = cfg.keys < cfg.controllers ? cfg.keys : cfg.controllers;
  if (cfg.hit_share >= 1.0 || (double)(rnd() % 1000000) < cfg.hit_share * 1e6) {
    k = (long)(rnd() % (uint64_t)parked_keys);
  } else {
    k = (long)(rnd() % (uint64_t)cfg.miss_keys);
    prefix = 'n';
  }
  uint64_t seq = next_seq++;
  sent_at[seq & (RING - 1)] = due;
  d->seq = seq;
  d->t0 = due;
  size_t n = lg_req_dispatch(opts, buf, sizeof(buf), k, prefix, seq);
  lg_conn_send(d, buf, n);
}

static void disp_push_free(lg_conn_t *d)
{
  d->next = free_disp;
  free_disp = d;
}

static void pace(void)
{
  if (!dispatching || cfg.rate <= 0)
    return;
  uint64_t now = lg_now();
  /* Dispatch k is due at rate_start + k / rate: by now, all k <= elapsed * rate. */
  uint64_t due = (uint64_t)((double)(now - rate_start) * cfg.rate / 1e9) + 1;
  while (rate_issued < due && free_disp != NULL) {
    lg_conn_t *d = free_disp;
    free_disp = d->next;
    disp_issue(d, rate_start + (uint64_t)((double)rate_issued * 1e9 / cfg.rate));
    rate_issued++;
  }
}

static void pace_cb(uv_timer_t *t)
{
  (void)t;
  pace();
}

static void disp_resp(lg_conn_t *d, int status, const char *body, size_t len)
{
  uint64_t now = lg_now();
  if (d->seq >= measure_seq && measuring) {
    R.dispatches++;
    lg_samples_add(&disp_lat, now - d->t0);
    if (opts->proto == LG_PROTO_NCHAN) {
      if (status == 201)
        R.hits++;
      else if (status == 202)
        R.misses++;
      else
        R.disp_errors++;
    } else if (status == 200 && body != NULL && memmem(body, len, "true", 4) != NULL) {
      R.hits++;
    } else if (status == 200 && body != NULL && memmem(body, len, "false", 5) != NULL) {
      R.misses++;
    } else {
      R.disp_errors++;
    }
  }
  if (!dispatching)
    return;
  if (cfg.rate > 0) {
    disp_push_free(d);
    pace();
  } else {
    disp_issue(d, now);
  }
}

static void disp_connected(lg_conn_t *d, int err)
{
  connecting--;
  if (err == 0) {
    disp_ready++;
    if (dispatching && cfg.rate <= 0)
      disp_issue(d, lg_now());
    else
      disp_push_free(d);
  }
  connect_more();
}

static void disp_closed(lg_conn_t *d)
{
  if (running) {
    R.reconnects++;
    lg_conn_connect(d, d->idx);
    connecting++;
  }
}

/* Keeps at most 512 connects in flight so the listen backlog never overflows. */
static void connect_more(void)
{
  long total = cfg.controllers + cfg.dispatchers;
  while (connecting < 512 && to_connect_next < total) {
    long i = to_connect_next++;
    lg_conn_t *c = i < cfg.controllers ? &ctl[i] : &disp[i - cfg.controllers];
    if (lg_conn_connect(c, i) == 0)
      connecting++;
  }
}

static void setup_conns(void)
{
  ctl = calloc((size_t)cfg.controllers, sizeof(*ctl));
  disp = calloc((size_t)cfg.dispatchers, sizeof(*disp));
  if (ctl == NULL || disp == NULL)
    abort();
  for (long i = 0; i < cfg.controllers; i++) {
    lg_conn_t *c = &ctl[i];
    c->idx = i;
    c->key = (int)(i % cfg.keys);
    c->on_resp = ctl_resp;
    c->on_connect = ctl_connected;
    c->on_close = ctl_closed;
    if (opts->proto == LG_PROTO_WARMSTART)
      c->fixed = lg_req_poll(opts, i + 1, c->key, &c->fixed_len);
  }
  for (long i = 0; i < cfg.dispatchers; i++) {
    lg_conn_t *d = &disp[i];
    d->idx = cfg.controllers + i;
    d->on_resp = disp_resp;
    d->on_connect = disp_connected;
    d->on_close = disp_closed;
  }
}

static void teardown(void)
{
  running = 0;
  dispatching = 0;
  for (long i = 0; i < cfg.controllers; i++)
    lg_conn_close(&ctl[i]);
  for (long i = 0; i < cfg.dispatchers; i++)
    lg_conn_close(&disp[i]);
  lg_run_until(&lg_conn_open, 0, 10);
  uv_timer_stop(&retry_timer);
  uv_close((uv_handle_t *)&retry_timer, NULL);
  uv_timer_stop(&hold_timer);
  uv_close((uv_handle_t *)&hold_timer, NULL);
  held = held_tail = NULL;
  uv_run(lg_loop, UV_RUN_NOWAIT);
  for (long i = 0; i < cfg.controllers; i++)
    lg_conn_release(&ctl[i]);
  for (long i = 0; i < cfg.dispatchers; i++)
    lg_conn_release(&disp[i]);
  free(ctl);
  free(disp);
  ctl = disp = NULL;
}

/* Waits until the server is quiet: parked_now when /metrics is there,
 * otherwise its CPU time all but standing still for 200 ms. */
static void wait_parked(long want)
{
  for (int i = 0; i < 100; i++) {
    if (opts->metrics) {
      lg_ledger_t l;
      if (lg_scrape(&l) == 0 && l.parked_now >= (double)want)
        return;
      lg_run_for(0.1, NULL);
    } else if (lg_server_quiet(opts->server_pid)) {
      return;
    }
  }
}

static void fill_quantiles(lg_samples_t *s, double *q)
{
  static const double qs[5] = {0.50, 0.90, 0.99, 0.999, 1.0};
  for (int i = 0; i < 5; i++)
    q[i] = lg_samples_q(s, qs[i]);
  double sum = 0;
  for (size_t i = 0; i < s->n; i++)
    sum += (double)s->v[i];
  q[5] = s->n ? sum / (double)s->n / 1000.0 : 0;
}

static void run_cycle(const lg_opts_t *o, const cyc_cfg_t *c, cyc_res_t *res)
{
  opts = o;
  cfg = *c;
  memset(&R, 0, sizeof(R));
  if (sent_at == NULL)
    sent_at = calloc(RING, sizeof(*sent_at));
  lg_samples_reset(&disp_lat);
  lg_samples_reset(&deliv_lat);
  uv_timer_init(lg_loop, &retry_timer);
  uv_timer_start(&retry_timer, retry_cb, 100, 100);
  uv_timer_init(lg_loop, &hold_timer);
  if (o->hold_ms > 0)
    uv_timer_start(&hold_timer, hold_cb, 1, 1);
  polls_sent = ctl_ready = disp_ready = connecting = to_connect_next = 0;
  free_disp = retry_list = NULL;
  measure_seq = UINT64_MAX;
  measuring = 0;
  running = 1;
  setup_conns();
  connect_more();
  lg_run_until(&ctl_ready, cfg.controllers, 60);
  lg_run_until(&disp_ready, cfg.dispatchers, 10);
  wait_parked(o->proto == LG_PROTO_WARMSTART ? cfg.controllers : 0);

  /* Warm-up, then the measured window. */
  dispatching = 1;
  rate_start = lg_now();
  rate_issued = 0;
  for (lg_conn_t *d = free_disp; d != NULL && cfg.rate <= 0;) {
    lg_conn_t *n = d->next;
    disp_issue(d, lg_now());
    d = n;
  }
  if (cfg.rate <= 0)
    free_disp = NULL;
  void (*pacer)(void) = cfg.rate > 0 && o->spin ? pace : NULL;
  uv_timer_init(lg_loop, &pace_timer);
  if (cfg.rate > 0 && !o->spin)
    uv_timer_start(&pace_timer, pace_cb, 1, 1);
  lg_run_for(cfg.warmup_s, pacer);
  memset(&R, 0, sizeof(R));
  lg_samples_reset(&disp_lat);
  lg_samples_reset(&deliv_lat);
  long conn_err0 = lg_conn_errors;
  measure_seq = next_seq;
  measuring = 1;
  int64_t cpu0 = lg_proc_cpu_ns(o->server_pid), self0 = lg_self_cpu_ns();
  uint64_t t0 = lg_now();
  lg_run_for(cfg.duration_s, pacer);
  uint64_t t1 = lg_now();
  int64_t cpu1 = lg_proc_cpu_ns(o->server_pid), self1 = lg_self_cpu_ns();
  measuring = 0;
  dispatching = 0;
  uv_timer_stop(&pace_timer);
  uv_close((uv_handle_t *)&pace_timer, NULL);
  /* Let payloads already matched reach their controllers. */
  lg_run_for(0.3, NULL);
  res->rss_kb = lg_proc_rss_kb(o->server_pid);
  R.secs = (double)(t1 - t0) / 1e9;
  R.conn_errors = lg_conn_errors - conn_err0;
  teardown();

  R.disp_per_s = (double)R.dispatches / R.secs;
  R.deliv_per_s = (double)R.deliveries / R.secs;
  R.hit_ratio = R.dispatches ? (double)R.hits / (double)R.dispatches : 0;
  R.lost = R.hits - R.deliveries;
  if (R.lost < 0)
    R.lost = 0;
  fill_quantiles(&disp_lat, R.disp_q);
  fill_quantiles(&deliv_lat, R.deliv_q);
  if (cpu0 >= 0 && cpu1 >= 0) {
    R.srv_cpu_pct = (double)(cpu1 - cpu0) / (double)(t1 - t0) * 100.0;
    R.srv_cpu_us_per_cycle = R.deliveries ? (double)(cpu1 - cpu0) / 1000.0 / (double)R.deliveries : 0;
  } else {
    R.srv_cpu_pct = R.srv_cpu_us_per_cycle = -1;
  }
  R.gen_cpu_pct = (double)(self1 - self0) / (double)(t1 - t0) * 100.0;
  long rss = res->rss_kb;
  *res = R;
  res->rss_kb = rss;
}

static void json_q(char *buf, size_t cap, const char *name, const double *q)
{
  size_t n = strlen(buf);
  snprintf(buf + n, cap - n,
           ",\"%s_us\":{\"p50\":%.1f,\"p90\":%.1f,\"p99\":%.1f,\"p999\":%.1f,\"max\":%.1f,"
           "\"mean\":%.1f}",
           name, q[0], q[1], q[2], q[3], q[4], q[5]);
}

static void print_cycle(const lg_opts_t *o, const cyc_cfg_t *c, const cyc_res_t *r)
{
  lg_row(o, "controllers/dispatchers", "%d / %d (%d keys, %s)", c->controllers, c->dispatchers,
         c->keys, c->rate > 0 ? "fixed rate" : "closed loop");
  if (c->rate > 0)
    lg_row(o, "offered rate", "%.0f/s", c->rate);
  if (o->hold_ms > 0)
    lg_row(o, "controller's run", "%.1f ms after each payload", o->hold_ms);
  lg_row(o, "dispatches", "%ld in %.2f s = %.0f/s", r->dispatches, r->secs, r->disp_per_s);
  lg_row(o, "hit ratio", "%.4f (%ld hits, %ld misses)", r->hit_ratio, r->hits, r->misses);
  lg_row(o, "delivered", "%ld = %.0f/s (lost: %ld)", r->deliveries, r->deliv_per_s, r->lost);
  lg_row(o, "dispatch latency us", "p50 %.0f p90 %.0f p99 %.0f p99.9 %.0f max %.0f",
         r->disp_q[0], r->disp_q[1], r->disp_q[2], r->disp_q[3], r->disp_q[4]);
  lg_row(o, "delivery latency us", "p50 %.0f p90 %.0f p99 %.0f p99.9 %.0f max %.0f",
         r->deliv_q[0], r->deliv_q[1], r->deliv_q[2], r->deliv_q[3], r->deliv_q[4]);
  lg_row(o, "errors", "dispatch %ld, controller %ld, connection %ld, reconnects %ld",
         r->disp_errors, r->ctl_errors, r->conn_errors, r->reconnects);
  lg_row(o, "server CPU per cycle", "%.2f us (server %.0f%% of a core, generator %.0f%%)",
         r->srv_cpu_us_per_cycle, r->srv_cpu_pct, r->gen_cpu_pct);
}

static void json_cycle(char *buf, size_t cap, const cyc_cfg_t *c, const cyc_res_t *r)
{
  size_t n = strlen(buf);
  snprintf(buf + n, cap - n,
           ",\"controllers\":%d,\"dispatchers\":%d,\"keys\":%d,\"rate\":%.0f,\"hold_ms\":%.1f,"
           "\"secs\":%.3f,"
           "\"dispatches\":%ld,\"dispatch_per_s\":%.1f,\"hits\":%ld,\"misses\":%ld,"
           "\"hit_ratio\":%.5f,\"delivered\":%ld,\"delivered_per_s\":%.1f,\"lost\":%ld,"
           "\"errors\":{\"dispatch\":%ld,\"controller\":%ld,\"connection\":%ld},"
           "\"reconnects\":%ld,\"server_cpu_us_per_cycle\":%.3f,\"server_cpu_pct\":%.1f,"
           "\"generator_cpu_pct\":%.1f,\"server_rss_kb\":%ld",
           c->controllers, c->dispatchers, c->keys, c->rate, opts->hold_ms, r->secs, r->dispatches,
           r->disp_per_s, r->hits, r->misses, r->hit_ratio, r->deliveries, r->deliv_per_s,
           r->lost, r->disp_errors, r->ctl_errors, r->conn_errors, r->reconnects,
           r->srv_cpu_us_per_cycle, r->srv_cpu_pct, r->gen_cpu_pct, r->rss_kb);
  json_q(buf, cap, "dispatch", r->disp_q);
  json_q(buf, cap, "delivery", r->deliv_q);
}

static void json_head(char *buf, size_t cap, const lg_opts_t *o, const char *scenario)
{
  snprintf(buf, cap, "{\"scenario\":\"%s\",\"label\":\"%s\",\"proto\":\"%s\"", scenario,
           o->label, o->proto == LG_PROTO_NCHAN ? "nchan" : "warm-start");
}

int lg_scenario_cycle(const lg_opts_t *o)
{
  static char buf[4096];
  cyc_cfg_t c = {o->controllers, o->dispatchers, o->keys, o->rate, 1.0, 1, o->warmup_s,
                 o->duration_s};
  cyc_res_t r;
  if (!o->json_only)
    printf("== cycle (%s)\n", o->label);
  run_cycle(o, &c, &r);
  print_cycle(o, &c, &r);
  json_head(buf, sizeof(buf), o, "cycle");
  json_cycle(buf, sizeof(buf), &c, &r);
  printf("%s}\n", buf);
  fflush(stdout);
  return 0;
}

/* One measured point of the scale scenario, into the JSON under <name>. */
static double scale_point(const lg_opts_t *o, const char *name, cyc_cfg_t *c, char *buf,
                          size_t cap)
{
  cyc_res_t r;
  if (!o->json_only)
    printf("-- %s: %d parked on %d keys, %.0f dispatches/s, %.0f%% to %ld never-parked keys\n",
           name, c->controllers, c->keys, c->rate, (1 - c->hit_share) * 100, c->miss_keys);
  run_cycle(o, c, &r);
  lg_row(o, "dispatch latency us", "p50 %.0f p99 %.0f p99.9 %.0f max %.0f (hit ratio %.3f)",
         r.disp_q[0], r.disp_q[2], r.disp_q[3], r.disp_q[4], r.hit_ratio);
  lg_row(o, "errors", "dispatch %ld, controller %ld, connection %ld", r.disp_errors,
         r.ctl_errors, r.conn_errors);
  size_t n = strlen(buf);
  snprintf(buf + n, cap - n,
           ",\"%s\":{\"parked\":%d,\"keys\":%d,\"rate\":%.0f,\"miss_share\":%.2f,"
           "\"dispatches\":%ld,\"hit_ratio\":%.4f,\"errors\":%ld",
           name, c->controllers, c->keys, c->rate, 1 - c->hit_share, r.dispatches, r.hit_ratio,
           r.disp_errors + r.ctl_errors + r.conn_errors);
  json_q(buf, cap, "dispatch", r.disp_q);
  n = strlen(buf);
  snprintf(buf + n, cap - n, "}");
  return r.disp_q[2];
}

int lg_scenario_scale(const lg_opts_t *o)
{
  static char buf[8192];
  double rate = o->scale_rate;
  if (!o->json_only)
    printf("== scale (%s)\n", o->label);
  json_head(buf, sizeof(buf), o, "scale");
  /* Parked count: same keys, same rate, every dispatch aimed at a parked key. */
  cyc_cfg_t a = {o->scale_small, o->dispatchers, 25, rate, 1.0, 1, o->warmup_s, o->duration_s};
  cyc_cfg_t b = a;
  b.controllers = o->scale_large;
  /* Key count: the same parked polls on one key or each on its own, with half
   * the dispatches going to never-parked keys. */
  cyc_cfg_t k1 = {o->scale_large, o->dispatchers, 1, rate, 0.5, o->scale_misskeys, o->warmup_s,
                  o->duration_s};
  cyc_cfg_t kn = k1;
  kn.keys = o->scale_large;
  double p_a = scale_point(o, "parked_small", &a, buf, sizeof(buf));
  double p_b = scale_point(o, "parked_large", &b, buf, sizeof(buf));
  double p_k1 = scale_point(o, "keys_one", &k1, buf, sizeof(buf));
  double p_kn = scale_point(o, "keys_many", &kn, buf, sizeof(buf));
  double r_parked = p_a > 0 ? p_b / p_a : 0, r_keys = p_k1 > 0 ? p_kn / p_k1 : 0;
  lg_row(o, "p99 large/small parked", "%.3f", r_parked);
  lg_row(o, "p99 many/one keys", "%.3f", r_keys);
  size_t n = strlen(buf);
  snprintf(buf + n, sizeof(buf) - n, ",\"p99_ratio_parked\":%.4f,\"p99_ratio_keys\":%.4f}",
           r_parked, r_keys);
  printf("%s\n", buf);
  fflush(stdout);
  return 0;
}
