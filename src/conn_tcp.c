/* conn_tcp.c -- what TCP knows of a connection: its ACK reports (which of
 * its bytes a report covers, which writes ask for one), its send queue,
 * its peer's end, keepalive. */
#include <errno.h>

#include <sys/uio.h>

#include "transport.h"
#include "pilotlight/tcp.h"

/* As uv_try_write() for <n> (at most 2) buffers while nothing is queued,
 * asking the kernel for a report when the peer has acknowledged the last
 * byte: per write, so writes not asking cost nothing. Returns the bytes
 * written, UV_EAGAIN, or a negative error. */
int pl__conn_write_reported(pl_conn *c, const uv_buf_t *bufs, unsigned n)
{
    struct iovec iov[2];
    ssize_t r;
    int fd = pl__conn_fd(c);

    if (fd < 0)
        return UV_EBADF;
    for (unsigned i = 0; i < n; i++)
        iov[i] = (struct iovec){bufs[i].base, bufs[i].len};
    r = pl_tcp_send_reported(fd, iov, (int)n);
    if (r == -EINVAL) {
        /* A kernel taking the option but not the per-write request. */
        c->acks = ACKS_REFUSED_NEW;
        c->reported = 0;
        return uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    }
    return r == -EAGAIN ? UV_EAGAIN : (int)r;
}

/* Takes one report off <c>'s error queue. One per call: a queue holding
 * more keeps EPOLLERR raised and is taken on the next turns, never spinning
 * in place. <with_request>: the report came with bytes of a request.
 * Returns 0 when it says the peer acknowledged up to ack_want, -ENOMSG when
 * it does not, -EAGAIN when the queue was empty (or another negative errno). */
int pl__conn_take_ack_report(pl_conn *c, int with_request)
{
    uint32_t offset;
    int fd = pl__conn_fd(c), rc;

    if (fd < 0)
        return -EBADF;
    if ((rc = pl_tcp_take_ack_report(fd, &offset)) != 0)
        return rc;
    /* Offsets wrap at 2^32; a report at or past the wanted one covers it. */
    if (c->ack_waiting && (int32_t)(offset - c->ack_want) >= 0) {
        c->ack_waiting = 0;
        c->acks_ride = with_request != 0;
        return 0;
    }
    return -ENOMSG;
}

int pl_conn_watch_acks(pl_conn *c, int on)
{
    int fd = pl__conn_fd(c), rc;

    if (!on) {
        c->acks_ride = 1;
        return 0;
    }
    if (c->acks != ACKS_OFF)
        return 0;
    c->acks = ACKS_REFUSED;
    if (c->closing || fd < 0)
        return -EBADF;
    if ((rc = pl_tcp_watch_acks(fd)) != 0)
        return rc;
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

/* ---- what TCP knows of it ---- */

int pl_conn_acknowledged(const pl_conn *c)
{
    /* Not c->closing: on_close asks this while the descriptor is open. The
     * count alone: a reset keeps what was unacknowledged counted. */
    int fd = pl__conn_fd(c), n, rc;

    if (fd < 0)
        return -EBADF;
    if (uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp) > 0)
        return -EAGAIN;
    if ((rc = pl_tcp_queued(fd, 0, &n)) != 0)
        return rc;
    return n == 0 ? 0 : -EAGAIN;
}

int pl_conn_tcp_info(const pl_conn *c, pl_tcp_facts *t)
{
    int fd = pl__conn_fd(c);
    uint32_t queued;
    int rc;

    if (fd < 0)
        return -EBADF;
    if ((rc = pl_tcp_facts_read(fd, t)) != 0)
        return rc;
    /* libuv's own queue is bytes not yet sent too */
    queued = (uint32_t)uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
    t->unacked += queued;
    t->unsent += queued;
    return 0;
}

void pl_conn_probe(pl_conn *c)
{
    int fd = pl__conn_fd(c);

    if (!c->closing && fd >= 0)
        pl_tcp_probe(fd);
}

int pl_conn_peer_address(const pl_conn *c, struct sockaddr_storage *ss)
{
    int len = sizeof(*ss);

    return uv_tcp_getpeername(&c->tcp, (struct sockaddr *)ss, &len);
}

int pl_conn_ended(const pl_conn *c)
{
    return c->ended;
}

uint64_t pl_conn_read_delay_max(const pl_conn *c)
{
    const pl_http *h = pl__conn_http(c);

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
    int fd = pl__conn_fd(c);

    return c->closing || c->peer_eof || fd < 0 || pl_tcp_peer_gone(fd);
}

void pl_conn_hold_on_eof(pl_conn *c)
{
    c->eof_holds = 1;
}

void pl_conn_detect_dead_peer(pl_conn *c, unsigned idle_s, unsigned interval_s,
                              unsigned count, unsigned user_timeout_ms)
{
    int fd = pl__conn_fd(c);

    if (c->tuned || fd < 0)
        return;
    c->tuned = 1;
    pl_tcp_keepalive(fd, idle_s, interval_s, count, user_timeout_ms);
}
