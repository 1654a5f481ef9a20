/* http.c -- an HTTP/1.1 server context: its limits, the timer lists of its
 * connections, and its drain. */
#include <string.h>

#include "transport.h"
#include "pilotlight/mem.h"

/* A lingering close lasts this long at most (conn.c sends FIN, then reads
 * and drops until the client closes). */
#define LINGER_MS 2000

/* ---- the context ---- */

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
    pl__timers_rearm(h);
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
    h->expire = pl__conn_expire;
    h->resume_one = pl__conn_resume;
    uv_timer_init(loop, &h->timer);
    uv_timer_init(loop, &h->accept_timer);
    uv_idle_init(loop, &h->resume);
    return h;
}

void pl_http_wind_down(pl_http *h)
{
    h->winding_down = 1;
}

void pl_http_drain(pl_http *h, void (*done)(void *arg), void *arg)
{
    pl_conn *c, *next;

    h->draining = 1;
    h->drained = done;
    h->drained_arg = arg;
    pl__listeners_close(h);
    /* One with an owner is in progress (a dispatcher awaiting its answer,
     * say): its owner ends it, then pl_conn_release() closes it. A held
     * one (a run awaiting its ACK) is in no list at all. */
    for (c = h->lists[TL_IDLE]; c; c = next) {
        next = c->lnext;
        if (c->data == NULL)
            pl__conn_drain_idle(c);
    }
    for (c = h->lists[TL_REQUEST]; c; c = next) {
        next = c->lnext;
        if (c->h1 == NULL || !c->h1->in_msg)
            pl__conn_close(c);
    }
    if (h->nconns == 0 && done)
        done(arg);
}

static void close_walk(uv_handle_t *handle, void *arg)
{
    pl_http *h = arg;

    if (handle->type == UV_TCP && handle->data == h && !uv_is_closing(handle))
        pl__conn_close(container_of(handle, pl_conn, tcp));
}

void pl_http_close_all(pl_http *h)
{
    uv_walk(h->loop, close_walk, h);
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

void pl_http_stop(pl_http *h)
{
    pl__listeners_close(h);
    uv_close((uv_handle_t *)&h->accept_timer, NULL);
    uv_close((uv_handle_t *)&h->timer, NULL);
    uv_close((uv_handle_t *)&h->resume, NULL);
}

void pl_http_free(pl_http *h)
{
    if (h != NULL)
        pl__listeners_close(h); /* a failed start closed its handles, not its sockets */
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

/* ---- a binary upgrade hands connections over ---- */

pl_conn *pl_http_adopt(pl_http *h, int fd, int parked, int keep_alive)
{
    pl_conn *c = pl__conn_from_fd(h, fd);

    if (c == NULL)
        return NULL;
    c->pending = parked != 0;
    c->tuned = parked != 0; /* the socket options came with the socket */
    pl__conn_start(c, parked ? TL_NONE : TL_IDLE);
    if (c->closing)
        return NULL;
    c->keep_alive = keep_alive != 0;
    return c;
}

int pl_conn_handover_fd(const pl_conn *c)
{
    uv_os_fd_t fd;

    /* Bytes still queued here would be lost with our descriptor. */
    if (c->closing || c->finishing || c->discard || c->in.len > 0 || c->h1 != NULL ||
        uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0 ||
        uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return -EBUSY;
    return fd;
}

int pl_conn_keep_alive(const pl_conn *c)
{
    return c->keep_alive;
}

int pl_conn_freeze(pl_conn *c)
{
    int list = c->list;

    pl__list_remove(c);
    uv_read_stop((uv_stream_t *)&c->tcp);
    return list;
}

void pl_conn_thaw(pl_conn *c, int frozen)
{
    if (c->closing)
        return;
    if (frozen != TL_NONE)
        pl__list_add(c, (uint8_t)frozen);
    pl__conn_read(c);
}
