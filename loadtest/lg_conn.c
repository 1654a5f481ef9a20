/* lg_conn.c -- keep-alive HTTP/1.1 client connections on libuv + llhttp. */
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include "lg.h"

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

long lg_conn_errors;
long lg_conn_open;

static uv_loop_t *loop;
static struct sockaddr_in server_addr;
static int n_sources;
static llhttp_settings_t settings;
/* One read buffer for everybody: libuv calls read_cb right after alloc_cb. */
static char read_buf[65536];

static void *xrealloc(void *p, size_t n)
{
  void *q = realloc(p, n);
  if (q == NULL) {
    fprintf(stderr, "pl-loadgen: out of memory\n");
    abort();
  }
  return q;
}

static int on_status(llhttp_t *p, const char *at, size_t len)
{
  (void)at;
  (void)len;
  lg_conn_t *c = p->data;
  c->status = p->status_code;
  return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
  lg_conn_t *c = p->data;
  c->hdr_want = 0;
  if (len == 4 && strncasecmp(at, "etag", 4) == 0)
    c->hdr_want = 1;
  else if (len == 13 && strncasecmp(at, "last-modified", 13) == 0)
    c->hdr_want = 2;
  return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
  lg_conn_t *c = p->data;
  char *dst = c->hdr_want == 1 ? c->etag : c->hdr_want == 2 ? c->lastmod : NULL;
  if (dst != NULL && len < sizeof(c->etag)) {
    memcpy(dst, at, len);
    dst[len] = '\0';
  }
  return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
  lg_conn_t *c = p->data;
  if (c->body_len + len > c->body_cap) {
    c->body_cap = (c->body_len + len) * 2;
    c->body = xrealloc(c->body, c->body_cap);
  }
  memcpy(c->body + c->body_len, at, len);
  c->body_len += len;
  return 0;
}

static int on_message_begin(llhttp_t *p)
{
  lg_conn_t *c = p->data;
  c->body_len = 0;
  c->status = 0;
  return 0;
}

static int on_message_complete(llhttp_t *p)
{
  lg_conn_t *c = p->data;
  c->keep_alive = llhttp_should_keep_alive(p);
  c->busy = 0;
  c->status = p->status_code;
  if (c->on_resp != NULL)
    c->on_resp(c, c->status, c->body, c->body_len);
  /* The callback may have closed us; stop parsing then. */
  if (c->state != LG_OPEN)
    return HPE_PAUSED;
  if (!c->keep_alive) {
    lg_conn_close(c);
    return HPE_PAUSED;
  }
  return 0;
}

void lg_conn_setup(uv_loop_t *l, const char *host, int port, int source_addrs)
{
  loop = l;
  uv_ip4_addr(host, port, &server_addr);
  n_sources = source_addrs;
  llhttp_settings_init(&settings);
  settings.on_status = on_status;
  settings.on_header_field = on_header_field;
  settings.on_header_value = on_header_value;
  settings.on_body = on_body;
  settings.on_message_begin = on_message_begin;
  settings.on_message_complete = on_message_complete;
}

static void close_cb(uv_handle_t *h)
{
  lg_conn_t *c = (lg_conn_t *)h;
  c->state = LG_IDLE;
  c->busy = 0;
  if (c->opened) {
    c->opened = 0;
    lg_conn_open--;
  }
  if (c->on_close != NULL)
    c->on_close(c);
}

void lg_conn_close(lg_conn_t *c)
{
  if (c->state == LG_IDLE || c->state == LG_CLOSING)
    return;
  c->state = LG_CLOSING;
  uv_close((uv_handle_t *)&c->tcp, close_cb);
}

void lg_conn_reset(lg_conn_t *c)
{
  if (c->state == LG_IDLE || c->state == LG_CLOSING)
    return;
  c->state = LG_CLOSING;
  if (uv_tcp_close_reset(&c->tcp, close_cb) != 0)
    uv_close((uv_handle_t *)&c->tcp, close_cb);
}

void lg_conn_release(lg_conn_t *c)
{
  free(c->body);
  free(c->fixed);
  c->body = c->fixed = NULL;
  c->body_cap = 0;
}

static void alloc_cb(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
  (void)h;
  (void)sz;
  buf->base = read_buf;
  buf->len = sizeof(read_buf);
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  lg_conn_t *c = (lg_conn_t *)s;
  if (n == 0)
    return;
  if (n < 0) {
    if (n != UV_EOF)
      lg_conn_errors++;
    else
      llhttp_finish(&c->parser);
    lg_conn_close(c);
    return;
  }
  if (c->state != LG_OPEN)
    return;
  llhttp_errno_t e = llhttp_execute(&c->parser, buf->base, (size_t)n);
  if (e == HPE_PAUSED || e == HPE_PAUSED_UPGRADE) {
    llhttp_resume(&c->parser);
    return;
  }
  if (e != HPE_OK) {
    lg_conn_errors++;
    lg_conn_close(c);
  }
}

static void connect_cb(uv_connect_t *req, int status)
{
  lg_conn_t *c = req->data;
  free(req);
  if (c->state != LG_CONNECTING) {
    return;
  }
  if (status == 0) {
    c->state = LG_OPEN;
    c->opened = 1;
    lg_conn_open++;
    uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
  } else {
    lg_conn_errors++;
  }
  if (c->on_connect != NULL)
    c->on_connect(c, status);
  if (status != 0)
    lg_conn_close(c);
}

static int bind_source(lg_conn_t *c, long which)
{
  struct sockaddr_in src;
  char ip[32];
  uv_os_fd_t fd;
  int one = 1;
  snprintf(ip, sizeof(ip), "127.0.0.%ld", 1 + which % n_sources);
  uv_ip4_addr(ip, 0, &src);
  if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  return uv_tcp_bind(&c->tcp, (const struct sockaddr *)&src, 0);
}

int lg_conn_connect(lg_conn_t *c, long which)
{
  int r;
  if (n_sources > 1)
    r = uv_tcp_init_ex(loop, &c->tcp, AF_INET);
  else
    r = uv_tcp_init(loop, &c->tcp);
  if (r != 0)
    return r;
  c->state = LG_CONNECTING;
  c->busy = 0;
  c->etag[0] = c->lastmod[0] = '\0';
  llhttp_init(&c->parser, HTTP_RESPONSE, &settings);
  c->parser.data = c;
  uv_tcp_nodelay(&c->tcp, 1);
  if (n_sources > 1 && (r = bind_source(c, which)) != 0) {
    lg_conn_close(c);
    return r;
  }
  uv_connect_t *req = xrealloc(NULL, sizeof(*req));
  req->data = c;
  r = uv_tcp_connect(req, &c->tcp, (const struct sockaddr *)&server_addr, connect_cb);
  if (r != 0) {
    free(req);
    lg_conn_close(c);
  }
  return r;
}

/* A queued write owns a copy of the bytes the kernel did not take at once. */
typedef struct {
  uv_write_t req;
  lg_conn_t *conn;
  char data[];
} lg_write_t;

static void write_cb(uv_write_t *req, int status)
{
  lg_write_t *w = (lg_write_t *)req;
  lg_conn_t *c = w->conn;
  free(w);
  if (status != 0 && status != UV_ECANCELED) {
    lg_conn_errors++;
    lg_conn_close(c);
  }
  if (c->on_write != NULL && status != UV_ECANCELED)
    c->on_write(c, status);
}

/* Writes at once when the socket takes it all (the usual case: no request
 * object, no callback round); queues a copy of the rest otherwise. A reply
 * may arrive before a queued write's callback, so nothing per-connection is
 * reused between writes. */
static int send_buf(lg_conn_t *c, const char *base, size_t len)
{
  if (c->state != LG_OPEN)
    return UV_ENOTCONN;
  c->busy = 1;
  uv_buf_t b = uv_buf_init((char *)base, (unsigned)len);
  int r = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  if (r == (int)len) {
    if (c->on_write != NULL)
      c->on_write(c, 0);
    return 0;
  }
  if (r < 0 && r != UV_EAGAIN) {
    lg_conn_errors++;
    lg_conn_close(c);
    return r;
  }
  size_t done = r > 0 ? (size_t)r : 0;
  lg_write_t *w = xrealloc(NULL, sizeof(*w) + len - done);
  w->conn = c;
  memcpy(w->data, base + done, len - done);
  b = uv_buf_init(w->data, (unsigned)(len - done));
  r = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, write_cb);
  if (r != 0) {
    free(w);
    lg_conn_errors++;
    lg_conn_close(c);
  }
  return r;
}

int lg_conn_send(lg_conn_t *c, const char *buf, size_t len)
{
  return send_buf(c, buf, len);
}

int lg_conn_send_fixed(lg_conn_t *c)
{
  return send_buf(c, c->fixed, c->fixed_len);
}
