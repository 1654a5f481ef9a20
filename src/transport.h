/* transport.h -- what the transport's files share: the structs
 * of a connection, a listener and a server context, and the few functions
 * one of them calls in another. Installed nowhere: the rest of the program
 * sees http.h. */
#ifndef PILOTLIGHT_TRANSPORT_H
#define PILOTLIGHT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "pilotlight/http.h"
#include "pilotlight/buf.h"
#include "pilotlight/loop.h"
#include "pilotlight/mem.h"


#define PL_HTTP_READ_BUFFER_SIZE 65536

/* The timer lists. Each has one timeout for all its members, so appending
 * keeps it sorted by deadline and expiry only looks at the head. A pending
 * connection (its answer not yet sent, e.g. a parked poll) is in none, nor
 * is a held one. */
enum { TL_NONE = 0, TL_REQUEST, TL_IDLE, TL_LINGER, TL_RESUME, TL__COUNT };

/* Whether the kernel reports a connection's ACKs: not asked yet, it does,
 * it refused (the option, or a write asking for one). */
enum { ACKS_OFF = 0, ACKS_ON, ACKS_REFUSED };

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
    unsigned list : 3, tag : 8, owner : 3; /* owner: its kind's slot (conn.c) */
    unsigned pending : 1;      /* request handed over, not yet answered */
    unsigned in_parse : 1;     /* inside the parse of its bytes */
    unsigned finishing : 1;    /* last answer sent; shutting down */
    unsigned closing : 1;
    unsigned tuned : 1;        /* dead-peer detection is on */
    unsigned keep_alive : 1;   /* of the request being answered */
    unsigned head : 1;         /* that request is a HEAD */
    unsigned acks : 2;         /* the kernel's ACK reports: ACKS_* */
    unsigned reports : 2;      /* the owner's switch (pl_conn_set_reports) */
    unsigned ack_waiting : 1;  /* PL_CONN_EV_ACKED is due at ack_want */
    unsigned eof_holds : 1;    /* a half-close leaves the pending request be */
    unsigned peer_eof : 1;     /* the peer half-closed: answer, then close */
    unsigned peer_reset : 1;   /* closing because the peer reset it */
    unsigned held : 1;         /* its owner holds it open (pl_conn_hold) */
    unsigned parked : 1;       /* its pending request may wait long (a poll):
                                * little is kept behind it */
    unsigned discard : 1;      /* more came behind that than is kept: read and
                                * dropped, and the connection closes after
                                * the answer */
    unsigned ended : 2;        /* a held connection's end: PL_CONN_END_* */
    uint32_t out_bytes;        /* bytes ever given to the socket, mod 2^32 */
    uint32_t ack_origin;       /* out_bytes in the kernel when reports began */
    uint32_t ack_want;         /* report offset that fires PL_CONN_EV_ACKED */
};

/* Accepting is done here rather than by uv_listen(): at EMFILE libuv sheds
 * the waiting connections without telling its caller, and they are counted
 * here (listen.c: shed()). */
typedef struct {
    uv_poll_t poll; /* on fd, while listening */
    int fd;         /* -1 once closed */
    pl_http *http;
} pl_listener;

struct pl_http {
    uv_loop_t *loop;
    pl_listener listeners[PL_HTTP_LISTENERS_MAX];
    int nlisteners;     /* initialised so far; each is closed once */
    uv_timer_t timer;
    uv_idle_t resume;
    uint64_t timer_due; /* when the armed timer fires */
    pl_http_limits limits;
    pl_h1_limits h1_limits;
    size_t max_queued;  /* bytes one connection may have waiting to be sent */
    pl_http_callbacks cb;
    void *app;
    pl_conn *lists[TL__COUNT];
    uint64_t timeouts[TL__COUNT];
    uint64_t nconns;
    uint64_t last_accept_error;
    uint64_t refused[PL_HTTP_REFUSED__COUNT];
    int spare_fd;            /* given up to shed connections at EMFILE */
    uv_timer_t accept_timer; /* resumes accepting after a pause */
    int listening, draining;
    int winding_down;        /* answers close their connections */
    void (*drained)(void *arg);
    void *drained_arg;
    /* What the timer lists do with a connection (http.c sets them): one
     * that waited too long, one to read again. */
    void (*expire)(pl_conn *c);
    void (*resume_one)(pl_conn *c);
    char readbuf[PL_HTTP_READ_BUFFER_SIZE];
};

/* A connection's server is its handle's data: a parked poll is 8 bytes
 * smaller than with a field of its own. */
static inline pl_http *pl__conn_http(const pl_conn *c)
{
    return c->tcp.data;
}

/* <c>'s descriptor, or -1 once its handle is closing. */
static inline int pl__conn_fd(const pl_conn *c)
{
    uv_os_fd_t fd;

    return uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 ? fd : -1;
}

/* ---- conn_timers.c: the timer lists ---- */

/* Moves <c> to the end of timer list <which> (TL_RESUME: read again on
 * the loop's next turn), or out of its list. */
void pl__list_add(pl_conn *c, uint8_t which);
void pl__list_remove(pl_conn *c);

/* The lists' timeouts changed: the timer may be due earlier. */
void pl__timers_rearm(pl_http *h);

/* ---- conn_tcp.c: what TCP knows of a connection ---- */

/* As uv_try_write() for <n> (at most 2) buffers while nothing is queued,
 * asking the kernel for a report of the last byte. Returns the bytes
 * written, UV_EAGAIN, or a negative error. */
int pl__conn_write_reported(pl_conn *c, const uv_buf_t *bufs, unsigned n);

/* Takes one report off <c>'s error queue. Returns 0 when it covers the
 * last reported byte (the caller tells the owner), -ENOMSG when not,
 * -EAGAIN when the queue was empty (or another negative errno). */
int pl__conn_take_ack_report(pl_conn *c);

/* ---- conn.c: connections ---- */

/* "A connection" on the socket <fd> (accepted or adopted): counted as
 * open, not yet reading. NULL, with <fd> closed, when out of memory or
 * when libuv refuses the socket. */
pl_conn *pl__conn_from_fd(pl_http *h, int fd);

/* <c>'s socket is open: it reads from now on, in timer list <list>. */
void pl__conn_start(pl_conn *c, uint8_t list);

/* <c> reads (again). */
void pl__conn_read(pl_conn *c);

/* Tells <c>'s owner of <ev> (PL_CONN_EV_*) with <arg>. */
void pl__conn_event(pl_conn *c, int ev, int arg);

/* Closes <c> (once): its owner is told, its memory goes in the close
 * callback. */
void pl__conn_close(pl_conn *c);

/* The timer list <c> waited in ran out (a request not received in time:
 * 408; else closed). */
void pl__conn_expire(pl_conn *c);

/* Reads what <c> kept (pipelined, or while held). */
void pl__conn_resume(pl_conn *c);

/* Answers <c> with an error of the server's own and closes it after. */
void pl__conn_refuse(pl_conn *c, int status, const char *msg);

/* Ends idle <c> for a drain, after any answer still being written. */
void pl__conn_drain_idle(pl_conn *c);

/* ---- listen.c: listeners ---- */

/* Stops accepting and closes every listening socket, once. */
void pl__listeners_close(pl_http *h);

#endif
