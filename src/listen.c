/* listen.c -- listening sockets and accepting on them, the file-descriptor
 * limit included. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport.h"
#include "pilotlight/log.h"

#define ACCEPT_BATCH 32     /* per wake-up: fairness, and a backlog is not all held at once */
#define ACCEPT_PAUSE_MS 100 /* after an accept error that would persist */

static void accept_cb(uv_poll_t *p, int status, int events);

/* Takes the accepted socket <fd> as a new connection. */
static void conn_open(pl_http *h, int fd)
{
    pl_conn *c = pl__conn_from_fd(h, fd);

    if (c == NULL) {
        PL_LOG(PL_LOG_ERROR, "cannot take an accepted connection", NULL);
        return;
    }
    pl__conn_start(c, TL_REQUEST);
    if (c->closing) {
        return;
    } else if (h->draining) {
        pl__conn_refuse(c, 503, "too many connections");
    } else if (h->nconns > h->limits.max_connections) {
        h->refused[PL_HTTP_REFUSED_MAX_CONNECTIONS]++;
        pl__conn_refuse(c, 503, "too many connections");
    }
}

static void accept_resume(uv_timer_t *t)
{
    pl_http *h = container_of(t, pl_http, accept_timer);

    for (int i = 0; i < h->nlisteners && h->listening; i++)
        if (h->listeners[i].fd >= 0)
            uv_poll_start(&h->listeners[i].poll, UV_READABLE, accept_cb);
}

/* A listener stays readable while the cause lasts: wait instead of waking
 * up for it again and again. */
static void accept_pause(pl_listener *l)
{
    uv_poll_stop(&l->poll);
    uv_timer_start(&l->http->accept_timer, accept_resume, ACCEPT_PAUSE_MS, 0);
}

/* Out of descriptors with connections waiting. The spare descriptor is given
 * up to accept each of them and close it at once: its client hears "no" now
 * instead of hanging in the backlog, and the listener does not wake the loop
 * again and again for connections it cannot take. With no spare to give
 * (a system-wide shortage took it), accepting pauses briefly instead. */
static void shed(pl_listener *l, int cause)
{
    pl_http *h = l->http;
    uint64_t now = uv_now(h->loop), before = h->refused[PL_HTTP_REFUSED_FD_LIMIT];
    int fd, err = cause, n = 0;

    if (h->spare_fd >= 0) {
        close(h->spare_fd);
        /* Bounded like accepting: what is left wakes the loop again. */
        while (n++ < ACCEPT_BATCH &&
               ((fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC)) >= 0 ||
                errno == EINTR || errno == ECONNABORTED)) {
            if (fd >= 0) {
                close(fd);
                h->refused[PL_HTTP_REFUSED_FD_LIMIT]++;
            }
        }
        err = n > ACCEPT_BATCH ? EAGAIN : errno;
        h->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if ((err != EAGAIN && err != EWOULDBLOCK) || h->spare_fd < 0)
        accept_pause(l);
    if (now - h->last_accept_error >= 1000) {
        h->last_accept_error = now;
        PL_LOG(PL_LOG_WARN, "out of file descriptors: connections refused",
               "\"refused\":%llu,\"error\":\"%s\"",
               (unsigned long long)(h->refused[PL_HTTP_REFUSED_FD_LIMIT] - before),
               strerror(cause));
    }
}

static void accept_cb(uv_poll_t *p, int status, int events)
{
    pl_listener *l = container_of(p, pl_listener, poll);

    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < ACCEPT_BATCH && l->http->listening; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            conn_open(l->http, fd);
        } else if (errno == EMFILE || errno == ENFILE) {
            shed(l, errno);
            return;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return; /* none left */
        } else if (errno != EINTR && errno != ECONNABORTED && errno != EPROTO) {
            PL_LOG(PL_LOG_WARN, "accept failed", "\"error\":\"%s\"", strerror(errno));
            accept_pause(l); /* ENOMEM, ENOBUFS: a while may help */
            return;
        }
    }
}

/* A new listener slot of <h>; NULL when <h> has its most. */
static pl_listener *listener_new(pl_http *h)
{
    pl_listener *l;

    if (h->nlisteners == PL_HTTP_LISTENERS_MAX)
        return NULL;
    l = &h->listeners[h->nlisteners++];
    l->fd = -1;
    l->http = h;
    return l;
}

/* Accepts on the listening socket <fd> from now on (it is <l>'s to close).
 * Returns 0 and sets *bound_port, or a negative errno (as libuv's errors are
 * on Unix); then <fd> is closed, the other listeners stay. */
static int listener_start(pl_listener *l, int fd, uint16_t *bound_port)
{
    pl_http *h = l->http;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int rc;

    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0 || listen(fd, 4096) != 0)
        rc = -errno;
    else
        rc = uv_poll_init_socket(h->loop, &l->poll, fd);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    l->fd = fd;
    if (h->spare_fd < 0)
        h->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    h->listening = 1;
    uv_poll_start(&l->poll, UV_READABLE, accept_cb);
    *bound_port = ntohs(ss.ss_family == AF_INET
                            ? ((struct sockaddr_in *)&ss)->sin_port
                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return 0;
}

int pl_http_listen(pl_http *h, const struct sockaddr *addr, unsigned flags,
                   uint16_t *bound_port)
{
    pl_listener *l = listener_new(h);
    int fd, on = 1, v6only = (flags & UV_TCP_IPV6ONLY) != 0;

    if (l == NULL)
        return UV_ENOBUFS;
    fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    /* Set either way, as libuv does: [::] alone is dual-stack whatever the
     * host's net.ipv6.bindv6only says. */
    if (addr->sa_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    if (bind(fd, addr, addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                   : sizeof(struct sockaddr_in)) != 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return listener_start(l, fd, bound_port);
}

int pl_http_adopt_listener(pl_http *h, int fd, uint16_t *bound_port)
{
    pl_listener *l = listener_new(h);

    if (l == NULL) {
        close(fd);
        return UV_ENOBUFS;
    }
    return listener_start(l, fd, bound_port);
}

int pl_http_listener_fd(const pl_http *h, int i)
{
    return h->listening && i < h->nlisteners ? h->listeners[i].fd : -EBADF;
}

int pl_http_listener_count(const pl_http *h)
{
    return h->nlisteners;
}

void pl__listeners_close(pl_http *h)
{
    h->listening = 0;
    for (int i = 0; i < h->nlisteners; i++) {
        pl_listener *l = &h->listeners[i];
        if (l->fd < 0)
            continue;
        /* A failed start's walk may have closed the handle already. */
        if (!uv_is_closing((uv_handle_t *)&l->poll))
            uv_close((uv_handle_t *)&l->poll, NULL);
        close(l->fd); /* safe at once: uv_close stopped polling it */
        l->fd = -1;
    }
    if (h->spare_fd >= 0)
        close(h->spare_fd);
    h->spare_fd = -1;
}
