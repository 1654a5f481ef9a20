/* handover.c -- the upgrade's wire format and descriptor passing. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/socket.h>

#include "pilotlight/handover.h"

#define MAGIC 0x4f484c50u /* "PLHO" read as little-endian */
#define HEADER_LEN 12

/* A little-endian cursor over a bounded buffer: every put and get checks
 * room, so no field can run past its message. */
typedef struct {
    char *p;
    const char *end;
    int bad;
} cursor;

static void put(cursor *c, const void *v, size_t n)
{
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return;
    }
    memcpy(c->p, v, n);
    c->p += n;
}

static void put_u(cursor *c, uint64_t v, size_t n)
{
    unsigned char b[8];

    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    put(c, b, n);
}

static void put_str(cursor *c, const char *s, size_t len)
{
    if (len > PL_HANDOVER_ID_MAX)
        c->bad = 1;
    put_u(c, len, 2);
    put(c, s, len);
}

static const char *get(cursor *c, size_t n)
{
    const char *p = c->p;

    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return NULL;
    }
    c->p += n;
    return p;
}

static uint64_t get_u(cursor *c, size_t n)
{
    const unsigned char *b = (const unsigned char *)get(c, n);
    uint64_t v = 0;

    for (size_t i = 0; b != NULL && i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

static const char *get_str(cursor *c, size_t *len)
{
    *len = (size_t)get_u(c, 2);
    if (*len > PL_HANDOVER_ID_MAX)
        c->bad = 1;
    return get(c, *len);
}

static void put_double(cursor *c, double d)
{
    uint64_t v;

    memcpy(&v, &d, sizeof(v));
    put_u(c, v, 8);
}

static double get_double(cursor *c)
{
    uint64_t v = get_u(c, 8);
    double d;

    memcpy(&d, &v, sizeof(d));
    return d;
}

int pl_handover_has_fd(unsigned type)
{
    return type == PL_HO_LISTENER || type == PL_HO_PARKED || type == PL_HO_IDLE;
}

static void encode_fields(cursor *c, const pl_handover_rec *r)
{
    put_u(c, r->type, 1);
    put_u(c, r->serves, 1);
    switch (r->type) {
    case PL_HO_PARKED:
        put_u(c, r->keep_alive, 1);
        put_u(c, r->age_ms, 8);
        put_u(c, r->ka_idle_s, 4);
        put_u(c, r->ka_interval_s, 4);
        put_u(c, r->ka_count, 4);
        put_u(c, r->user_timeout_ms, 4);
        put_double(c, r->key.cpu);
        put_double(c, r->key.memory);
        put_str(c, r->key.deployment, r->key.deployment_len);
        put_str(c, r->key.version, r->key.version_len);
        put_str(c, r->id, r->id_len);
        break;
    case PL_HO_FAIL:
        put_str(c, r->id, r->id_len);
        break;
    default:
        put_u(c, r->count, 8);
        break;
    }
}

size_t pl_handover_encode(const pl_handover_rec *recs, size_t n, char *buf, size_t cap)
{
    cursor c = {buf, buf + cap, 0};

    if (n > PL_HANDOVER_BATCH)
        return 0;
    put_u(&c, MAGIC, 4);
    put_u(&c, PL_HANDOVER_VERSION, 2);
    put_u(&c, n, 2);
    put_u(&c, 0, 4); /* body length, filled in below */
    for (size_t i = 0; i < n && !c.bad; i++) {
        char *len_at = c.p;
        put_u(&c, 0, 2);
        encode_fields(&c, &recs[i]);
        if (!c.bad) {
            cursor l = {len_at, len_at + 2, 0};
            put_u(&l, (uint64_t)(c.p - len_at - 2), 2);
        }
    }
    if (c.bad)
        return 0;
    cursor l = {buf + 8, buf + HEADER_LEN, 0};
    put_u(&l, (uint64_t)(c.p - buf - HEADER_LEN), 4);
    return (size_t)(c.p - buf);
}

static int decode_fields(cursor *c, pl_handover_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->fd = -1;
    r->type = (uint8_t)get_u(c, 1);
    r->serves = (uint8_t)get_u(c, 1);
    if (r->type == 0 || r->type >= PL_HO__COUNT)
        return -EPROTO;
    switch (r->type) {
    case PL_HO_PARKED:
        r->keep_alive = (uint8_t)get_u(c, 1);
        r->age_ms = get_u(c, 8);
        r->ka_idle_s = (uint32_t)get_u(c, 4);
        r->ka_interval_s = (uint32_t)get_u(c, 4);
        r->ka_count = (uint32_t)get_u(c, 4);
        r->user_timeout_ms = (uint32_t)get_u(c, 4);
        r->key.cpu = get_double(c);
        r->key.memory = get_double(c);
        r->key.deployment = get_str(c, &r->key.deployment_len);
        r->key.version = get_str(c, &r->key.version_len);
        r->id = get_str(c, &r->id_len);
        break;
    case PL_HO_FAIL:
        r->id = get_str(c, &r->id_len);
        break;
    default:
        r->count = get_u(c, 8);
        break;
    }
    return c->bad ? -EPROTO : 0;
}

int pl_handover_decode(const char *buf, size_t len, pl_handover_rec *recs)
{
    cursor c = {(char *)buf, buf + len, 0};
    uint64_t magic = get_u(&c, 4), version = get_u(&c, 2), n = get_u(&c, 2);
    uint64_t body = get_u(&c, 4);

    if (c.bad || magic != MAGIC || version != PL_HANDOVER_VERSION ||
        n > PL_HANDOVER_BATCH || body != len - HEADER_LEN)
        return -EPROTO;
    for (uint64_t i = 0; i < n; i++) {
        size_t rlen = (size_t)get_u(&c, 2);
        const char *start = get(&c, rlen);
        cursor rc = {(char *)start, start + rlen, 0};

        if (start == NULL || decode_fields(&rc, &recs[i]) != 0 || rc.p != rc.end)
            return -EPROTO;
    }
    return c.p == c.end ? (int)n : -EPROTO;
}

int pl_handover_send(int sock, const pl_handover_rec *recs, size_t n)
{
    char buf[PL_HANDOVER_MSG_MAX];
    char ctl[CMSG_SPACE(sizeof(int) * PL_HANDOVER_BATCH)];
    int fds[PL_HANDOVER_BATCH];
    size_t len = pl_handover_encode(recs, n, buf, sizeof(buf)), nfds = 0;
    struct iovec iov = {buf, len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    if (len == 0)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (pl_handover_has_fd(recs[i].type))
            fds[nfds++] = recs[i].fd;
    if (nfds > 0) {
        struct cmsghdr *cm;
        memset(ctl, 0, sizeof(ctl));
        msg.msg_control = ctl;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0)
        if (errno != EINTR)
            return -errno;
    return 0;
}

static void close_all(const int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
}

int pl_handover_recv(int sock, pl_handover_rec *recs, char *buf)
{
    char ctl[CMSG_SPACE(sizeof(int) * PL_HANDOVER_BATCH)];
    struct iovec iov = {buf, PL_HANDOVER_MSG_MAX};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1,
                         .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    int fds[PL_HANDOVER_BATCH];
    size_t nfds = 0, used = 0;
    ssize_t len;
    int n;

    while ((len = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0)
        if (errno != EINTR)
            return -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (nfds < PL_HANDOVER_BATCH)
                fds[nfds++] = fd;
            else
                close(fd);
        }
    }
    if (len == 0 && nfds == 0)
        return 0;
    n = pl_handover_decode(buf, (size_t)len, recs);
    if (n < 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        close_all(fds, nfds);
        return -EPROTO;
    }
    for (int i = 0; i < n; i++)
        used += pl_handover_has_fd(recs[i].type) != 0;
    if (used != nfds) { /* every such record has exactly one */
        close_all(fds, nfds);
        return -EPROTO;
    }
    used = 0;
    for (int i = 0; i < n; i++)
        if (pl_handover_has_fd(recs[i].type))
            recs[i].fd = fds[used++];
    return n;
}
