/* tcp.h -- what the kernel knows of a TCP socket, and the few things it
 * can be asked to do for one: ACK reports, the send queue's counts,
 * TCP_INFO, keepalive and its probes, a reset instead of a FIN.
 *
 * On descriptors, no event loop: the transport (conn.c) calls these for its
 * connections, and a unit test can on any socket. Every function returns 0
 * or a negative errno unless it says otherwise. */
#ifndef PILOTLIGHT_TCP_H
#define PILOTLIGHT_TCP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Turns on ACK reports for <fd>: a write made with pl_tcp_send_reported()
 * is reported on the socket's error queue once the peer has acknowledged
 * its last byte (SO_TIMESTAMPING, TX_ACK; offsets counted from the bytes
 * written when this was called). */
int pl_tcp_watch_acks(int fd);

/* Writes <n> buffers to <fd> without blocking and asks for an ACK report
 * of their last byte. Returns the bytes written, -EAGAIN when none could be,
 * -EINVAL when the kernel refuses the report (write again without it), or
 * another negative errno. */
ssize_t pl_tcp_send_reported(int fd, const struct iovec *iov, int n);

/* Takes one message off <fd>'s error queue. Returns 0 and sets *offset to
 * the byte offset an ACK report in it covers, -ENOMSG when it held no ACK
 * report, -EAGAIN when the queue was empty. One per call: a longer queue keeps the
 * socket's EPOLLERR raised and is taken on the next turns. */
int pl_tcp_take_ack_report(int fd, uint32_t *offset);

/* Bytes written to <fd> and not acknowledged (SIOCOUTQ), or not yet sent
 * at all (<unsent>: SIOCOUTQNSD), into *n. Both are sequence numbers the
 * kernel keeps in every state: a reset leaves them as they were. */
int pl_tcp_queued(int fd, int unsent, int *n);

typedef struct {
    uint32_t unacked;       /* bytes not yet acknowledged */
    uint32_t unsent;        /* of those, bytes never sent */
    uint32_t rtt_us, rttvar_us; /* smoothed round trip and its variation */
    uint32_t rto_us;        /* retransmission timeout, without back-off */
    uint32_t since_sent_ms; /* since a data segment last left */
    uint8_t closed;         /* the socket is closed: reset, or given up on */
    uint8_t probes;         /* keepalive probes sent and not answered */
} pl_tcp_facts;

/* Fills <f> from TCP_INFO and the send queue's counts (three system
 * calls). */
int pl_tcp_facts_read(int fd, pl_tcp_facts *f);

/* TCP keepalive on <fd>, and TCP_USER_TIMEOUT; a zero value leaves the
 * system's. */
void pl_tcp_keepalive(int fd, unsigned idle_s, unsigned interval_s, unsigned count,
                      unsigned user_timeout_ms);

/* A keepalive probe now, if <fd> has been idle a second or more (else once
 * it has): a keepalive time below the idle time fires at once. */
void pl_tcp_probe(int fd);

/* 1 when <fd>'s peer has hung up (an EOF or a reset waits, with no data
 * ahead of it), else 0: one recv(MSG_PEEK). */
int pl_tcp_peer_gone(int fd);

/* <fd>'s send MSS (TCP_MAXSEG): the payload bytes of its full segments;
 * a negative errno when it cannot be read. */
int pl_tcp_mss(int fd);

/* Makes the next close of <fd> a reset (SO_LINGER 0): whatever it has not
 * sent yet is dropped, not sent after. */
void pl_tcp_reset_on_close(int fd);

#endif
