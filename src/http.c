/* http.c -- HTTP/1.1 connections: parse, limit, time out, answer in order. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utlist.h>

#include "pilotlight/http.h"
#include "pilotlight/invariant.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"
#include "pilotlight/pool.h"
#include "pilotlight/uvmem.h"

#define container_of(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#define READ_BUFFER_SIZE 65536
#define LINGER_MS 2000
#define ACCEPT_BATCH 32 /* per wake-up: fairness, and a backlog is not all held at once */
#define ACCEPT_PAUSE_MS 100 /* after an accept error that would persist */
/* Pool memory goes back to the system when the open connections fall to an
 * eighth of their peak since the last time, and that peak was at least
 * this (a handful of connections coming and going does not trim); then at
 * every lower count on the way down, so a crowd that has gone leaves no
 * page behind whatever order its last connections close in. */
#define TRIM_MIN_PEAK 16
#define TRIM_FRACTION 8

/* Counts ACK report offsets from the bytes written when reports were turned
 * on (Linux 6.2+), not from the bytes acknowledged then: our own count of
 * bytes written then matches the kernel's. */
#ifndef SOF_TIMESTAMPING_OPT_ID_TCP
#define SOF_TIMESTAMPING_OPT_ID_TCP (1 << 16)
#endif

/* The timer lists. Each has one timeout for all its members, so appending
 * keeps it sorted by deadline and expiry only looks at the head. A pending
 * connection (its answer not yet sent, e.g. a parked poll) is in none. */
enum { TL_NONE = 0, TL_REQUEST, TL_IDLE, TL_LINGER, TL_RESUME, TL__COUNT };

/* A connection holds only what outlives a request: a parked poll costs its
 * socket, this and its waiter. The parser state and the request's bytes
 * live in a pooled pl_h1 from the request's first byte to its dispatch. */
struct pl_conn {
    uv_tcp_t tcp;
    pl_h1 *h1;                 /* the request being read; NULL between */
    void *data;                /* its owner's object (a parked waiter, say) */
    pl_conn *lprev, *lnext;    /* in http->lists[list] (utlist) */
    pl_buf in;                 /* bytes received but not yet parsed */
    /* When it entered that list, in loop milliseconds modulo 2^32: list
     * timeouts are far shorter, and a parked poll is 8 bytes smaller. */
    uint32_t since;
    unsigned list : 3, tag : 8, owner : 3; /* owner: its index in owners[] */
    unsigned pending : 1;      /* request handed over, not yet answered */
    unsigned in_parse : 1;     /* inside conn_execute() */
    unsigned finishing : 1;    /* last answer sent; shutting down */
    unsigned closing : 1;
    unsigned tuned : 1;        /* dead-peer detection is on */
    unsigned keep_alive : 1;   /* of the request being answered */
    unsigned head : 1;         /* that request is a HEAD */
    unsigned acks : 2;         /* ACK reports: ACKS_OFF, ACKS_ON, ACKS_REFUSED[_NEW] */
    unsigned ack_waiting : 1;  /* PL_CONN_EV_ACKED is due at ack_want */
    /* Its ACKs come with its next request, which says as much as a report
     * would: its writes ask for none, saving a recvmsg() and libuv's
     * EPOLL_CTL_MOD per delivery. */
    unsigned acks_ride : 1;
    unsigned acks_skip : 1;    /* its next write asks for none (pl_conn_skip_ack_report) */
    unsigned reported : 1;     /* the last byte written asked for a report */
    unsigned eof_holds : 1;    /* a half-close leaves the pending request be */
    unsigned peer_eof : 1;     /* the peer half-closed: answer, then close */
    unsigned peer_reset : 1;   /* closing because the peer reset it */
    unsigned held : 1;         /* its owner holds it open (pl_conn_hold) */
    unsigned ended : 2;        /* a held connection's end: PL_CONN_END_* */
    uint32_t out_bytes;        /* bytes ever given to conn_write, mod 2^32 */
    uint32_t ack_origin;       /* out_bytes in the kernel when reports began */
    uint32_t ack_want;         /* report offset that fires PL_CONN_EV_ACKED */
};

/* ACKS_REFUSED_NEW: refused by a write, not yet told by pl_conn_expect_ack. */
enum { ACKS_OFF = 0, ACKS_ON, ACKS_REFUSED, ACKS_REFUSED_NEW };

/* Accepting is done here rather than by uv_listen(): at EMFILE libuv sheds
 * the waiting connections without telling its caller, and they are counted
 * here (see shed()). */
typedef struct {
    uv_poll_t poll; /* on fd, while listening */
    int fd;         /* -1 once closed */
    pl_http *http;
} listener;

struct pl_http {
    uv_loop_t *loop;
    listener listeners[PL_HTTP_LISTENERS_MAX];
    int nlisteners; /* initialised so far; each is closed once */
    uv_timer_t timer;
    uv_idle_t resume;
    uv_prepare_t trim;  /* gives pool memory back before the loop waits */
    uint64_t timer_due; /* when the armed timer fires */
    pl_http_limits limits;
    pl_h1_limits h1_limits;
    size_t max_queued; /* bytes one connection may have waiting to be sent */
    pl_http_callbacks cb;
    void *app;
    pl_conn *lists[TL__COUNT];
    uint64_t timeouts[TL__COUNT];
    uint64_t nconns;
    uint64_t peak; /* most connections since memory was last trimmed */
    uint64_t low;  /* connections at that trim (0 before any) */
    uint64_t last_accept_error;
    /* Loop times of the last two reads a millisecond apart or more: bytes
     * read now arrived after the poll that returned the earlier one. */
    uint64_t read_ms, prev_read_ms;
    uint64_t refused[PL_HTTP_REFUSED__COUNT];
    int spare_fd;            /* given up to shed connections at EMFILE */
    uv_timer_t accept_timer; /* resumes accepting after ACCEPT_PAUSE_MS */
    int listening, draining;
    void (*drained)(void *arg);
    void *drained_arg;
    char readbuf[READ_BUFFER_SIZE];
};

/* A connection's server is its handle's data: a parked poll is 8 bytes
 * smaller than with a field of its own. */
static pl_http *conn_http(const pl_conn *c)
{
    return c->tcp.data;
}

/* The kinds of owner connections have, each with what it does when one of
 * its connections ends: a connection keeps the index, 3 bits, not a
 * pointer. Slot 0 is "no owner". */
#define OWNERS_MAX 8
static const pl_conn_owner *owners[OWNERS_MAX];

static pl_pool conn_pool = PL_POOL_INIT("conn", sizeof(pl_conn));
static pl_pool request_pool = PL_POOL_INIT("request", sizeof(pl_h1));

typedef struct {
    uv_write_t req;
    size_t size; /* for pl_pool_free() */
    char data[];
} write_req;

static void conn_close(pl_conn *c);
static void conn_event(pl_conn *c, int ev);
static void held_end(pl_conn *c, ssize_t nread);
static void conn_drain_idle(pl_conn *c);
static void conn_process_buffered(pl_conn *c);
static void timer_arm(pl_http *h, uint64_t due);
static void resume_cb(uv_idle_t *idle);
static void trim_cb(uv_prepare_t *prep);
static void request_end(pl_conn *c);
static void respond_own(pl_conn *c, int status, const char *msg);
static listener *listener_new(pl_http *h);
static int listener_start(listener *l, int fd, uint16_t *bound_port);

/* ---- timer lists ---- */

static void list_remove(pl_conn *c)
{
    if (c->list == TL_NONE)
        return;
    DL_DELETE2(conn_http(c)->lists[c->list], c, lprev, lnext);
    c->list = TL_NONE;
}

static void list_add(pl_conn *c, uint8_t which)
{
    pl_http *h = conn_http(c);
    uint64_t now = uv_now(h->loop);

    list_remove(c);
    c->list = which;
    c->since = (uint32_t)now;
    DL_APPEND2(h->lists[which], c, lprev, lnext);
    if (which == TL_RESUME)
        uv_idle_start(&h->resume, resume_cb);
    else
        timer_arm(h, now + h->timeouts[which]);
}

static void expire_one(pl_conn *c)
{
    if (c->list == TL_REQUEST && c->h1 != NULL && c->h1->in_msg) {
        request_end(c);
        respond_own(c, 408, "request not received in time");
    }
    else
        conn_close(c);
}

/* When list <i>'s head (there is one) is due, seen at <now>. */
static uint64_t list_due(const pl_http *h, int i, uint64_t now)
{
    uint64_t waited = (uint32_t)now - h->lists[i]->since;

    return waited < h->timeouts[i] ? now + h->timeouts[i] - waited : now;
}

static void timer_cb(uv_timer_t *t)
{
    pl_http *h = container_of(t, pl_http, timer);
    uint64_t now = uv_now(h->loop), next = UINT64_MAX;

    h->timer_due = 0;
    for (int i = TL_REQUEST; i <= TL_LINGER; i++) {
        pl_conn **head = &h->lists[i];
        while (*head && (uint32_t)now - (*head)->since >= h->timeouts[i])
            expire_one(*head); /* always leaves the list */
        if (*head && list_due(h, i, now) < next)
            next = list_due(h, i, now);
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
    write_req *w = container_of(req, write_req, req);

    pl_pool_free(w, w->size);
    if (status < 0 && c->held && !c->closing && !c->ended)
        held_end(c, status == UV_EPIPE ? UV_ECONNRESET : status);
    else if (status < 0)
        conn_close(c);
}

/* As uv_try_write() for <n> (at most 2) buffers while nothing is queued,
 * asking the kernel for a report when the peer has acknowledged the last
 * byte: per write, so writes not asking cost nothing. Returns the bytes
 * written, UV_EAGAIN, or a negative error. */
static int conn_try_write_reported(pl_conn *c, const uv_buf_t *bufs, unsigned n)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl = {{0}}; /* its padding goes to the kernel too */
    struct iovec iov[2];
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = n,
                         .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    int tx_ack = SOF_TIMESTAMPING_TX_ACK;
    uv_os_fd_t fd;
    ssize_t r;

    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return UV_EBADF;
    for (unsigned i = 0; i < n; i++)
        iov[i] = (struct iovec){bufs[i].base, bufs[i].len};
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SO_TIMESTAMPING;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &tx_ack, sizeof(tx_ack));
    do
        r = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r >= 0)
        return (int)r;
    if (errno == EINVAL) {
        /* A kernel taking the option but not the per-write request. */
        c->acks = ACKS_REFUSED_NEW;
        c->reported = 0;
        return uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    }
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS ? UV_EAGAIN : -errno;
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
    c->out_bytes += (uint32_t)total;
    /* Queued bytes go first, and the rest after them, unreported. */
    c->reported = c->acks == ACKS_ON && !c->acks_ride && !c->acks_skip && n <= 2 &&
                  uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0;
    c->acks_skip = 0;
    if (c->reported)
        r = conn_try_write_reported(c, bufs, n);
    else
        r = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    if (r == UV_EAGAIN)
        r = 0;
    if (r < 0) {
        conn_close(c);
        return -1;
    }
    if ((size_t)r == total)
        return 0;
    c->reported = 0; /* its last byte goes out later, unreported */
    skip = (size_t)r;
    rest = total - skip;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + rest >
        conn_http(c)->max_queued) {
        /* A client that does not read must not make us hold its answers:
         * drop it, as if it had gone. */
        PL_LOG(PL_LOG_DEBUG, "client not reading: connection dropped", NULL);
        pl_conn_abort(c);
        return -1;
    }
    w = pl_pool_alloc(sizeof(*w) + rest, NULL);
    if (w == NULL) {
        conn_close(c);
        return -1;
    }
    w->size = sizeof(*w) + rest;
    p = w->data;
    for (unsigned i = 0; i < n; i++) {
        size_t len = bufs[i].len, off = skip < len ? skip : len;
        memcpy(p, bufs[i].base + off, len - off);
        p += len - off;
        skip -= off;
    }
    b = uv_buf_init(w->data, (unsigned)rest);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
        pl_pool_free(w, w->size);
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

    pl_pool_free(req, sizeof(*req));
    if (c->held) {
        /* its owner closes it; a failure ends it as a reset would */
        if (status < 0 && !c->ended && !c->closing)
            held_end(c, UV_ECONNRESET);
        return;
    }
    if (status < 0 || c->peer_eof)
        conn_close(c); /* a half-closed peer sends nothing to linger for */
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
    req = pl_pool_alloc(sizeof(*req), NULL);
    if (req == NULL ||
        uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) != 0) {
        pl_pool_free(req, sizeof(*req));
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
    pl_http *h = conn_http(c);
    /* status line, the longest reason, three fixed headers, digits: the
     * content type and extra headers are the server's own short strings */
    char head[512], *p = head;
    uv_buf_t bufs[2];
    /* A half-closed peer's pipelined requests are still answered. */
    int keep = c->keep_alive && !h->draining && !(c->peer_eof && c->in.len == 0);

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
    if (conn_write(c, bufs, len > 0 && !c->head ? 2 : 1) != 0)
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

    c->keep_alive = 0;
    c->tag = 0;
    pl_conn_respond(c, status, "application/json", NULL, body, (size_t)n);
}

/* ---- the request path ---- */

static void on_begin(void *owner)
{
    pl_conn *c = owner;

    c->tag = 0;
    c->keep_alive = c->head = c->eof_holds = 0; /* until this request is read */
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

/* "A request": a parser from the request pool, for the bytes to come.
 * Returns 0, or -1 when out of memory. */
static int request_begin(pl_conn *c)
{
    c->h1 = pl_pool_get(&request_pool);
    if (c->h1 == NULL)
        return -1;
    pl_h1_init(c->h1, &conn_http(c)->h1_limits, &h1_events, c);
    return 0;
}

/* The request has been handed over or failed: its parser and bytes go back
 * (a parked poll keeps none of them). */
static void request_end(pl_conn *c)
{
    if (c->h1 == NULL)
        return;
    pl_h1_release(c->h1);
    pl_pool_put(&request_pool, c->h1);
    c->h1 = NULL;
}

static void conn_dispatch(pl_conn *c)
{
    pl_http *h = conn_http(c);
    pl_request req;

    pl_h1_request(c->h1, &req);
    c->keep_alive = c->h1->keep_alive;
    c->head = c->h1->head;
    list_remove(c);
    c->pending = 1;
    h->cb.on_request(h->app, c, &req);
    request_end(c);
}

/* Parses <len> bytes at <data>. Returns how many were used: fewer when a
 * request went pending (the rest waits for its answer) or the connection
 * ended. */
static size_t conn_execute(pl_conn *c, const char *data, size_t len)
{
    size_t off = 0, used;

    c->in_parse = 1;
    while (off < len && !c->pending && !c->closing && !c->finishing) {
        pl_h1_result r;
        if (c->h1 == NULL && request_begin(c) != 0) {
            respond_own(c, 503, "out of memory");
            off = len;
            break;
        }
        r = pl_h1_execute(c->h1, data + off, len - off, &used);
        off += used;
        if (r == PL_H1_REQUEST) {
            conn_dispatch(c);
        } else if (r == PL_H1_ERROR) {
            int status = c->h1->err_status;
            const char *msg = c->h1->err_msg; /* a static string */
            PL_LOG(PL_LOG_DEBUG, "bad request", "\"status\":%d", status);
            request_end(c);
            if (status == 0)
                conn_close(c);
            else
                respond_own(c, status, msg);
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

    if (c->closing)
        return;
    in_consume(c, used);
    if (c->peer_eof && !c->pending)
        conn_finish(c); /* what is left of a half-closed peer's requests */
}

static void resume_cb(uv_idle_t *idle)
{
    pl_http *h = container_of(idle, pl_http, resume);

    while (h->lists[TL_RESUME]) {
        pl_conn *c = h->lists[TL_RESUME];
        list_add(c, TL_IDLE); /* until its next request begins */
        conn_process_buffered(c);
    }
    uv_idle_stop(idle);
}

static void alloc_cb(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    pl_conn *c = container_of(handle, pl_conn, tcp);

    (void)suggested;
    *buf = uv_buf_init(conn_http(c)->readbuf, READ_BUFFER_SIZE);
}

/* Takes one report off <c>'s error queue; tells the owner when it says the
 * peer acknowledged up to ack_want. One per call: a queue holding more keeps
 * EPOLLERR raised and is taken on the next turns, never spinning in place.
 * <with_request>: the report came with bytes of a request. Returns -1 when
 * the queue was empty. */
static int conn_take_ack_report(pl_conn *c, int with_request)
{
    union {
        char buf[512];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = {.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *cm;
    uv_os_fd_t fd;

    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 ||
        recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
        return -1;
    for (cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        const struct sock_extended_err *ee;
        if (!(cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) &&
            !(cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR))
            continue;
        ee = (const struct sock_extended_err *)(const void *)CMSG_DATA(cm);
        if (ee->ee_errno != ENOMSG || ee->ee_origin != SO_EE_ORIGIN_TIMESTAMPING ||
            ee->ee_info != SCM_TSTAMP_ACK)
            continue;
        /* Offsets wrap at 2^32; a report at or past the wanted one covers it. */
        if (c->ack_waiting && (int32_t)(ee->ee_data - c->ack_want) >= 0) {
            c->ack_waiting = 0;
            c->acks_ride = with_request != 0;
            conn_event(c, PL_CONN_EV_ACKED);
        }
    }
    return 0;
}

/* Whether bytes written to <c> are left: in libuv's queue, or in the
 * socket by the kernel's count <req> (SIOCOUTQ: not yet acknowledged;
 * SIOCOUTQNSD: not yet sent). Both are the kernel's sequence numbers, in
 * every state: a reset leaves them as they were. 1 when some are, 0 when
 * none, -1 when the kernel cannot be asked. */
static int conn_bytes_left(const pl_conn *c, unsigned long req)
{
    uv_os_fd_t fd;
    int n = 0;

    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return -1;
    if (uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0)
        return 1;
    if (ioctl(fd, req, &n) != 0)
        return -1;
    return n > 0;
}

/* The peer of held <c> ended the connection (<nread>: UV_EOF or an error):
 * reading stops and its owner is told; the connection stays open, so the
 * kernel can still be asked about it, until the owner closes it. */
static void held_end(pl_conn *c, ssize_t nread)
{
    c->peer_eof = nread == UV_EOF;
    c->peer_reset = nread == UV_ECONNRESET;
    c->ended = nread == UV_EOF ? PL_CONN_END_EOF
               : nread == UV_ECONNRESET ? PL_CONN_END_RESET : PL_CONN_END_FAILED;
    uv_read_stop((uv_stream_t *)&c->tcp);
    conn_event(c, PL_CONN_EV_END);
}

/* Bytes for a held <c>: its owner is told they came (and may let it go:
 * then they are read as they are), else they are kept, bounded, for when
 * it is let go. Returns 1 when <c> was let go and holds nothing older, 0
 * when the bytes were kept, -1 when the connection was closed. */
static int held_data(pl_conn *c, const char *data, size_t len)
{
    conn_event(c, PL_CONN_EV_DATA);
    if (c->closing)
        return -1;
    if (!c->held && c->in.len == 0)
        return 1;
    if (c->in.len + len > conn_http(c)->limits.max_header_bytes ||
        pl_buf_append(&c->in, data, len) != 0) {
        conn_close(c);
        return -1;
    }
    return 0;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pl_conn *c = container_of(s, pl_conn, tcp);
    pl_http *h = conn_http(c);
    size_t used;

    if (uv_now(h->loop) != h->read_ms) {
        h->prev_read_ms = h->read_ms;
        h->read_ms = uv_now(h->loop);
    }
    if (nread == UV_EOF && c->pending && c->eof_holds) {
        /* A half-close after a request whose answer waits: it is still
         * answered (then the connection closes); nothing more is read. */
        c->peer_eof = 1;
        uv_read_stop(s);
        return;
    }
    if (nread < 0) {
        /* A peer that acknowledged and then reset can leave the report
         * queued behind the reset: it still says every byte was taken. */
        for (int i = 0; i < 4 && c->acks == ACKS_ON && c->ack_waiting; i++)
            if (conn_take_ack_report(c, 0) != 0)
                break;
        if (c->held && !c->closing) {
            held_end(c, nread);
            return;
        }
        c->peer_reset = nread == UV_ECONNRESET;
        conn_close(c); /* EOF or error: a parked poll settles as disconnect */
        return;
    }
    /* libuv reads on EPOLLERR too, which a queued ACK report raises until it
     * is taken (nread == 0): taken whatever this connection expects, as a
     * socket handed over by an upgrade may hold one asked for by the older
     * process. A request arriving on a connection that awaits its ACK
     * carries that ACK, so its report is queued already: take it first,
     * saving the extra wakeup. */
    if (nread == 0 || (c->acks == ACKS_ON && c->ack_waiting))
        conn_take_ack_report(c, nread > 0);
    if (nread == 0 || c->finishing || c->closing)
        return; /* lingering: drop what arrives */
    if (c->held) {
        int rc = held_data(c, buf->base, (size_t)nread);
        if (rc < 0 || c->held)
            return;
        /* let go while told (its request carried the ACK): read it now
         * rather than on the next turn */
        list_remove(c);
        if (rc == 0) {
            conn_process_buffered(c);
            return;
        }
    }
    if (c->pending || c->in.len > 0) {
        /* Pipelined behind an unanswered request: keep it, bounded. */
        if ((c->pending && c->in.len + (size_t)nread > conn_http(c)->limits.max_header_bytes) ||
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
    pl_http *h = conn_http(c);

    pl_buf_free(&c->in);
    request_end(c);
    pl_pool_put(&conn_pool, c);
    h->nconns--;
    if (h->nconns < h->low || (h->peak >= TRIM_MIN_PEAK && h->nconns <= h->peak / TRIM_FRACTION))
        uv_prepare_start(&h->trim, trim_cb);
    if (h->draining && h->nconns == 0 && h->drained)
        h->drained(h->drained_arg);
}

/* A crowd has gone: give its pages back to the system, so RSS follows what
 * is open instead of its peak. Runs once per new low, as the loop is about
 * to wait, however many connections closed in the turn. */
static void trim_cb(uv_prepare_t *prep)
{
    pl_http *h = container_of(prep, pl_http, trim);
    size_t n = pl_pool_trim();

    h->peak = h->low = h->nconns;
    malloc_trim(0); /* what is not pooled: hash tables, large buffers */
    pl_uvmem_trim(); /* libuv's descriptor table, zeros once a crowd has gone */
    uv_prepare_stop(prep);
    PL_LOG(PL_LOG_DEBUG, "pool chunks returned", "\"chunks\":%zu,\"connections\":%llu", n,
           (unsigned long long)h->nconns);
}

/* "A connection" on the socket <fd> (accepted or adopted): one from the
 * connection pool, counted as open, not yet reading. It goes back to the
 * pool in its close callback. NULL, with <fd> closed, when out of memory or
 * when libuv refuses the socket. */
static pl_conn *conn_from_fd(pl_http *h, int fd)
{
    pl_conn *c = pl_pool_get(&conn_pool);

    if (c == NULL) {
        close(fd);
        return NULL;
    }
    memset(c, 0, sizeof(*c));
    uv_tcp_init(h->loop, &c->tcp);
    c->tcp.data = h; /* its server; also marks it as ours for close_walk() */
    if (++h->nconns > h->peak)
        h->peak = h->nconns;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        conn_close(c);
        return NULL;
    }
    return c;
}

static void conn_close(pl_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    list_remove(c);
    if (c->owner != 0)
        owners[c->owner]->on_close(c->data, c);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

void pl_conn_close(pl_conn *c)
{
    conn_close(c);
}

void pl_conn_set_tag(pl_conn *c, unsigned tag)
{
    c->tag = tag & 0xff;
}

void pl_conn_abort(pl_conn *c)
{
    struct linger lg = {1, 0};
    uv_os_fd_t fd;

    /* Also from on_close, where the descriptor is still open: a close that
     * must not deliver what is still queued has to be a reset, whoever
     * began it (the kernel sends its queue after a plain close). */
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    conn_close(c);
}

int pl_conn_acknowledged(const pl_conn *c)
{
    /* Not c->closing: on_close asks this while the descriptor is open. The
     * count alone, not TCP_INFO's state as well: a reset keeps what was
     * unacknowledged counted and reaches on_close through the read path,
     * and a peer that acknowledged everything before it reset did take the
     * bytes (one system call less: 3.5 % of a polled run,
     * docs/benchmarks.md). */
    int left = conn_bytes_left(c, SIOCOUTQ);

    return left < 0 ? -1 : !left;
}

int pl_conn_tcp_info(const pl_conn *c, pl_conn_tcp *t)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    uv_os_fd_t fd;
    int outq = 0, nsd = 0;
    uint32_t queued;

    memset(t, 0, sizeof(*t));
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0 ||
        getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        ioctl(fd, SIOCOUTQ, &outq) != 0 || ioctl(fd, SIOCOUTQNSD, &nsd) != 0)
        return -1;
    /* The kernel's counts are sequence numbers, kept in every state: a
     * reset leaves them as they were when it came. */
    queued = (uint32_t)uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
    t->unacked = (uint32_t)outq + queued;
    t->unsent = (uint32_t)nsd + queued;
    t->closed = ti.tcpi_state == TCP_CLOSE;
    t->probes = ti.tcpi_probes;
    t->rtt_us = ti.tcpi_rtt;
    t->rttvar_us = ti.tcpi_rttvar;
    /* tcpi_rto is doubled for each timeout in a row: the base is what the
     * next segment's first retransmission waits for. */
    t->rto_us = ti.tcpi_backoff < 31 ? ti.tcpi_rto >> ti.tcpi_backoff : ti.tcpi_rto;
    t->since_sent_ms = ti.tcpi_last_data_sent;
    return 0;
}

void pl_conn_probe(pl_conn *c)
{
    uv_os_fd_t fd;
    int on = 1, idle = 1;

    /* A keepalive time below how long it has been idle fires the probe at
     * once; its ACK (or the lack of one) shows in tcpi_probes. */
    if (c->closing || uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
}

int pl_conn_ended(const pl_conn *c)
{
    return c->ended;
}

uint64_t pl_conn_read_delay_max(const pl_conn *c)
{
    const pl_http *h = conn_http(c);

    /* A poll that returned any read of this server's saw every socket
     * that had bytes then (level-triggered, one batch): what is read later
     * came after it. */
    return uv_now(h->loop) - h->prev_read_ms;
}

int pl_conn_peer_eof(const pl_conn *c)
{
    return c->closing || c->peer_eof;
}

int pl_conn_peer_gone(const pl_conn *c)
{
    uv_os_fd_t fd;
    ssize_t n;
    char b;

    if (c->closing || c->peer_eof || uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return 1;
    n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void pl_conn_hold_on_eof(pl_conn *c)
{
    c->eof_holds = 1;
}

int pl_conn_watch_acks(pl_conn *c, int on)
{
    /* How reports look; each write asks for its own (TX_ACK). */
    int flags = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
                SOF_TIMESTAMPING_OPT_ID_TCP | SOF_TIMESTAMPING_OPT_TSONLY;
    uv_os_fd_t fd;

    if (!on) {
        c->acks_ride = 1;
        return 0;
    }
    if (c->acks != ACKS_OFF)
        return 0;
    c->acks = ACKS_REFUSED;
    if (c->closing || uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags)) != 0)
        return -1;
    c->acks = ACKS_ON;
    /* Bytes still in libuv's queue reach the kernel after this point. */
    c->ack_origin = c->out_bytes -
                    (uint32_t)uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    return 0;
}

int pl_conn_expect_ack(pl_conn *c)
{
    if (c->acks == ACKS_REFUSED_NEW) {
        c->acks = ACKS_REFUSED;
        return PL_CONN_ACK_REFUSED;
    }
    if (c->acks != ACKS_ON || c->closing || c->out_bytes == c->ack_origin)
        return PL_CONN_ACK_POLL;
    if (!c->reported)
        return c->acks_ride ? PL_CONN_ACK_NEXT_REQUEST : PL_CONN_ACK_POLL;
    c->ack_want = c->out_bytes - c->ack_origin - 1; /* offset of the last byte */
    c->ack_waiting = 1;
    return PL_CONN_ACK_REPORT;
}

void pl_conn_report_acks(pl_conn *c)
{
    c->acks_ride = 0;
}

void pl_conn_skip_ack_report(pl_conn *c)
{
    c->acks_skip = 1;
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

int pl_conn_take_request(pl_conn *c, pl_buf *out)
{
    if (c->h1 == NULL || !c->pending)
        return -1;
    return pl_h1_take_arena(c->h1, out);
}

void *pl_conn_app(const pl_conn *c)
{
    return conn_http(c)->app;
}

/* Tells <c>'s owner of <ev>. */
static void conn_event(pl_conn *c, int ev)
{
    const pl_conn_owner *o = owners[c->owner];

    if (o != NULL && o->on_event != NULL)
        o->on_event(c->data, c, ev);
}

void pl_conn_set_owner(pl_conn *c, void *obj, pl_conn_owner *ops)
{
    if (obj == NULL || ops == NULL) {
        c->data = NULL;
        c->owner = 0;
        return;
    }
    if (ops->slot == 0) {
        unsigned i = 1;
        while (i < OWNERS_MAX && owners[i] != NULL)
            i++;
        /* a handful of kinds, all known at build time */
        PL_ASSERT(i < OWNERS_MAX);
        owners[i] = ops;
        ops->slot = i;
    }
    c->data = obj;
    c->owner = ops->slot & 7;
}

void pl_conn_hold(pl_conn *c)
{
    c->held = 1;
    list_remove(c); /* no timeout and no parsing while held */
}

void pl_conn_release(pl_conn *c)
{
    pl_http *h = conn_http(c);

    pl_conn_set_owner(c, NULL, NULL);
    if (c->closing || !c->held) {
        if (!c->closing && h->draining && c->list == TL_IDLE)
            conn_drain_idle(c);
        return;
    }
    c->held = 0;
    if (c->ended) {
        conn_close(c);
    } else if (c->in.len > 0) {
        list_add(c, TL_RESUME); /* read on the loop's next turn, or by on_read now */
    } else if (h->draining) {
        conn_drain_idle(c);
    } else {
        list_add(c, c->finishing ? TL_LINGER : TL_IDLE);
    }
}

size_t pl_conn_size(void)
{
    return sizeof(pl_conn);
}

/* <c>'s socket is open: parse from now on, in timer list <list>. */
static void conn_start(pl_conn *c, uint8_t list)
{
    uv_tcp_nodelay(&c->tcp, 1);
    if (list != TL_NONE)
        list_add(c, list);
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) != 0)
        conn_close(c);
}

/* Takes the accepted socket <fd> as a new connection. */
static void conn_open(pl_http *h, int fd)
{
    pl_conn *c = conn_from_fd(h, fd);

    if (c == NULL) {
        PL_LOG(PL_LOG_ERROR, "cannot take an accepted connection", NULL);
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

    for (int i = 0; i < h->nlisteners && h->listening; i++)
        if (h->listeners[i].fd >= 0)
            uv_poll_start(&h->listeners[i].poll, UV_READABLE, accept_cb);
}

/* A listener stays readable while the cause lasts: wait instead of waking
 * up for it again and again. */
static void accept_pause(listener *l)
{
    uv_poll_stop(&l->poll);
    uv_timer_start(&l->http->accept_timer, accept_resume, ACCEPT_PAUSE_MS, 0);
}

/* Out of descriptors with connections waiting. The spare descriptor is given
 * up to accept each of them and close it at once: its client hears "no" now
 * instead of hanging in the backlog, and the listener does not wake the loop
 * again and again for connections it cannot take. With no spare to give
 * (a system-wide shortage took it), accepting pauses briefly instead. */
static void shed(listener *l, int cause)
{
    pl_http *h = l->http;
    uint64_t now = uv_now(h->loop), before = h->refused[PL_HTTP_REFUSED_FD_LIMIT];
    int fd, err = cause, n = 0;

    if (h->spare_fd >= 0) {
        close(h->spare_fd);
        /* Bounded like accepting: what is left wakes the loop again. */
        while (n++ < ACCEPT_BATCH &&
               ((fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC)) >= 0 ||
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
        accept_pause(l);
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
    listener *l = container_of(p, listener, poll);

    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < ACCEPT_BATCH && l->http->listening; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(l->http, fd);
        } else if (errno == EMFILE || errno == ENFILE) {
            shed(l, errno);
            return;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return; /* none left */
        } else if (errno != EINTR && errno != ECONNABORTED && errno != EPROTO) {
            PL_LOG(PL_LOG_WARN, "accept failed", "\"error\":\"%s\"", strerror(errno));
            accept_pause(l); /* ENOMEM, ENOBUFS: a while may help */
            return;
        }
    }
}

/* ---- adoption (a binary upgrade hands connections over) ---- */

pl_conn *pl_http_adopt(pl_http *h, int fd, int parked, int keep_alive)
{
    pl_conn *c = conn_from_fd(h, fd);

    if (c == NULL)
        return NULL;
    c->pending = parked != 0;
    c->tuned = parked != 0; /* the socket options came with the socket */
    conn_start(c, parked ? TL_NONE : TL_IDLE);
    if (c->closing)
        return NULL;
    c->keep_alive = keep_alive != 0;
    return c;
}

int pl_http_adopt_listener(pl_http *h, int fd, uint16_t *bound_port)
{
    listener *l = listener_new(h);

    if (l == NULL) {
        close(fd);
        return UV_ENOBUFS;
    }
    return listener_start(l, fd, bound_port);
}

int pl_http_listener_fd(const pl_http *h, int i)
{
    return h->listening && i < h->nlisteners ? h->listeners[i].fd : -1;
}

int pl_http_listener_count(const pl_http *h)
{
    return h->nlisteners;
}

int pl_conn_handover_fd(const pl_conn *c)
{
    uv_os_fd_t fd;

    /* Bytes still queued here would be lost with our descriptor. */
    if (c->closing || c->finishing || c->in.len > 0 || c->h1 != NULL ||
        uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 ||
        uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return -1;
    return fd;
}

int pl_conn_keep_alive(const pl_conn *c)
{
    return c->keep_alive;
}

int pl_conn_freeze(pl_conn *c)
{
    int list = c->list;

    list_remove(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    return list;
}

void pl_conn_thaw(pl_conn *c, int frozen)
{
    if (c->closing)
        return;
    if (frozen != TL_NONE)
        list_add(c, (uint8_t)frozen);
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) != 0)
        conn_close(c);
}

size_t pl_http_each_idle(pl_http *h, void (*fn)(pl_conn *c, void *arg), void *arg)
{
    static const uint8_t which[] = {TL_IDLE, TL_REQUEST};
    size_t n = 0;

    for (size_t i = 0; i < sizeof(which); i++)
        for (pl_conn *c = h->lists[which[i]]; c; c = c->lnext)
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
        if (h->lists[i] != NULL)
            timer_arm(h, list_due(h, i, uv_now(h->loop)));
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
    h->spare_fd = -1;
    uv_timer_init(loop, &h->timer);
    uv_timer_init(loop, &h->accept_timer);
    uv_idle_init(loop, &h->resume);
    uv_prepare_init(loop, &h->trim);
    return h;
}

/* A new listener slot of <h>; NULL when <h> has its most. */
static listener *listener_new(pl_http *h)
{
    listener *l;

    if (h->nlisteners == PL_HTTP_LISTENERS_MAX)
        return NULL;
    l = &h->listeners[h->nlisteners++];
    l->fd = -1;
    l->http = h;
    return l;
}

/* Accepts on the listening socket <fd> from now on (it is <l>'s to close).
 * Returns 0 and sets *bound_port, or a negative errno (as libuv's errors are
 * on Unix); then <fd> is closed, the other listeners stay. */
static int listener_start(listener *l, int fd, uint16_t *bound_port)
{
    pl_http *h = l->http;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int rc;

    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || listen(fd, 4096) != 0)
        rc = -errno;
    else
        rc = uv_poll_init_socket(h->loop, &l->poll, fd);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    l->fd = fd;
    if (h->spare_fd < 0)
        h->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    h->listening = 1;
    uv_poll_start(&l->poll, UV_READABLE, accept_cb);
    *bound_port = ntohs(ss.ss_family == AF_INET
                            ? ((struct sockaddr_in *)&ss)->sin_port
                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

int pl_http_listen(pl_http *h, const struct sockaddr *addr, unsigned flags,
                   uint16_t *bound_port)
{
    listener *l = listener_new(h);
    int fd, on = 1, v6only = (flags & UV_TCP_IPV6ONLY) != 0;

    if (l == NULL)
        return UV_ENOBUFS;
    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    /* Set either way, as libuv does: [::] alone is dual-stack whatever the
     * host's net.ipv6.bindv6only says. */
    if (addr->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    if (bind(fd, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                   : sizeof(struct sockaddr_in)) != 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return listener_start(l, fd, bound_port);
}

/* Stops accepting and closes every listening socket, once. */
static void close_listener(pl_http *h)
{
    h->listening = 0;
    for (int i = 0; i < h->nlisteners; i++) {
        listener *l = &h->listeners[i];
        if (l->fd < 0)
            continue;
        /* A failed start's walk may have closed the handle already. */
        if (!uv_is_closing((uv_handle_t *)&l->poll))
            uv_close((uv_handle_t *)&l->poll, NULL);
        close(l->fd); /* safe at once: uv_close stopped polling it */
        l->fd = -1;
    }
    if (h->spare_fd >= 0)
        close(h->spare_fd);
    h->spare_fd = -1;
}

/* Ends idle <c> for a drain. An answer still being written (a large run to
 * a slow reader) is finished first: cut short, its run would be lost after
 * its dispatcher heard true. */
static void conn_drain_idle(pl_conn *c)
{
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > 0)
        conn_finish(c);
    else
        conn_close(c);
}

void pl_http_drain(pl_http *h, void (*done)(void *arg), void *arg)
{
    pl_conn *c, *next;

    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
    close_listener(h);
    /* One with an owner is in progress (a dispatcher awaiting its answer,
     * say): its owner ends it, then pl_conn_release() closes it. A held
     * one (a run awaiting its ACK) is in no list at all. */
    for (c = h->lists[TL_IDLE]; c; c = next) {
        next = c->lnext;
        if (c->data == NULL)
            conn_drain_idle(c);
    }
    for (c = h->lists[TL_REQUEST]; c; c = next) {
        next = c->lnext;
        if (c->h1 == NULL || !c->h1->in_msg)
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
    uv_close((uv_handle_t *)&h->trim, NULL);
}

void pl_http_free(pl_http *h)
{
    if (h != NULL)
        close_listener(h); /* a failed start closed its handles, not its sockets */
    pl_free(h); /* NULL is fine */
}

uint64_t pl_http_connections(const pl_http *h)
{
    return h->nconns;
}

uint64_t pl_http_refused(const pl_http *h, unsigned reason)
{
    return reason < PL_HTTP_REFUSED__COUNT ? h->refused[reason] : 0;
}
