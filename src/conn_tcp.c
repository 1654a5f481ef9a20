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
        /* A kernel taking the option but not the per-write request: no
         * report comes, then or later (pl_conn_reports says so). */
        c->acks = ACKS_REFUSED;
        return uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    }
    return r == -EAGAIN ? UV_EAGAIN : (int)r;
}

/* Takes one report off <c>'s error queue. One per call: a queue holding
 * more keeps EPOLLERR raised and is taken on the next turns, never spinning
 * in place. Returns 0 when it says the peer acknowledged up to ack_want,
 * -ENOMSG when it does not, -EAGAIN when the queue was empty (or another
 * negative errno). */
int pl__conn_take_ack_report(pl_conn *c)
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
        return 0;
    }
    return -ENOMSG;
}

int pl_conn_set_reports(pl_conn *c, unsigned value)
{
    int fd = pl__conn_fd(c), rc;

    c->reports = value & 3;
    if (value != PL_CONN_REPORTS_ON || c->acks != ACKS_OFF)
        return c->acks == ACKS_REFUSED && value == PL_CONN_REPORTS_ON ? -EOPNOTSUPP : 0;
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

unsigned pl_conn_reports(const pl_conn *c)
{
    return c->reports | (c->ack_waiting ? PL_CONN_REPORT_DUE : 0) |
           (c->acks == ACKS_REFUSED ? PL_CONN_REPORTS_REFUSED : 0);
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
