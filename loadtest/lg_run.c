/* lg_run.c -- pl-loadgen's loop driver: running the loop for a while or
 * until a count is reached, a blocking GET, and the human table's rows. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "lg.h"

uv_loop_t *lg_loop;

uint64_t lg_now(void)
{
  return uv_hrtime();
}

void lg_run_for(double secs, void (*pace)(void))
{
  uint64_t end = lg_now() + (uint64_t)(secs * 1e9);
  while (lg_now() < end) {
    if (pace != NULL) {
      uv_run(lg_loop, UV_RUN_NOWAIT);
      pace();
    } else {
      uv_run(lg_loop, UV_RUN_ONCE);
    }
  }
}

int lg_run_until(volatile long *flag, long want, double secs)
{
  uint64_t end = lg_now() + (uint64_t)(secs * 1e9);
  while (lg_now() < end) {
    if (want == 0 ? *flag <= 0 : *flag >= want)
      return 1;
    uv_run(lg_loop, UV_RUN_ONCE);
  }
  return want == 0 ? *flag <= 0 : *flag >= want;
}

/* A 10 ms ticker so UV_RUN_ONCE never sleeps past a deadline. */
static uv_timer_t ticker;
static void tick_cb(uv_timer_t *t)
{
  (void)t;
}

static const lg_opts_t *g_opts;

void lg_run_start(const lg_opts_t *o)
{
  g_opts = o;
  lg_loop = uv_default_loop();
  uv_timer_init(lg_loop, &ticker);
  uv_timer_start(&ticker, tick_cb, 10, 10);
  lg_conn_setup(lg_loop, o->host, o->port, o->source_addrs);
}

void lg_run_stop(void)
{
  uv_timer_stop(&ticker);
  uv_close((uv_handle_t *)&ticker, NULL);
  uv_run(lg_loop, UV_RUN_NOWAIT);
}
static long get_done;
static int get_status;
static char *get_body;
static size_t get_cap;

static void get_resp(lg_conn_t *c, int status, const char *body, size_t len)
{
  get_status = status;
  if (get_body != NULL && get_cap > 0) {
    size_t n = len < get_cap - 1 ? len : get_cap - 1;
    memcpy(get_body, body, n);
    get_body[n] = '\0';
  }
  lg_conn_close(c);
}

static void get_connected(lg_conn_t *c, int err)
{
  char req[512];
  if (err != 0) {
    get_status = err;
    return;
  }
  size_t n = lg_req_get(g_opts, req, sizeof(req), (const char *)c->ud);
  lg_conn_send(c, req, n);
}

static void get_closed(lg_conn_t *c)
{
  (void)c;
  get_done = 1;
}

int lg_http_get(const char *path, char *body, size_t cap, double timeout_s)
{
  static lg_conn_t c;
  memset(&c, 0, sizeof(c));
  c.on_resp = get_resp;
  c.on_connect = get_connected;
  c.on_close = get_closed;
  c.ud = (void *)path;
  get_done = 0;
  get_status = -1;
  get_body = body;
  get_cap = cap;
  if (body != NULL && cap > 0)
    body[0] = '\0';
  if (lg_conn_connect(&c, 0) != 0)
    return -1;
  if (!lg_run_until(&get_done, 1, timeout_s)) {
    lg_conn_close(&c);
    lg_run_until(&get_done, 1, 1.0);
    get_status = -1;
  }
  lg_conn_release(&c);
  return get_status;
}

void lg_row(const lg_opts_t *o, const char *name, const char *fmt, ...)
{
  va_list ap;
  if (o->json_only)
    return;
  printf("  %-26s ", name);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}
