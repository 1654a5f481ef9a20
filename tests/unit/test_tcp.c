/* test_tcp.c -- TCP's facts and mechanics (tcp.h) on real loopback
 * connections made here, without an event loop: ACK reports, the send
 * queue's counts, TCP_INFO, a peer's FIN and reset, keepalive.
 *
 * Loopback acknowledges at once; the waits below only bound how long the
 * test gives the kernel, they assert nothing about speed. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pilotlight/tcp.h"
#include "unit.h"

#define WAIT_MS 10000

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A connected pair over 127.0.0.1: *server accepted, *client connected.
 * The server's end does not block, as the broker's. <client_rcvbuf>, when
 * not 0, is the client's receive buffer (set before connecting, so the
 * window it offers is small). Returns 0, or -1. */
static int pair(int *server, int *client, int client_rcvbuf)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;

    *server = *client = -1;
    if (l < 0)
        return -1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(l, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(l, 4) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &len) != 0) {
        close(l);
        return -1;
    }
    *client = socket(AF_INET, SOCK_STREAM, 0);
    if (client_rcvbuf > 0)
        setsockopt(*client, SOL_SOCKET, SO_RCVBUF, &client_rcvbuf, sizeof(client_rcvbuf));
    if (connect(*client, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        (*server = accept(l, NULL, NULL)) < 0) {
        close(l);
        close(*client);
        return -1;
    }
    close(l);
    fcntl(*server, F_SETFL, fcntl(*server, F_GETFL) | O_NONBLOCK);
    setsockopt(*server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

static void close_pair(int a, int b)
{
    if (a >= 0)
        close(a);
    if (b >= 0)
        close(b);
}

/* Waits until <fd> has an event of <events> (POLLERR always counts). */
static int wait_for(int fd, short events)
{
    struct pollfd p = {.fd = fd, .events = events};
    uint64_t deadline = now_ms() + WAIT_MS;

    while (now_ms() < deadline)
        if (poll(&p, 1, 100) > 0)
            return p.revents;
    return 0;
}

/* Reads from the blocking <fd> until <n> bytes have come. */
static size_t drain(int fd, size_t n)
{
    char buf[65536];
    size_t got = 0;
    ssize_t r;

    while (got < n && (r = recv(fd, buf, sizeof(buf), 0)) > 0)
        got += (size_t)r;
    return got;
}

/* Waits for the next ACK report on <fd>; returns pl_tcp_take_ack_report's
 * answer, with *offset set. */
static int next_report(int fd, uint32_t *offset)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    int rc = -EAGAIN;

    while (now_ms() < deadline) {
        wait_for(fd, 0);
        if ((rc = pl_tcp_take_ack_report(fd, offset)) != -EAGAIN)
            return rc;
    }
    return rc;
}

/* Waits until <fd>'s send queue holds no unacknowledged byte. */
static int queue_empties(int fd)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    int n = -1;

    while (now_ms() < deadline) {
        if (pl_tcp_queued(fd, 0, &n) != 0)
            return 0;
        if (n == 0)
            return 1;
        poll(NULL, 0, 5);
    }
    return 0;
}

/* Writes to the non-blocking <fd> until its send queue is full; returns the
 * bytes written. */
static size_t fill(int fd)
{
    static char chunk[65536];
    size_t sent = 0;
    ssize_t r;

    while ((r = send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL)) > 0)
        sent += (size_t)r;
    return sent;
}

/* Waits until the counts of <fd>'s send queue stay the same for 20 ms: the
 * last segments sent have been answered (a shut window) before they are
 * read twice. */
static void settle(int fd)
{
    uint64_t deadline = now_ms() + WAIT_MS;
    int a = -1, b = -1, a2 = -2, b2 = -2;

    while (now_ms() < deadline && (a != a2 || b != b2)) {
        pl_tcp_queued(fd, 0, &a);
        pl_tcp_queued(fd, 1, &b);
        poll(NULL, 0, 20);
        pl_tcp_queued(fd, 0, &a2);
        pl_tcp_queued(fd, 1, &b2);
    }
}

static void test_ack_reports_cover_the_last_byte(void)
{
    static char payload[3000];
    struct iovec iov[2] = {{payload, 1000}, {payload + 1000, 500}};
    uint32_t offset = 0;
    size_t before;
    int s, c, unacked = 0;

    /* Reports are turned on while bytes written before are still not
     * acknowledged (the client offers a small window and reads nothing):
     * offsets count from the bytes written, not from those acknowledged. */
    CHECK_EQ(pair(&s, &c, 4096), 0);
    before = fill(s);
    CHECK_EQ(pl_tcp_queued(s, 0, &unacked), 0);
    CHECK(unacked > 0);
    CHECK_EQ(pl_tcp_take_ack_report(s, &offset), -EAGAIN); /* nothing asked yet */
    CHECK_EQ(pl_tcp_watch_acks(s), 0);
    CHECK_EQ(drain(c, before), before);
    CHECK(queue_empties(s));
    CHECK_EQ(pl_tcp_take_ack_report(s, &offset), -EAGAIN); /* nor for those */

    CHECK_EQ(pl_tcp_send_reported(s, iov, 2), 1500);
    CHECK_EQ(drain(c, 1500), 1500);
    CHECK_EQ(next_report(s, &offset), 0);
    CHECK_EQ(offset, 1499); /* the offset of the last byte of the write */

    CHECK_EQ(pl_tcp_send_reported(s, iov, 1), 1000);
    CHECK_EQ(drain(c, 1000), 1000);
    CHECK_EQ(next_report(s, &offset), 0);
    CHECK_EQ(offset, 2499);
    /* one report a write: none is left */
    CHECK_EQ(pl_tcp_take_ack_report(s, &offset), -EAGAIN);
    close_pair(s, c);

    CHECK_EQ(pl_tcp_watch_acks(-1), -EBADF);
    CHECK_EQ(pl_tcp_send_reported(-1, iov, 1), -EBADF);
    CHECK_EQ(pl_tcp_take_ack_report(-1, &offset), -EBADF);
}

static void test_send_queue_counts(void)
{
    static char chunk[16384];
    struct iovec iov = {chunk, sizeof(chunk)};
    pl_tcp_facts f;
    size_t sent = 0;
    ssize_t r;
    int s, c, unacked = -1, unsent = -1;

    /* A client that offers a small window and does not read: the server's
     * writes fill its send queue, most of it never sent. */
    CHECK_EQ(pair(&s, &c, 4096), 0);
    CHECK_EQ(pl_tcp_queued(s, 0, &unacked), 0);
    CHECK_EQ(unacked, 0);
    CHECK_EQ(pl_tcp_watch_acks(s), 0);
    while ((r = pl_tcp_send_reported(s, &iov, 1)) > 0)
        sent += (size_t)r;
    CHECK_EQ(r, -EAGAIN); /* a full queue */
    CHECK(sent > 0);
    settle(s);
    CHECK_EQ(pl_tcp_queued(s, 0, &unacked), 0);
    CHECK_EQ(pl_tcp_queued(s, 1, &unsent), 0);
    CHECK(unacked > 0 && (size_t)unacked <= sent);
    CHECK(unsent > 0 && unsent <= unacked); /* the window is shut */
    CHECK_EQ(pl_tcp_facts_read(s, &f), 0);
    CHECK_EQ(f.unacked, (uint32_t)unacked);
    CHECK_EQ(f.unsent, (uint32_t)unsent);

    /* once the peer reads it all, every byte is acknowledged */
    CHECK_EQ(drain(c, sent), sent);
    CHECK(queue_empties(s));
    CHECK_EQ(pl_tcp_queued(s, 1, &unsent), 0);
    CHECK_EQ(unsent, 0);
    close_pair(s, c);

    CHECK_EQ(pl_tcp_queued(-1, 0, &unacked), -EBADF);
    CHECK_EQ(unacked, 0);
}

static void test_facts(void)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    pl_tcp_facts f;
    int s, c;

    CHECK_EQ(pair(&s, &c, 0), 0);
    CHECK_EQ(send(s, "ping", 4, 0), 4);
    CHECK_EQ(drain(c, 4), 4);
    CHECK(queue_empties(s));
    memset(&f, 0xff, sizeof(f));
    CHECK_EQ(pl_tcp_facts_read(s, &f), 0);
    CHECK_EQ(getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
    CHECK_EQ(f.unacked, 0);
    CHECK_EQ(f.unsent, 0);
    /* the kernel's figures, nothing in flight to change them in between */
    CHECK(f.rtt_us > 0);
    CHECK_EQ(f.rtt_us, ti.tcpi_rtt);
    CHECK_EQ(f.rttvar_us, ti.tcpi_rttvar);
    CHECK_EQ(ti.tcpi_backoff, 0);
    CHECK_EQ(f.rto_us, ti.tcpi_rto);
    CHECK(f.rto_us >= 200000); /* Linux's least RTO is 200 ms */
    CHECK(f.since_sent_ms < 60000);
    CHECK_EQ(f.closed, 0);
    CHECK_EQ(f.probes, 0);

    /* a reset closes the socket */
    pl_tcp_reset_on_close(c);
    close(c);
    CHECK(wait_for(s, POLLIN) != 0);
    CHECK_EQ(pl_tcp_facts_read(s, &f), 0);
    CHECK_EQ(f.closed, 1);
    close(s);

    CHECK_EQ(pl_tcp_facts_read(-1, &f), -EBADF);
}

static void test_peer_gone(void)
{
    char b;
    int s, c;

    /* a FIN */
    CHECK_EQ(pair(&s, &c, 0), 0);
    CHECK_EQ(pl_tcp_peer_gone(s), 0); /* nothing yet */
    CHECK_EQ(send(c, "x", 1, 0), 1);
    shutdown(c, SHUT_WR);
    CHECK(wait_for(s, POLLRDHUP) & POLLRDHUP);
    CHECK_EQ(pl_tcp_peer_gone(s), 0); /* data ahead of the FIN */
    CHECK_EQ(pl_tcp_peer_gone(s), 0); /* and a peek leaves it there */
    CHECK_EQ(recv(s, &b, 1, 0), 1);
    CHECK_EQ(pl_tcp_peer_gone(s), 1);
    close_pair(s, c);

    /* a reset */
    CHECK_EQ(pair(&s, &c, 0), 0);
    pl_tcp_reset_on_close(c);
    close(c);
    CHECK(wait_for(s, POLLIN) != 0);
    CHECK_EQ(pl_tcp_peer_gone(s), 1);
    close(s);
}

static void test_reset_on_close(void)
{
    char b;
    int s, c;

    /* the peer reads a reset, not an end of stream */
    CHECK_EQ(pair(&s, &c, 0), 0);
    pl_tcp_reset_on_close(s);
    close(s);
    CHECK(wait_for(c, POLLIN) != 0);
    errno = 0;
    CHECK_EQ(recv(c, &b, 1, 0), -1);
    CHECK_EQ(errno, ECONNRESET);
    close(c);

    /* without it, an ordinary FIN: the peer reads the end */
    CHECK_EQ(pair(&s, &c, 0), 0);
    close(s);
    CHECK_EQ(recv(c, &b, 1, 0), 0);
    close(c);
}

static int opt(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof(v);

    return getsockopt(fd, level, name, &v, &len) == 0 ? v : -1;
}

static void test_keepalive_and_probe(void)
{
    int s, c, idle;

    CHECK_EQ(pair(&s, &c, 0), 0);
    CHECK_EQ(opt(s, SOL_SOCKET, SO_KEEPALIVE), 0);
    idle = opt(s, IPPROTO_TCP, TCP_KEEPIDLE);
    CHECK(idle > 1);
    /* zeros leave the system's values, but keepalive is on */
    pl_tcp_keepalive(s, 0, 0, 0, 0);
    CHECK_EQ(opt(s, SOL_SOCKET, SO_KEEPALIVE), 1);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_KEEPIDLE), idle);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_USER_TIMEOUT), 0);
    pl_tcp_keepalive(s, 30, 5, 3, 10000);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_KEEPIDLE), 30);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_KEEPINTVL), 5);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_KEEPCNT), 3);
    CHECK_EQ(opt(s, IPPROTO_TCP, TCP_USER_TIMEOUT), 10000);

    /* a probe on a socket without keepalive turns it on, due at once */
    CHECK_EQ(opt(c, SOL_SOCKET, SO_KEEPALIVE), 0);
    pl_tcp_probe(c);
    CHECK_EQ(opt(c, SOL_SOCKET, SO_KEEPALIVE), 1);
    CHECK_EQ(opt(c, IPPROTO_TCP, TCP_KEEPIDLE), 1);
    close_pair(s, c);
}

int main(void)
{
    RUN(test_ack_reports_cover_the_last_byte);
    RUN(test_send_queue_counts);
    RUN(test_facts);
    RUN(test_peer_gone);
    RUN(test_reset_on_close);
    RUN(test_keepalive_and_probe);
    return unit_finish();
}
