/* http.c -- HTTP/1.1 connections: parse, limit, time out, answer in order. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pilotlight/http.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"

#define container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#define READ_BUFFER_SIZE 65536
#define ARENA_KEEP_MAX 65536 /* a request arena larger than this is not kept */
#define LINGER_MS 2000
#define ACCEPT_BATCH 256    /* connections taken per wake-up, for fairness */
#define ACCEPT_PAUSE_MS 100 /* after an accept error that would persist */

/* The timer lists. Each has one timeout for all its members, so appending
 * keeps it sorted by deadline and expiry only looks at the head. A pending
 * connection (its answer not yet sent, e.g. a parked poll) is in none. */
enum { TL_NONE = 0, TL_REQUEST, TL_IDLE, TL_LINGER, TL_RESUME, TL__COUNT };

typedef struct {
    pl_conn *head, *tail;
} conn_list;

struct pl_conn {
    uv_tcp_t tcp;
    pl_h1 h1;
    pl_http *http;
    void *data;                /* the application's (a parked waiter) */
    pl_conn *lprev, *lnext;    /* in http->lists[list] */
    uint64_t since;            /* when it entered that list */
    pl_buf in;                 /* bytes received but not yet parsed */
    uint8_t list, tag, data_kind;
    unsigned pending : 1;      /* request handed over, not yet answered */
    unsigned in_parse : 1;     /* inside conn_execute() */
    unsigned finishing : 1;    /* last answer sent; shutting down */
    unsigned closing : 1;
    unsigned tuned : 1;        /* dead-peer detection is on */
};

struct pl_http {
    uv_loop_t *loop;
    uv_poll_t listener;      /* accepts on listen_fd; polled while listening */
    int listen_fd, spare_fd; /* spare_fd: given up to shed connections at EMFILE */
    uv_timer_t accept_timer; /* resumes accepting after ACCEPT_PAUSE_MS */
    uv_timer_t timer;
    uv_idle_t resume;
    uint64_t timer_due; /* when the armed timer fires */
    pl_http_limits limits;
    pl_h1_limits h1_limits;
    size_t max_queued; /* bytes one connection may have waiting to be sent */
    pl_http_callbacks cb;
    void *app;
    conn_list lists[TL__COUNT];
    uint64_t timeouts[TL__COUNT];
    uint64_t nconns;
    uint64_t peak; /* most connections since memory was last trimmed */
    uint64_t last_accept_error;
    uint64_t refused[PL_HTTP_REFUSED__COUNT];
    int listening, draining;
    void (*drained)(void *arg);
    void *drained_arg;
    char readbuf[READ_BUFFER_SIZE];
};

typedef struct {
    uv_write_t req;
    char data[];
} write_req;

static void conn_close(pl_conn *c);
static void conn_process_buffered(pl_conn *c);
static void timer_arm(pl_http *h, uint64_t due);
static void resume_cb(uv_idle_t *idle);
static void respond_own(pl_conn *c, int status, const char *msg);
static int start_listening(pl_http *h, int fd, uint16_t *bound_port);

/* ---- timer lists ---- */

static void list_remove(pl_conn *c)
{
    conn_list *l;

    if (c->list == TL_NONE)
        return;
    l = &c->http->lists[c->list];
    if (c->lprev)
        c->lprev->lnext = c->lnext;
    else
        l->head = c->lnext;
    if (c->lnext)
        c->lnext->lprev = c->lprev;
    else
        l->tail = c->lprev;
    c->lprev = c->lnext = NULL;
    c->list = TL_NONE;
}

static void list_add(pl_conn *c, uint8_t which)
{
    pl_http *h = c->http;
    conn_list *l = &h->lists[which];

    list_remove(c);
    c->list = which;
    c->since = uv_now(h->loop);
    c->lprev = l->tail;
    c->lnext = NULL;
    if (l->tail)
        l->tail->lnext = c;
    else
        l->head = c;
    l->tail = c;
    if (which == TL_RESUME)
        uv_idle_start(&h->resume, resume_cb);
    else
        timer_arm(h, c->since + h->timeouts[which]);
}

static void expire_one(pl_conn *c)
{
    if (c->list == TL_REQUEST && c->h1.in_msg)
        respond_own(c, 408, "request not received in time");
    else
        conn_close(c);
}

static void timer_cb(uv_timer_t *t)
{
    pl_http *h = container_of(t, pl_http, timer);
    uint64_t now = uv_now(h->loop), next = UINT64_MAX;

    h->timer_due = 0;
    for (int i = TL_REQUEST; i <= TL_LINGER; i++) {
        conn_list *l = &h->lists[i];
        while (l->head && l->head->since + h->timeouts[i] <= now)
            expire_one(l->head); /* always leaves the list */
        if (l->head && l->head->since + h->timeouts[i] < next)
            next = l->head->since + h->timeouts[i];
    }
    if (next != UINT64_MAX)
        timer_arm(h, next);
}

static void timer_arm(pl_http *h, uint64_t due)
{
    uint64_t now = uv_now(h->loop);

    if (h->timer_due != 0 && h->timer_due <= due)
        return;
    h->timer_due = due;
    uv_timer_start(&h->timer, timer_cb, due > now ? due - now : 0, 0);
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status)
{
    pl_conn *c = container_of(req->handle, pl_conn, tcp);

    pl_free(container_of(req, write_req, req));
    if (status < 0)
        conn_close(c);
}

/* Writes <bufs>, copying what the socket cannot take now. Returns 0, or -1
 * when the connection failed (it is then closing). */
static int conn_write(pl_conn *c, const uv_buf_t *bufs, unsigned n)
{
    size_t total = 0, skip, rest;
    write_req *w;
    uv_buf_t b;
    char *p;
    int r;

    if (c->closing)
        return -1;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    r = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    if (r == UV_EAGAIN)
        r = 0;
    if (r < 0) {
        conn_close(c);
        return -1;
    }
    if ((size_t)r == total)
        return 0;
    skip = (size_t)r;
    rest = total - skip;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + rest >
        c->http->max_queued) {
        /* A client that does not read must not make us hold its answers:
         * drop it, as if it had gone. */
        PL_LOG(PL_LOG_DEBUG, "client not reading: connection dropped", NULL);
        pl_conn_abort(c);
        return -1;
    }
    w = pl_malloc(sizeof(*w) + rest);
    if (w == NULL) {
        conn_close(c);
        return -1;
    }
    p = w->data;
    for (unsigned i = 0; i < n; i++) {
        size_t len = bufs[i].len, off = skip < len ? skip : len;
        memcpy(p, bufs[i].base + off, len - off);
        p += len - off;
        skip -= off;
    }
    b = uv_buf_init(w->data, (unsigned)rest);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
        pl_free(w);
        conn_close(c);
        return -1;
    }
    return 0;
}

static const char *reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    pl_conn *c = container_of(req->handle, pl_conn, tcp);

    pl_free(req);
    if (status < 0)
        conn_close(c);
}

/* The last answer is queued: send FIN after it, then keep reading (and
 * dropping) until the client closes or LINGER_MS pass, so a client still
 * sending is not answered with a reset that could destroy our answer. */
static void conn_finish(pl_conn *c)
{
    uv_shutdown_t *req;

    if (c->finishing || c->closing)
        return;
    c->finishing = 1;
    req = pl_malloc(sizeof(*req));
    if (req == NULL ||
        uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        pl_free(req);
        conn_close(c);
        return;
    }
    list_add(c, TL_LINGER);
}

/* Appends <s> to the head being built at *p; every answer's head is built
 * this way, without printf, on the hot path. */
static void put(char **p, const char *s)
{
    size_t n = strlen(s);

    memcpy(*p, s, n);
    *p += n;
}

static void put_uint(char **p, size_t v)
{
    char digits[24];
    int n = 0;

    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) > 0);
    while (n > 0)
        *(*p)++ = digits[--n];
}

int pl_conn_respond(pl_conn *c, int status, const char *content_type,
                    const char *extra_headers, const char *body, size_t len)
{
    pl_http *h = c->http;
    /* status line, the longest reason, three fixed headers, digits: the
     * content type and extra headers are the server's own short strings */
    char head[512], *p = head;
    uv_buf_t bufs[2];
    int keep = c->h1.keep_alive && !h->draining;

    if (c->closing || c->finishing)
        return -1;
    put(&p, "HTTP/1.1 ");
    put_uint(&p, (size_t)status);
    *p++ = ' ';
    put(&p, reason(status));
    put(&p, "\r\n");
    if (content_type) {
        put(&p, "Content-Type: ");
        put(&p, content_type);
        put(&p, "\r\n");
    }
    if (extra_headers)
        put(&p, extra_headers);
    if (!keep)
        put(&p, "Connection: close\r\n");
    if (status != 204 && status >= 200) {
        put(&p, "Content-Length: ");
        put_uint(&p, len);
        put(&p, "\r\n");
    }
    put(&p, "\r\n");
    bufs[0] = uv_buf_init(head, (unsigned)(p - head));
    bufs[1] = uv_buf_init((char *)body, (unsigned)len);
    c->pending = 0;
    if (conn_write(c, bufs, len > 0 && !c->h1.head ? 2 : 1) != 0)
        return -1;
    if (h->cb.on_response)
        h->cb.on_response(h->app, c->tag, status);
    if (!keep)
        conn_finish(c);
    else if (c->in.len > 0 && !c->in_parse)
        list_add(c, TL_RESUME);
    else
        list_add(c, TL_IDLE);
    return 0;
}

/* Answers with an error of the server's own and closes after it. */
static void respond_own(pl_conn *c, int status, const char *msg)
{
    char body[160];
    int n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}", msg);

    c->h1.keep_alive = 0;
    c->tag = 0;
    pl_conn_respond(c, status, "application/json", NULL, body, (size_t)n);
}

/* ---- the request path ---- */

static void on_begin(void *owner)
{
    pl_conn *c = owner;

    c->tag = 0;
    list_add(c, TL_REQUEST);
}

static int on_headers(void *owner, int send_continue)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    pl_conn *c = owner;
    uv_buf_t b = uv_buf_init((char *)cont, sizeof(cont) - 1);

    if (send_continue && conn_write(c, &b, 1) != 0)
        return -1;
    list_add(c, TL_REQUEST); /* a fresh deadline for the body */
    return 0;
}

static const pl_h1_events h1_events = {on_begin, on_headers};

static void conn_dispatch(pl_conn *c)
{
    pl_http *h = c->http;
    pl_request req;

    pl_h1_request(&c->h1, &req);
    list_remove(c);
    c->pending = 1;
    h->cb.on_request(h->app, c, &req);
    /* A parked poll keeps no request bytes; nor does an idle connection
     * after one large body. */
    if (c->pending || c->h1.arena.cap > ARENA_KEEP_MAX)
        pl_h1_release(&c->h1);
}

/* Parses <len> bytes at <data>. Returns how many were used: fewer when a
 * request went pending (the rest waits for its answer) or the connection
 * ended. */
static size_t conn_execute(pl_conn *c, const char *data, size_t len)
{
    size_t off = 0, used;

    c->in_parse = 1;
    while (off < len && !c->pending && !c->closing && !c->finishing) {
        pl_h1_result r = pl_h1_execute(&c->h1, data + off, len - off, &used);
        off += used;
        if (r == PL_H1_REQUEST) {
            conn_dispatch(c);
        } else if (r == PL_H1_ERROR) {
            PL_LOG(PL_LOG_DEBUG, "bad request", "\"status\":%d", c->h1.err_status);
            if (c->h1.err_status == 0)
                conn_close(c);
            else
                respond_own(c, c->h1.err_status, c->h1.err_msg);
            off = len;
        }
    }
    c->in_parse = 0;
    return off;
}

static void in_consume(pl_conn *c, size_t used)
{
    c->in.len -= (uint32_t)used;
    if (c->in.len == 0)
        pl_buf_free(&c->in);
    else
        memmove(c->in.data, c->in.data + used, c->in.len);
}

static void conn_process_buffered(pl_conn *c)
{
    size_t used = conn_execute(c, c->in.data, c->in.len);

    if (!c->closing)
        in_consume(c, used);
}

static void resume_cb(uv_idle_t *idle)
{
    pl_http *h = container_of(idle, pl_http, resume);
    conn_list *l = &h->lists[TL_RESUME];

    while (l->head) {
        pl_conn *c = l->head;
        list_add(c, TL_IDLE); /* until its next request begins */
        conn_process_buffered(c);
    }
    uv_idle_stop(idle);
}

static void alloc_cb(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    pl_conn *c = container_of(handle, pl_conn, tcp);

    (void)suggested;
    *buf = uv_buf_init(c->http->readbuf, READ_BUFFER_SIZE);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pl_conn *c = container_of(s, pl_conn, tcp);
    size_t used;

    if (nread < 0) {
        conn_close(c); /* EOF or error: a parked poll settles as disconnect */
        return;
    }
    if (nread == 0 || c->finishing || c->closing)
        return; /* lingering: drop what arrives */
    if (c->pending || c->in.len > 0) {
        /* Pipelined behind an unanswered request: keep it, bounded. */
        if ((c->pending && c->in.len + (size_t)nread > c->http->limits.max_header_bytes) ||
            pl_buf_append(&c->in, buf->base, (size_t)nread) != 0) {
            conn_close(c);
            return;
        }
        if (!c->pending && c->list != TL_RESUME)
            conn_process_buffered(c);
        return;
    }
    used = conn_execute(c, buf->base, (size_t)nread);
    if (used < (size_t)nread && !c->closing && !c->finishing &&
        pl_buf_append(&c->in, buf->base + used, (size_t)nread - used) != 0)
        conn_close(c);
}

/* ---- connections ---- */

static void on_closed(uv_handle_t *handle)
{
    pl_conn *c = container_of(handle, pl_conn, tcp);
    pl_http *h = c->http;

    pl_buf_free(&c->in);
    pl_h1_release(&c->h1);
    pl_free(c);
    h->nconns--;
    if (h->peak >= 1024 && h->nconns < h->peak / 2) {
        /* Half of a large crowd has gone: give its memory back to the
         * system, so RSS follows what is parked instead of its peak. */
        h->peak = h->nconns;
        malloc_trim(0);
    }
    if (h->draining && h->nconns == 0 && h->drained)
        h->drained(h->drained_arg);
}

static void conn_close(pl_conn *c)
{
    pl_http *h = c->http;

    if (c->closing)
        return;
    c->closing = 1;
    list_remove(c);
    if (c->data != NULL && h->cb.on_close)
        h->cb.on_close(h->app, c);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void pl_conn_close(pl_conn *c)
{
    conn_close(c);
}

void pl_conn_set_tag(pl_conn *c, unsigned tag)
{
    c->tag = (uint8_t)tag;
}

void pl_conn_abort(pl_conn *c)
{
    struct linger lg = {1, 0};
    uv_os_fd_t fd;

    if (c->closing)
        return;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    conn_close(c);
}

int pl_conn_acknowledged(const pl_conn *c)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    uv_os_fd_t fd;
    int outq = 0;

    /* Not c->closing: on_close asks this while the descriptor is open. */
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return -1;
    if (ti.tcpi_state != TCP_ESTABLISHED && ti.tcpi_state != TCP_CLOSE_WAIT)
        return -1;
    if (uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 ||
        ioctl(fd, SIOCOUTQ, &outq) != 0)
        return 0;
    return outq == 0;
}

void pl_conn_detect_dead_peer(pl_conn *c, unsigned idle_s, unsigned interval_s,
                              unsigned count, unsigned user_timeout_ms)
{
    uv_os_fd_t fd;
    int on = 1, v;

    if (c->tuned || uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return;
    c->tuned = 1;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    if ((v = (int)idle_s) > 0)
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, sizeof(v));
    if ((v = (int)interval_s) > 0)
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &v, sizeof(v));
    if ((v = (int)count) > 0)
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &v, sizeof(v));
    if ((v = (int)user_timeout_ms) > 0)
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, sizeof(v));
}

void *pl_conn_app(const pl_conn *c)
{
    return c->http->app;
}

void pl_conn_set_data(pl_conn *c, void *data, unsigned kind)
{
    c->data = data;
    c->data_kind = data ? (uint8_t)kind : 0;
}

void *pl_conn_data(const pl_conn *c, unsigned *kind)
{
    *kind = c->data_kind;
    return c->data;
}

size_t pl_conn_size(void)
{
    return sizeof(pl_conn);
}

/* A new connection of <h>, its handle initialised but not yet open; the
 * accept and adoption paths both make connections here. NULL when out of
 * memory. */
static pl_conn *conn_new(pl_http *h)
{
    pl_conn *c = pl_malloc(sizeof(*c));

    if (c == NULL)
        return NULL;
    memset(c, 0, sizeof(*c));
    c->http = h;
    uv_tcp_init(h->loop, &c->tcp);
    if (++h->nconns > h->peak)
        h->peak = h->nconns;
    return c;
}

/* <c>'s socket is open: parse from now on, in timer list <list>. */
static void conn_start(pl_conn *c, uint8_t list)
{
    c->tcp.data = c->http; /* marks it as one of ours for close_walk() */
    pl_h1_init(&c->h1, &c->http->h1_limits, &h1_events, c);
    uv_tcp_nodelay(&c->tcp, 1);
    if (list != TL_NONE)
        list_add(c, list);
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) != 0)
        conn_close(c);
}

/* Takes the accepted socket <fd> as a new connection. */
static void conn_open(pl_http *h, int fd)
{
    pl_conn *c = conn_new(h);

    if (c == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory accepting a connection", NULL);
        close(fd);
        return;
    }
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        conn_close(c);
        return;
    }
    conn_start(c, TL_REQUEST);
    if (c->closing) {
        return;
    } else if (h->draining) {
        respond_own(c, 503, "too many connections");
    } else if (h->nconns > h->limits.max_connections) {
        h->refused[PL_HTTP_REFUSED_MAX_CONNECTIONS]++;
        respond_own(c, 503, "too many connections");
    }
}

static void accept_cb(uv_poll_t *p, int status, int events);

static void accept_resume(uv_timer_t *t)
{
    pl_http *h = container_of(t, pl_http, accept_timer);

    if (h->listening)
        uv_poll_start(&h->listener, UV_READABLE, accept_cb);
}

/* The listener stays readable while the cause lasts: wait instead of
 * waking up for it again and again. */
static void accept_pause(pl_http *h)
{
    uv_poll_stop(&h->listener);
    uv_timer_start(&h->accept_timer, accept_resume, ACCEPT_PAUSE_MS, 0);
}

/* Out of descriptors with connections waiting. The spare descriptor is given
 * up to accept each of them and close it at once: its client hears "no" now
 * instead of hanging in the backlog, and the listener does not wake the loop
 * again and again for connections it cannot take. With no spare to give
 * (a system-wide shortage took it), accepting pauses briefly instead. */
static void shed(pl_http *h, int cause)
{
    uint64_t now = uv_now(h->loop), before = h->refused[PL_HTTP_REFUSED_FD_LIMIT];
    int fd, err = cause, n = 0;

    if (h->spare_fd >= 0) {
        close(h->spare_fd);
        /* Bounded like accepting: what is left wakes the loop again. */
        while (n++ < ACCEPT_BATCH &&
               ((fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0 ||
                errno == EINTR || errno == ECONNABORTED)) {
            if (fd >= 0) {
                close(fd);
                h->refused[PL_HTTP_REFUSED_FD_LIMIT]++;
            }
        }
        err = n > ACCEPT_BATCH ? EAGAIN : errno;
        h->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if ((err != EAGAIN && err != EWOULDBLOCK) || h->spare_fd < 0)
        accept_pause(h);
    if (now - h->last_accept_error >= 1000) {
        h->last_accept_error = now;
        PL_LOG(PL_LOG_WARN, "out of file descriptors: connections refused",
               "\"refused\":%llu,\"error\":\"%s\"",
               (unsigned long long)(h->refused[PL_HTTP_REFUSED_FD_LIMIT] - before),
               strerror(cause));
    }
}

static void accept_cb(uv_poll_t *p, int status, int events)
{
    pl_http *h = container_of(p, pl_http, listener);

    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < ACCEPT_BATCH && h->listening; i++) {
        int fd = accept4(h->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(h, fd);
        } else if (errno == EMFILE || errno == ENFILE) {
            shed(h, errno);
            return;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return; /* none left */
        } else if (errno != EINTR && errno != ECONNABORTED && errno != EPROTO) {
            PL_LOG(PL_LOG_WARN, "accept failed", "\"error\":\"%s\"", strerror(errno));
            accept_pause(h); /* ENOMEM, ENOBUFS: a while may help */
            return;
        }
    }
}

/* ---- adoption (a binary upgrade hands connections over) ---- */

pl_conn *pl_http_adopt(pl_http *h, int fd, int parked, int keep_alive)
{
    pl_conn *c = conn_new(h);

    if (c == NULL) {
        close(fd);
        return NULL;
    }
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        conn_close(c);
        return NULL;
    }
    c->pending = parked != 0;
    c->tuned = parked != 0; /* the socket options came with the socket */
    conn_start(c, parked ? TL_NONE : TL_IDLE);
    if (c->closing)
        return NULL;
    c->h1.keep_alive = keep_alive != 0;
    return c;
}

int pl_http_adopt_listener(pl_http *h, int fd, uint16_t *bound_port)
{
    return start_listening(h, fd, bound_port);
}

int pl_http_listener_fd(const pl_http *h)
{
    return h->listening ? h->listen_fd : -1;
}

int pl_conn_handover_fd(const pl_conn *c)
{
    uv_os_fd_t fd;

    /* Bytes still queued here would be lost with our descriptor. */
    if (c->closing || c->finishing || c->in.len > 0 || c->h1.in_msg ||
        uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 ||
        uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return -1;
    return fd;
}

int pl_conn_keep_alive(const pl_conn *c)
{
    return c->h1.keep_alive;
}

size_t pl_http_each_idle(pl_http *h, void (*fn)(pl_conn *c, void *arg), void *arg)
{
    static const uint8_t which[] = {TL_IDLE, TL_REQUEST};
    size_t n = 0;

    for (size_t i = 0; i < sizeof(which); i++)
        for (pl_conn *c = h->lists[which[i]].head; c; c = c->lnext)
            if (c->data == NULL && pl_conn_handover_fd(c) >= 0) {
                fn(c, arg);
                n++;
            }
    return n;
}

/* ---- the server ---- */

void pl_http_set_limits(pl_http *h, const pl_http_limits *limits)
{
    h->limits = *limits;
    h->timeouts[TL_REQUEST] = limits->header_timeout_ms;
    h->timeouts[TL_IDLE] = limits->idle_timeout_ms;
    h->timeouts[TL_LINGER] = LINGER_MS;
    h->h1_limits.max_header_bytes = limits->max_header_bytes;
    h->h1_limits.max_url_bytes = limits->max_url_bytes;
    h->h1_limits.max_body_bytes = limits->max_body_bytes;
    /* Room for two answers carrying a largest payload each. */
    h->max_queued = 2 * (size_t)limits->max_body_bytes + 65536;
    /* Every member of a list gets the list's new timeout: the lists stay
     * sorted, only the timer may now be due earlier. */
    for (int i = TL_REQUEST; i <= TL_LINGER; i++)
        if (h->lists[i].head)
            timer_arm(h, h->lists[i].head->since + h->timeouts[i]);
}

pl_http *pl_http_new(uv_loop_t *loop, const pl_http_limits *limits,
                     const pl_http_callbacks *cb, void *app)
{
    pl_http *h = pl_malloc(sizeof(*h));

    if (h == NULL)
        return NULL;
    memset(h, 0, offsetof(pl_http, readbuf));
    h->loop = loop;
    h->cb = *cb;
    h->app = app;
    pl_http_set_limits(h, limits);
    h->listen_fd = h->spare_fd = -1;
    uv_timer_init(loop, &h->timer);
    uv_timer_init(loop, &h->accept_timer);
    uv_idle_init(loop, &h->resume);
    return h;
}

/* Opens a listening socket on <sa>. Returns it, or a negative errno. */
static int listen_socket(const struct sockaddr *sa, socklen_t len)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), on = 1;

    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, sa, len) != 0 || listen(fd, 4096) != 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

/* Accepts on the listening socket <fd> from now on (it is <h>'s to close).
 * Accepting is done here rather than by uv_listen(): at EMFILE libuv sheds
 * the waiting connections without telling its caller, and they are counted
 * here. Returns 0 and sets *bound_port, or a negative errno (as libuv's
 * errors are on Unix). */
static int start_listening(pl_http *h, int fd, uint16_t *bound_port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int rc;

    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || listen(fd, 4096) != 0)
        rc = -errno;
    else
        rc = uv_poll_init_socket(h->loop, &h->listener, fd);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    h->listen_fd = fd;
    h->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    h->listening = 1;
    uv_poll_start(&h->listener, UV_READABLE, accept_cb);
    *bound_port = ntohs(ss.ss_family == AF_INET
                            ? ((struct sockaddr_in *)&ss)->sin_port
                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

int pl_http_listen(pl_http *h, const char *host, uint16_t port,
                   uint16_t *bound_port)
{
    struct sockaddr_storage ss;
    int rc, fd;

    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        (rc = uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss)) != 0)
        return rc;
    fd = listen_socket((const struct sockaddr *)&ss, ss.ss_family == AF_INET
                                                       ? sizeof(struct sockaddr_in)
                                                       : sizeof(struct sockaddr_in6));
    return fd < 0 ? fd : start_listening(h, fd, bound_port);
}

static void close_listener(pl_http *h)
{
    h->listening = 0;
    if (h->listen_fd < 0)
        return;
    if (!uv_is_closing((uv_handle_t *)&h->listener))
        uv_close((uv_handle_t *)&h->listener, NULL);
    close(h->listen_fd); /* safe at once: uv_close stopped polling it */
    h->listen_fd = -1;
    if (h->spare_fd >= 0)
        close(h->spare_fd);
    h->spare_fd = -1;
}

void pl_http_drain(pl_http *h, void (*done)(void *arg), void *arg)
{
    conn_list *idle = &h->lists[TL_IDLE], *req = &h->lists[TL_REQUEST];
    pl_conn *c, *next;

    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
    close_listener(h);
    while (idle->head)
        conn_close(idle->head);
    for (c = req->head; c; c = next) {
        next = c->lnext;
        if (!c->h1.in_msg)
            conn_close(c);
    }
    if (h->nconns == 0 && done)
        done(arg);
}

static void close_walk(uv_handle_t *handle, void *arg)
{
    pl_http *h = arg;

    if (handle->type == UV_TCP && handle->data == h && !uv_is_closing(handle))
        conn_close(container_of(handle, pl_conn, tcp));
}

void pl_http_close_all(pl_http *h)
{
    uv_walk(h->loop, close_walk, h);
}

void pl_http_stop(pl_http *h)
{
    close_listener(h);
    uv_close((uv_handle_t *)&h->accept_timer, NULL);
    uv_close((uv_handle_t *)&h->timer, NULL);
    uv_close((uv_handle_t *)&h->resume, NULL);
}

void pl_http_free(pl_http *h)
{
    if (h != NULL)
        close_listener(h); /* a failed start closed its handle, not its socket */
    pl_free(h); /* NULL is fine */
}

int pl_http_listening(const pl_http *h)
{
    return h->listening;
}

uint64_t pl_http_connections(const pl_http *h)
{
    return h->nconns;
}

uint64_t pl_http_refused(const pl_http *h, unsigned reason)
{
    return reason < PL_HTTP_REFUSED__COUNT ? h->refused[reason] : 0;
}
