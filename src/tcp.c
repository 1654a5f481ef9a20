/* tcp.c -- TCP's own facts and mechanics on a socket descriptor. */
#include <errno.h>
#include <string.h>
#include <time.h> /* before linux/errqueue.h, which uses struct timespec */

#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "pilotlight/tcp.h"

/* Counts ACK report offsets from the bytes written when reports were turned
 * on (Linux 6.2+), not from the bytes acknowledged then: the caller's count
 * of bytes written then matches the kernel's. */
#ifndef SOF_TIMESTAMPING_OPT_ID_TCP
#define SOF_TIMESTAMPING_OPT_ID_TCP (1 << 16)
#endif

int pl_tcp_watch_acks(int fd)
{
    /* How reports look; each write asks for its own (TX_ACK). */
    int flags = SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
                SOF_TIMESTAMPING_OPT_ID_TCP | SOF_TIMESTAMPING_OPT_TSONLY;

    return setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags)) == 0 ? 0 : -errno;
}

ssize_t pl_tcp_send_reported(int fd, const struct iovec *iov, int n)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl = {{0}}; /* its padding goes to the kernel too */
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n,
                         .msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    int tx_ack = SOF_TIMESTAMPING_TX_ACK;
    ssize_t r;

    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SO_TIMESTAMPING;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &tx_ack, sizeof(tx_ack));
    do
        r = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    if (r >= 0)
        return r;
    return errno == EWOULDBLOCK || errno == ENOBUFS ? -EAGAIN : -errno;
}

int pl_tcp_take_ack_report(int fd, uint32_t *offset)
{
    union {
        char buf[512];
        struct cmsghdr align;
    } ctl;
    struct msghdr msg = {.msg_control = ctl.buf, .msg_controllen = sizeof(ctl.buf)};
    int rc = -ENOMSG;

    if (recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
        const struct sock_extended_err *ee;
        if (!(cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) &&
            !(cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR))
            continue;
        ee = (const struct sock_extended_err *)(const void *)CMSG_DATA(cm);
        if (ee->ee_errno != ENOMSG || ee->ee_origin != SO_EE_ORIGIN_TIMESTAMPING ||
            ee->ee_info != SCM_TSTAMP_ACK)
            continue;
        *offset = ee->ee_data;
        rc = 0;
    }
    return rc;
}

int pl_tcp_queued(int fd, int unsent, int *n)
{
    *n = 0;
    return ioctl(fd, unsent ? SIOCOUTQNSD : SIOCOUTQ, n) == 0 ? 0 : -errno;
}

int pl_tcp_facts_read(int fd, pl_tcp_facts *f)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    int outq, nsd;

    memset(f, 0, sizeof(*f));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
        return -errno;
    if (pl_tcp_queued(fd, 0, &outq) != 0 || pl_tcp_queued(fd, 1, &nsd) != 0)
        return -errno;
    f->unacked = (uint32_t)outq;
    f->unsent = (uint32_t)nsd;
    f->closed = ti.tcpi_state == TCP_CLOSE;
    f->probes = ti.tcpi_probes;
    f->rtt_us = ti.tcpi_rtt;
    f->rttvar_us = ti.tcpi_rttvar;
    /* tcpi_rto doubles with each timeout in a row: the base is what the
     * next segment's first retransmission waits for. */
    f->rto_us = ti.tcpi_backoff < 31 ? ti.tcpi_rto >> ti.tcpi_backoff : ti.tcpi_rto;
    f->since_sent_ms = ti.tcpi_last_data_sent;
    return 0;
}

void pl_tcp_keepalive(int fd, unsigned idle_s, unsigned interval_s, unsigned count,
                      unsigned user_timeout_ms)
{
    int on = 1, v;

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

void pl_tcp_probe(int fd)
{
    int on = 1, idle = 1;

    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
}

int pl_tcp_peer_gone(int fd)
{
    ssize_t n;
    char b;

    n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

int pl_tcp_mss(int fd)
{
    int mss = 0;
    socklen_t len = sizeof(mss);

    return getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &len) != 0 ? -errno : mss;
}

void pl_tcp_reset_on_close(int fd)
{
    struct linger lg = {1, 0};

    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
}
