/* conn.c -- one HTTP/1.1 connection: read and parse, answer in order,
 * write, close; held open for an owner; its ACKs. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sys/uio.h>
#include <unistd.h>

#include "transport.h"
#include "pilotlight/buf.h"
#include "pilotlight/invariant.h"
#include "pilotlight/log.h"
#include "pilotlight/pool.h"
#include "pilotlight/reclaim.h"
#include "pilotlight/tcp.h"

/* Bytes kept behind a parked request (pl_conn_park): one small request.
 * More, and they are all dropped and the connection closes once the answer
 * is sent, so that a parked poll costs what it costs whatever its client
 * sends behind it. Behind another pending request (a dispatch awaiting
 * its answer, briefly), up to max_header_bytes. */
#define PARKED_KEEP 1024

/* The kinds of owner connections have, each with what it does when one of
 * its connections ends: a connection keeps the slot, 3 bits, not a
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

static void held_end(pl_conn *c, ssize_t nread);
static void request_end(pl_conn *c);

void pl__conn_event(pl_conn *c, int ev, int arg)
{
    const pl_conn_owner *o = owners[c->owner];

    if (o != NULL && o->on_event != NULL)
        o->on_event(c->data, c, ev, arg);
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
        pl__conn_close(c);
}

/* Writes <bufs>, copying what the socket cannot take now. Returns 0, or a
 * negative errno when the connection failed (it is then closing). */
static int conn_write(pl_conn *c, const uv_buf_t *bufs, unsigned n)
{
    size_t total = 0, skip, rest;
    write_req *w;
    uv_buf_t b;
    char *p;
    int r, reported;

    if (c->closing)
        return -EPIPE;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    c->out_bytes += (uint32_t)total;
    /* Queued bytes go first, and the rest after them, unreported. */
    reported = c->reports == PL_CONN_REPORTS_ON && c->acks == ACKS_ON && n <= 2 &&
               uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) == 0;
    c->ack_waiting = 0;
    if (reported)
        r = pl__conn_write_reported(c, bufs, n);
    else
        r = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    if (r == UV_EAGAIN)
        r = 0;
    if (r < 0) {
        pl__conn_close(c);
        return r;
    }
    if ((size_t)r == total) {
        if (reported && c->acks == ACKS_ON) {
            c->ack_want = c->out_bytes - c->ack_origin - 1; /* offset of the last byte */
            c->ack_waiting = 1;
        }
        return 0;
    }
    /* its last byte goes out later, unreported */
    skip = (size_t)r;
    rest = total - skip;
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + rest >
        pl__conn_http(c)->max_queued) {
        /* A client that does not read must not make us hold its answers:
         * drop it, as if it had gone. */
        PL_LOG(PL_LOG_DEBUG, "client not reading: connection dropped", NULL);
        pl_conn_abort(c);
        return -ENOBUFS;
    }
    w = pl_pool_alloc(sizeof(*w) + rest, NULL);
    if (w == NULL) {
        pl__conn_close(c);
        return -ENOMEM;
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
    if ((r = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write)) != 0) {
        pl_pool_free(w, w->size);
        pl__conn_close(c);
        return r;
    }
    return 0;
}

static const char *reason(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 307: return "Temporary Redirect";
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
        pl__conn_close(c); /* a half-closed peer sends nothing to linger for */
}

/* The last answer is queued: send FIN after it, then keep reading (and
 * dropping) until the client closes or the linger time passes, so a client
 * still sending is not answered with a reset that could destroy our answer. */
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
        pl__conn_close(c);
        return;
    }
    pl__list_add(c, TL_LINGER);
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
    pl_http *h = pl__conn_http(c);
    /* status line, the longest reason, three fixed headers, digits: the
     * content type is the server's own short string; extra headers are
     * bounded by the caller (PL_CONN_EXTRA_MAX) */
    char head[256 + PL_CONN_EXTRA_MAX], *p = head;
    uv_buf_t bufs[2];
    int rc;
    /* A half-closed peer's pipelined requests are still answered. */
    int keep = c->keep_alive && !h->draining && !h->winding_down && !c->discard &&
               !(c->peer_eof && c->in.len == 0);

    if (c->closing || c->finishing)
        return -EPIPE;
    PL_ASSERT(extra_headers == NULL || strlen(extra_headers) <= PL_CONN_EXTRA_MAX);
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
    c->pending = c->parked = 0;
    if ((rc = conn_write(c, bufs, len > 0 && !c->head ? 2 : 1)) != 0)
        return rc;
    if (h->cb.on_response)
        h->cb.on_response(h->app, c->tag, status);
    if (!keep)
        conn_finish(c);
    else if (c->in.len > 0 && !c->in_parse)
        pl__list_add(c, TL_RESUME);
    else
        pl__list_add(c, TL_IDLE);
    return 0;
}

int pl_conn_respond_json(pl_conn *c, int status, const char *json)
{
    return pl_conn_respond(c, status, "application/json", NULL, json, strlen(json));
}

int pl_conn_respond_error(pl_conn *c, int status, const char *msg)
{
    char body[256];
    int n = snprintf(body, sizeof(body), "{\"error\":\"%s\"}", msg);

    return pl_conn_respond(c, status, "application/json", NULL, body,
                           n < (int)sizeof(body) ? (size_t)n : sizeof(body) - 1);
}

void pl__conn_refuse(pl_conn *c, int status, const char *msg)
{
    c->keep_alive = 0;
    c->tag = 0;
    pl_conn_respond_error(c, status, msg);
}

/* ---- the request path ---- */

static void on_begin(void *owner)
{
    pl_conn *c = owner;

    c->tag = 0;
    c->keep_alive = c->head = c->eof_holds = 0; /* until this request is read */
    pl__list_add(c, TL_REQUEST);
}

static int on_headers(void *owner, int send_continue)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    pl_conn *c = owner;
    uv_buf_t b = uv_buf_init((char *)cont, sizeof(cont) - 1);

    if (send_continue && conn_write(c, &b, 1) != 0)
        return -EPIPE;
    pl__list_add(c, TL_REQUEST); /* a fresh deadline for the body */
    return 0;
}

static const pl_h1_events h1_events = {on_begin, on_headers};

/* "A request": a parser from the request pool, for the bytes to come.
 * Returns 0, or -ENOMEM. */
static int request_begin(pl_conn *c)
{
    c->h1 = pl_pool_get(&request_pool);
    if (c->h1 == NULL)
        return -ENOMEM;
    pl_h1_init(c->h1, &pl__conn_http(c)->h1_limits, &h1_events, c);
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
    pl_http *h = pl__conn_http(c);
    pl_request req;

    pl_h1_request(c->h1, &req);
    c->keep_alive = c->h1->keep_alive;
    c->head = c->h1->head;
    pl__list_remove(c);
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
            pl__conn_refuse(c, 503, "out of memory");
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
                pl__conn_close(c);
            else
                pl__conn_refuse(c, status, msg);
            off = len;
        }
    }
    c->in_parse = 0;
    return off;
}

void pl__conn_resume(pl_conn *c)
{
    size_t used = conn_execute(c, c->in.data, c->in.len);

    if (c->closing)
        return;
    c->in.len -= (uint32_t)used;
    if (c->in.len == 0)
        pl_buf_free(&c->in);
    else
        memmove(c->in.data, c->in.data + used, c->in.len);
    if (c->peer_eof && !c->pending)
        conn_finish(c); /* what is left of a half-closed peer's requests */
}

void pl__conn_expire(pl_conn *c)
{
    if (c->list == TL_REQUEST && c->h1 != NULL && c->h1->in_msg) {
        request_end(c);
        pl__conn_refuse(c, 408, "request not received in time");
    } else {
        pl__conn_close(c);
    }
}

/* ---- reading ---- */

static void alloc_cb(uv_handle_t *handle, size_t suggested, uv_buf_t *buf)
{
    pl_conn *c = container_of(handle, pl_conn, tcp);

    (void)suggested;
    *buf = uv_buf_init(pl__conn_http(c)->readbuf, PL_HTTP_READ_BUFFER_SIZE);
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
    pl__conn_event(c, PL_CONN_EV_END, 0);
}

/* Bytes for a held <c>: its owner is told they came (and may let it go:
 * then they are read as they are), else they are kept, bounded, for when
 * it is let go. Returns 0 when <c> was let go and holds nothing older (the
 * caller reads them), -EAGAIN when the bytes were kept, -EPIPE when the
 * connection was closed. */
static int held_data(pl_conn *c, const char *data, size_t len)
{
    pl__conn_event(c, PL_CONN_EV_DATA, 0);
    if (c->closing)
        return -EPIPE;
    if (!c->held && c->in.len == 0)
        return 0;
    if (c->in.len + len > pl__conn_http(c)->limits.max_header_bytes ||
        pl_buf_append(&c->in, data, len) != 0) {
        pl__conn_close(c);
        return -EPIPE;
    }
    return -EAGAIN;
}

/* An end or an error read on <c>. */
static void on_read_end(pl_conn *c, ssize_t nread)
{
    if (nread == UV_EOF && c->pending && c->eof_holds) {
        /* A half-close after a request whose answer waits: it is still
         * answered (then the connection closes); nothing more is read. */
        c->peer_eof = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        return;
    }
    /* A peer that acknowledged and then reset can leave the report
     * queued behind the reset: it still says every byte was taken. */
    for (int i = 0; i < 4 && c->acks == ACKS_ON && c->ack_waiting; i++) {
        int rc = pl__conn_take_ack_report(c);
        if (rc == 0)
            pl__conn_event(c, PL_CONN_EV_ACKED, 0);
        else if (rc != -ENOMSG)
            break;
    }
    if (c->held && !c->closing) {
        held_end(c, nread);
        return;
    }
    c->peer_reset = nread == UV_ECONNRESET;
    pl__conn_close(c); /* EOF or error: a parked poll settles as disconnect */
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    pl_conn *c = container_of(s, pl_conn, tcp);
    pl_http *h = pl__conn_http(c);
    size_t used;

    if (nread < 0) {
        on_read_end(c, nread);
        return;
    }
    /* libuv reads on EPOLLERR too, which a queued ACK report raises until it
     * is taken (nread == 0): taken whatever this connection expects, as a
     * socket handed over by an upgrade may hold one asked for by the older
     * process. A request arriving on a connection that awaits its ACK
     * carries that ACK, so its report is queued already: take it first,
     * saving the extra wakeup. */
    if ((nread == 0 || (c->acks == ACKS_ON && c->ack_waiting)) &&
        pl__conn_take_ack_report(c) == 0)
        pl__conn_event(c, PL_CONN_EV_ACKED, nread > 0);
    if (nread == 0 || c->finishing || c->closing)
        return; /* lingering: drop what arrives */
    if (c->held) {
        int rc = held_data(c, buf->base, (size_t)nread);
        if (rc == -EPIPE || c->held)
            return;
        /* let go while told (its request carried the ACK): read it now
         * rather than on the next turn */
        pl__list_remove(c);
        if (rc == -EAGAIN) {
            pl__conn_resume(c);
            return;
        }
    }
    if (c->pending || c->in.len > 0) {
        /* Pipelined behind an unanswered request: a little is kept, for
         * after its answer; more, and nothing is (PENDING_KEEP). */
        if (c->discard)
            return;
        if (c->parked && c->in.len + (size_t)nread > PARKED_KEEP) {
            pl_buf_free(&c->in);
            c->discard = 1;
            return;
        }
        if ((c->pending && c->in.len + (size_t)nread > h->limits.max_header_bytes) ||
            pl_buf_append(&c->in, buf->base, (size_t)nread) != 0) {
            pl__conn_close(c);
            return;
        }
        if (!c->pending && c->list != TL_RESUME)
            pl__conn_resume(c);
        return;
    }
    used = conn_execute(c, buf->base, (size_t)nread);
    if (used == (size_t)nread || c->closing || c->finishing)
        return;
    if (c->parked && (size_t)nread - used > PARKED_KEEP)
        c->discard = 1; /* behind a parked poll: as above */
    else if ((c->pending && (size_t)nread - used > h->limits.max_header_bytes) ||
             pl_buf_append(&c->in, buf->base + used, (size_t)nread - used) != 0)
        pl__conn_close(c);
}

/* ---- a connection's life ---- */

static void on_closed(uv_handle_t *handle)
{
    pl_conn *c = container_of(handle, pl_conn, tcp);
    pl_http *h = pl__conn_http(c);

    pl_buf_free(&c->in);
    request_end(c);
    pl_pool_put(&conn_pool, c);
    pl_reclaim_closed();
    h->nconns--;
    if (h->draining && h->nconns == 0 && h->drained)
        h->drained(h->drained_arg);
}

pl_conn *pl__conn_from_fd(pl_http *h, int fd)
{
    pl_conn *c = pl_pool_get(&conn_pool);

    if (c == NULL) {
        close(fd);
        return NULL;
    }
    memset(c, 0, sizeof(*c));
    uv_tcp_init(h->loop, &c->tcp);
    c->tcp.data = h; /* its server; also marks it as ours for close_walk() */
    h->nconns++;
    pl_reclaim_opened();
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        pl__conn_close(c);
        return NULL;
    }
    return c;
}

void pl__conn_read(pl_conn *c)
{
    if (uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, on_read) != 0)
        pl__conn_close(c);
}

void pl__conn_start(pl_conn *c, uint8_t list)
{
    uv_tcp_nodelay(&c->tcp, 1);
    if (list != TL_NONE)
        pl__list_add(c, list);
    pl__conn_read(c);
}

void pl__conn_close(pl_conn *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    pl__list_remove(c);
    if (c->owner != 0)
        owners[c->owner]->on_close(c->data, c);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/* An answer still being written (a large run to a slow reader) is finished
 * first: cut short, its run would be lost after its dispatcher heard true. */
void pl__conn_drain_idle(pl_conn *c)
{
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > 0)
        conn_finish(c);
    else
        pl__conn_close(c);
}

void pl_conn_close(pl_conn *c)
{
    pl__conn_close(c);
}

void pl_conn_abort(pl_conn *c)
{
    int fd = pl__conn_fd(c);

    /* Also from on_close, where the descriptor is still open: a close that
     * must not deliver what is still queued has to be a reset, whoever
     * began it (the kernel sends its queue after a plain close). */
    if (fd >= 0)
        pl_tcp_reset_on_close(fd);
    pl__conn_close(c);
}

void pl_conn_set_tag(pl_conn *c, unsigned tag)
{
    c->tag = tag & 0xff;
}

void *pl_conn_app(const pl_conn *c)
{
    return pl__conn_http(c)->app;
}

int pl_conn_take_request(pl_conn *c, pl_buf *out)
{
    if (c->h1 == NULL || !c->pending)
        return -ENOENT;
    return pl_h1_take_arena(c->h1, out);
}

size_t pl_conn_size(void)
{
    return sizeof(pl_conn);
}

/* ---- owners ---- */

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

void pl_conn_park(pl_conn *c)
{
    c->parked = 1;
}

void pl_conn_hold(pl_conn *c)
{
    c->held = 1;
    pl__list_remove(c); /* no timeout and no parsing while held */
}

void pl_conn_release(pl_conn *c)
{
    pl_http *h = pl__conn_http(c);

    pl_conn_set_owner(c, NULL, NULL);
    if (c->closing || !c->held) {
        if (!c->closing && h->draining && c->list == TL_IDLE)
            pl__conn_drain_idle(c);
        return;
    }
    c->held = 0;
    if (c->ended) {
        pl__conn_close(c);
    } else if (c->in.len > 0) {
        pl__list_add(c, TL_RESUME); /* read on the loop's next turn, or by on_read now */
    } else if (h->draining) {
        pl__conn_drain_idle(c);
    } else {
        pl__list_add(c, c->finishing ? TL_LINGER : TL_IDLE);
    }
}
