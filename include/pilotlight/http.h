/* http.h -- HTTP/1.1 server connections on libuv + llhttp.
 *
 * Parses requests (keep-alive, pipelining, chunked bodies, 100-continue),
 * enforces the size and time limits, and hands each complete request to the
 * application, one at a time per connection. The application answers with
 * pl_conn_respond(), at once or later (a parked poll); while an answer is
 * pending the connection keeps reading only to notice its client leaving. */
#ifndef PILOTLIGHT_HTTP_H
#define PILOTLIGHT_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "pilotlight/h1.h"
#include "pilotlight/tcp.h"

typedef struct pl_http pl_http;
typedef struct pl_conn pl_conn;

typedef struct {
    /* A complete request. <req> and everything it points to are valid only
     * during the call. Answer with pl_conn_respond() now or later. */
    void (*on_request)(void *app, pl_conn *c, const pl_request *req);
    /* A response with <status> was sent on a connection whose request had
     * <tag> (see pl_conn_set_tag; 0 for the server's own answers to
     * malformed requests, timeouts and refusals). For counters. */
    void (*on_response)(void *app, unsigned tag, int status);
} pl_http_callbacks;

/* What happens to a connection that its owner hears of (pl_conn_owner). */
enum {
    PL_CONN_EV_ACKED = 1, /* its peer acknowledged the last byte written that
                           * asked for a report (pl_conn_set_reports); once
                           * per such write. Its <arg>: 1 when the report
                           * came with bytes of a request (the peer's next
                           * request carried the ACK), else 0 */
    PL_CONN_EV_DATA,      /* bytes arrived while it is held (kept, not read
                           * as a request until it is released) */
    PL_CONN_EV_END,       /* its peer ended it while it is held: see
                           * pl_conn_ended(); it stays open until closed */
};

/* An owner of connections: the object behind pl_conn_set_owner() and what
 * it does when one of its connections closes or something happens to it. */
typedef struct {
    /* <c> is closing (its descriptor is still open); <obj> lets go of it. */
    void (*on_close)(void *obj, pl_conn *c);
    /* PL_CONN_EV_* on <c>, with its argument (0 but for ACKED). Optional. */
    void (*on_event)(void *obj, pl_conn *c, int ev, int arg);
    /* The transport's: where it keeps this kind (0 until first used). */
    unsigned slot;
} pl_conn_owner;

typedef struct {
    uint64_t max_connections;
    uint64_t max_header_bytes;
    uint64_t max_url_bytes;
    uint64_t max_body_bytes;
    uint64_t header_timeout_ms;
    uint64_t idle_timeout_ms;
} pl_http_limits;

/* Returns a new server context bound to no address, or NULL when out of
 * memory. <app> is passed to every callback. */
pl_http *pl_http_new(uv_loop_t *loop, const pl_http_limits *limits,
                     const pl_http_callbacks *cb, void *app);

/* Replaces the limits (a live reload). Size limits apply to requests parsed
 * from now on; the new timeouts to every connection waiting now. */
void pl_http_set_limits(pl_http *h, const pl_http_limits *limits);

/* Most addresses one server context listens on. */
#define PL_HTTP_LISTENERS_MAX 8

/* Listens on <addr> too (each call adds a listener; <flags> as for
 * uv_tcp_bind, e.g. UV_TCP_IPV6ONLY). Returns 0 and sets *bound_port, or a
 * negative libuv error (the failed listener is closed; the others stay). */
int pl_http_listen(pl_http *h, const struct sockaddr *addr, unsigned flags,
                   uint16_t *bound_port);

/* Keeps accepting and serving, but closes every connection once it has
 * been answered: clients open new ones, which a load balancer sends
 * elsewhere once this instance is out of rotation. What a drain delay
 * begins with, so that the drain finds few idle connections a client may
 * be sending on as they close. Idle ones are left open: closing one races
 * a request the client may be writing on it. */
void pl_http_wind_down(pl_http *h);

/* Stops accepting, closes idle connections (but those holding application
 * data: see pl_conn_release()), and lets requests in progress finish; every
 * answer from now on closes its connection. <done>(<arg>)
 * runs once no connection is left (possibly before this returns). */
void pl_http_drain(pl_http *h, void (*done)(void *arg), void *arg);

/* Closes every connection at once (the drain deadline passed). */
void pl_http_close_all(pl_http *h);

/* Closes the listener and timers; the loop must then run until they are
 * closed, before pl_http_free(). */
void pl_http_stop(pl_http *h);
void pl_http_free(pl_http *h);

uint64_t pl_http_connections(const pl_http *h);

/* Why connections were refused: over max_connections (answered 503), or
 * out of file descriptors (EMFILE/ENFILE: accepted and closed at once). */
enum { PL_HTTP_REFUSED_MAX_CONNECTIONS = 0, PL_HTTP_REFUSED_FD_LIMIT, PL_HTTP_REFUSED__COUNT };

/* Connections refused for <reason> since start. */
uint64_t pl_http_refused(const pl_http *h, unsigned reason);

/* Longest extra header lines pl_conn_respond() takes, in bytes. */
#define PL_CONN_EXTRA_MAX 384

/* Sends a response with <status>, optional Content-Type, optional extra
 * header lines (each ending in \r\n; PL_CONN_EXTRA_MAX bytes at most) and
 * <body>. The bytes are copied if the
 * socket cannot take them at once. Returns 0 when the socket accepted or
 * queued them, -EPIPE when the connection is already failed or closing
 * (then nothing was sent), or another negative errno when the write failed
 * (the connection is then closing). */
int pl_conn_respond(pl_conn *c, int status, const char *content_type,
                    const char *extra_headers, const char *body, size_t len);

/* pl_conn_respond() with a JSON <json> body (a NUL-terminated string), or
 * with {"error":"<msg>"} (<msg> a short string of the server's own, no
 * quote or backslash in it). */
int pl_conn_respond_json(pl_conn *c, int status, const char *json);
int pl_conn_respond_error(pl_conn *c, int status, const char *msg);

/* Closes <c> without a response. */
void pl_conn_close(pl_conn *c);

/* Closes <c> with a reset (RST), dropping whatever it has not yet sent, so
 * no stale bytes reach the client later. */
void pl_conn_abort(pl_conn *c);

/* Whether the client's TCP stack has acknowledged every byte written to <c>:
 * returns 0 when it has, -EAGAIN while bytes are still unsent or
 * unacknowledged (a connection reset meanwhile included), another negative
 * errno when the kernel cannot be asked. One system call. */
int pl_conn_acknowledged(const pl_conn *c);

/* Fills <t> with what the kernel knows of <c>'s TCP connection (tcp.h:
 * three system calls, for the rare paths), libuv's own queue counted as
 * unsent. The counts stay valid after a reset. Returns 0, or a negative
 * errno when the kernel cannot be asked. */
int pl_conn_tcp_info(const pl_conn *c, pl_tcp_facts *t);

/* Sends <c>'s peer a keepalive probe now, if the connection has been idle
 * a second or more (else once it has): a live peer answers it within a
 * round trip, which pl_conn_tcp_info() shows as probes == 0. From then on
 * the connection is probed each second it is idle. */
void pl_conn_probe(pl_conn *c);

/* The request pending on <c> may wait long for its answer (a parked
 * poll): at most one small request is kept behind it; if more comes, all
 * of it is dropped, and <c> closes once the answer is sent, so what a
 * client sends behind a parked poll costs nothing while it waits. */
void pl_conn_park(pl_conn *c);

/* Holds <c> open for its owner: requests arriving on it are kept, not
 * read (PL_CONN_EV_DATA), and an end from its peer neither closes it nor
 * settles anything (PL_CONN_EV_END); no timeout applies. Until
 * pl_conn_release() or a close. */
void pl_conn_hold(pl_conn *c);

/* How the peer ended a held connection: 0 (it has not), or one of: */
enum { PL_CONN_END_EOF = 1, PL_CONN_END_RESET, PL_CONN_END_FAILED };
int pl_conn_ended(const pl_conn *c);

/* 1 when <c>'s peer has hung up although its reader has not yet seen it:
 * an EOF or a reset waits in the socket, with no data ahead of it. Costs one
 * recv(MSG_PEEK); for the rare paths that must tell a gone peer from a live
 * one before the loop gets to its EOF. */
int pl_conn_peer_gone(const pl_conn *c);

/* The request pending on <c> outlives a half-close: should the peer's EOF
 * arrive first, reading stops, the answer (and any pipelined ones) is still
 * sent, then <c> closes. For the current request only: a parked poll's EOF
 * must still settle it as a disconnect. */
void pl_conn_hold_on_eof(pl_conn *c);

/* The owner's switch for ACK reports on <c>, and its state. Set to
 * PL_CONN_REPORTS_ON, each write that the socket takes whole asks the
 * kernel to report when <c>'s peer has acknowledged its last byte, which
 * comes as PL_CONN_EV_ACKED (SO_TIMESTAMPING with TX_ACK, set on the socket
 * the first time); set to anything else (0-3, values of the owner's own),
 * no write asks. The transport decides nothing about when to ask. */
enum {
    PL_CONN_REPORTS_ON = 1,
    PL_CONN_REPORT_DUE = 4,      /* in pl_conn_reports(): the last byte
                                  * written asked for a report not yet come */
    PL_CONN_REPORTS_REFUSED = 8, /* the kernel refused reports on <c>: none
                                  * comes (ask pl_conn_acknowledged()) */
};

/* Sets the switch to <value>. Returns 0, or a negative errno when the
 * kernel refuses reports on <c> (then none comes). */
int pl_conn_set_reports(pl_conn *c, unsigned value);

/* The switch's value, with PL_CONN_REPORT_DUE and PL_CONN_REPORTS_REFUSED. */
unsigned pl_conn_reports(const pl_conn *c);

/* Turns on TCP keepalive and TCP_USER_TIMEOUT for <c> (once per connection;
 * later calls do nothing), so a peer that vanished without FIN or RST is
 * found while <c> waits. Zero values leave the system's defaults. */
void pl_conn_detect_dead_peer(pl_conn *c, unsigned idle_s, unsigned interval_s,
                              unsigned count, unsigned user_timeout_ms);

/* Fills <ss> with <c>'s peer address (one system call). Returns 0, or a
 * negative errno. */
int pl_conn_peer_address(const pl_conn *c, struct sockaddr_storage *ss);

/* The <app> pointer of the server <c> belongs to. */
void *pl_conn_app(const pl_conn *c);

/* Tags the current request (e.g. with its route) for on_response. */
void pl_conn_set_tag(pl_conn *c, unsigned tag);

/* During on_request for <c>: hands the bytes the request's views point into
 * over to <out> (freed with pl_buf_free()), so the application can keep
 * them past the call without copying. Returns 0, or -ENOENT when there are none. */
int pl_conn_take_request(pl_conn *c, pl_buf *out);

/* Makes <obj> the owner of <c>, with <ops> (a static table that lives as
 * long as the process; a process has at most seven kinds of owner); NULL
 * clears it. */
void pl_conn_set_owner(pl_conn *c, void *obj, pl_conn_owner *ops);

/* Clears <c>'s owner, as the end of what held it open, and lets go of a
 * held <c>: what arrived while it was held is read now; one its peer ended
 * is closed. While the server drains (pl_http_drain() leaves owned
 * connections be), an idle <c> is closed then. */
void pl_conn_release(pl_conn *c);

/* ---- a binary upgrade hands sockets over (see handover.h) ---- */

/* Takes the open connection socket <fd> into <h>: parked (an answer is
 * pending, as for a request handed to on_request; <keep_alive> says whether
 * that request allowed keep-alive) or idle keep-alive. <fd> is consumed
 * either way. Returns the connection, or NULL (out of memory, or libuv
 * refused <fd>). */
pl_conn *pl_http_adopt(pl_http *h, int fd, int parked, int keep_alive);

/* Takes the listening socket <fd> into <h> as one more listener (consumed
 * either way) and accepts on it. Returns 0 and sets *bound_port, or a
 * negative libuv error. */
int pl_http_adopt_listener(pl_http *h, int fd, uint16_t *bound_port);

/* Listener <i>'s descriptor (0 <= i < pl_http_listener_count), or -EBADF
 * when it does not listen. */
int pl_http_listener_fd(const pl_http *h, int i);
int pl_http_listener_count(const pl_http *h);

/* <c>'s descriptor when it can be handed over whole (no request part-way
 * in, nothing buffered either way, not closing), else -EBUSY. */
int pl_conn_handover_fd(const pl_conn *c);

/* Whether <c>'s current request allows keep-alive. */
int pl_conn_keep_alive(const pl_conn *c);

/* While another process may be taking <c>'s socket over: <c> reads
 * nothing (the bytes would be the other's) and leaves its timer list
 * (nothing closes it here meanwhile). Returns what pl_conn_thaw() needs. */
int pl_conn_freeze(pl_conn *c);

/* Undoes pl_conn_freeze(<c>), given what it returned: <c> reads again (an
 * EOF that came meanwhile is seen then) and, if it was waiting for a
 * request, times out afresh. */
void pl_conn_thaw(pl_conn *c, int frozen);

/* Calls <fn> for each idle connection that can be handed over (holding no
 * application data). Returns how many. */
size_t pl_http_each_idle(pl_http *h, void (*fn)(pl_conn *c, void *arg), void *arg);

/* Bytes a connection costs the server while it waits (struct sizes). */
size_t pl_conn_size(void);

#endif
