/* floor.c -- pl-floor: the least a warm-start broker can do per cycle, as a
 * reference for loadtest/bench. One thread, one epoll set: a GET parks on
 * its key (four x-trigger-* header values), a POST hands its dequeuedMessage
 * bytes to the oldest GET parked on the same key (found by plain substring
 * search in the body) and answers {"didWarmStart":true|false}. It checks
 * HTTP framing (request head, Content-Length) and nothing else: no header
 * limits, no JSON validation, no timeouts, no metrics. Not a product.
 *
 *   pl-floor [--host 127.0.0.1] --port N */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define IN_CAP 65536
#define KEY_MAX 256
#define BUCKETS 4096

typedef struct conn conn;
struct conn {
    int fd;
    conn *qnext;          /* in its key's queue while parked */
    struct slot *slot;    /* the key it is parked on, or NULL */
    char *out;            /* bytes the socket did not take yet */
    size_t out_len;
    size_t in_len;
    char in[IN_CAP];
};

/* One key's FIFO of parked GETs, in a chained hash table. */
typedef struct slot {
    struct slot *next;
    conn *head, *tail;
    size_t key_len;
    char key[KEY_MAX];
} slot;

static slot *table[BUCKETS];
static int ep;
/* Connections dropped during one epoll batch: freed after it, as a later
 * event of the same batch may still name one. */
static conn *dead;

static uint32_t hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static slot *lookup(const char *key, size_t n, int create)
{
    slot **b = &table[hash(key, n) % BUCKETS], *s;
    for (s = *b; s; s = s->next)
        if (s->key_len == n && memcmp(s->key, key, n) == 0)
            return s;
    if (!create || n > KEY_MAX || (s = calloc(1, sizeof(*s))) == NULL)
        return NULL;
    memcpy(s->key, key, n);
    s->key_len = n;
    s->next = *b;
    *b = s;
    return s;
}

static void unpark(conn *c)
{
    slot *s = c->slot;
    conn **p;
    if (s == NULL)
        return;
    for (p = &s->head; *p != c; p = &(*p)->qnext)
        ;
    *p = c->qnext;
    if (s->tail == c) {
        s->tail = NULL;
        for (conn *x = s->head; x; x = x->qnext)
            s->tail = x;
    }
    c->slot = NULL;
    c->qnext = NULL;
}

static void drop(conn *c)
{
    unpark(c);
    close(c->fd);
    c->fd = -1;
    c->qnext = dead;
    dead = c;
}

/* Writes head + body; keeps what the socket does not take. -1: failed. */
static int send2(conn *c, const char *h, size_t hl, const char *b, size_t bl)
{
    struct iovec iov[2] = {{(void *)h, hl}, {(void *)b, bl}};
    ssize_t n = c->out_len ? 0 : writev(c->fd, iov, bl ? 2 : 1);
    size_t done;
    char *o;
    if (n < 0 && errno != EAGAIN)
        return -1;
    done = n < 0 ? 0 : (size_t)n;
    if (done == hl + bl)
        return 0;
    if ((o = realloc(c->out, c->out_len + hl + bl - done)) == NULL)
        return -1;
    c->out = o;
    for (int i = 0; i < 2; i++) {
        size_t skip = done < iov[i].iov_len ? done : iov[i].iov_len;
        memcpy(c->out + c->out_len, (char *)iov[i].iov_base + skip, iov[i].iov_len - skip);
        c->out_len += iov[i].iov_len - skip;
        done -= skip;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    return epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static int reply(conn *c, const char *status, const char *body, size_t bl)
{
    char head[160];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                     status, bl);
    return send2(c, head, (size_t)n, body, bl);
}

/* The value of header <name> in the head [p, end), or NULL. */
static const char *header(const char *p, const char *end, const char *name, size_t *len)
{
    size_t nl = strlen(name);
    for (;;) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (eol == NULL || eol == p)
            return NULL;
        if ((size_t)(eol - p) > nl && p[nl] == ':' && strncasecmp(p, name, nl) == 0) {
            const char *v = p + nl + 1;
            while (v < eol && *v == ' ')
                v++;
            *len = (size_t)(eol - v);
            return v;
        }
        p = eol + 2;
    }
}

/* Appends the value after <field> (a quoted string or a bare number), found
 * after <within> in the body, to the key. */
static size_t body_field(const char *b, size_t bl, const char *within, const char *field,
                         char *key, size_t at)
{
    const char *p = memmem(b, bl, within, strlen(within)), *e;
    if (p == NULL || (p = memmem(p, bl - (size_t)(p - b), field, strlen(field))) == NULL)
        return at;
    p += strlen(field);
    for (e = p; e < b + bl && *e != '"' && *e != ',' && *e != '}'; e++)
        ;
    if (at + (size_t)(e - p) + 1 >= KEY_MAX)
        return at;
    memcpy(key + at, p, (size_t)(e - p));
    at += (size_t)(e - p);
    key[at++] = '\0';
    return at;
}

static int on_get(conn *c, const char *head, const char *end)
{
    static const char *const names[4] = {"x-trigger-deployment-id", "x-trigger-deployment-version",
                                         "x-trigger-machine-cpu", "x-trigger-machine-memory"};
    char key[KEY_MAX];
    size_t kl = 0, vl;
    slot *s;
    for (int i = 0; i < 4; i++) {
        const char *v = header(head, end, names[i], &vl);
        if (v == NULL || kl + vl + 1 >= KEY_MAX)
            return reply(c, "400 Bad Request", "{}", 2);
        memcpy(key + kl, v, vl);
        kl += vl;
        key[kl++] = '\0';
    }
    if ((s = lookup(key, kl, 1)) == NULL)
        return -1;
    c->slot = s;
    if (s->tail)
        s->tail->qnext = c;
    else
        s->head = c;
    s->tail = c;
    return 0;
}

static int on_post(conn *c, const char *body, size_t bl)
{
    static const char yes[] = "{\"didWarmStart\":true}", no[] = "{\"didWarmStart\":false}";
    const char *colon = memchr(body, ':', bl), *last = body + bl;
    char key[KEY_MAX];
    size_t kl = 0;
    slot *s;
    kl = body_field(body, bl, "\"deployment\":{", "\"friendlyId\":\"", key, kl);
    kl = body_field(body, bl, "\"backgroundWorker\":{", "\"version\":\"", key, kl);
    kl = body_field(body, bl, "\"machine\":{", "\"cpu\":", key, kl);
    kl = body_field(body, bl, "\"machine\":{", "\"memory\":", key, kl);
    while (last > body && last[-1] != '}')
        last--;
    s = colon && last > colon + 1 ? lookup(key, kl, 0) : NULL;
    while (s && s->head) {
        conn *w = s->head;
        unpark(w);
        if (reply(w, "200 OK", colon + 1, (size_t)(last - 1 - (colon + 1))) == 0)
            return reply(c, "200 OK", yes, sizeof(yes) - 1);
        drop(w);
    }
    return reply(c, "200 OK", no, sizeof(no) - 1);
}

/* Handles every complete request in c->in. -1: close the connection. */
static int on_input(conn *c)
{
    size_t off = 0;
    while (c->slot == NULL) {
        char *p = c->in + off, *end = memmem(p, c->in_len - off, "\r\n\r\n", 4), *hdrs;
        size_t cl = 0, vl, total;
        const char *v;
        if (end == NULL)
            break;
        hdrs = (char *)memchr(p, '\n', (size_t)(end + 4 - p)) + 1; /* after the request line */
        if ((v = header(hdrs, end + 2, "content-length", &vl)))
            cl = strtoul(v, NULL, 10);
        total = (size_t)(end + 4 - p) + cl;
        if (total > IN_CAP)
            return -1;
        if (c->in_len - off < total)
            break;
        if (strncmp(p, "GET ", 4) == 0) {
            if (on_get(c, hdrs, end + 2) != 0)
                return -1;
        } else if (strncmp(p, "POST ", 5) == 0) {
            if (on_post(c, end + 4, cl) != 0)
                return -1;
        } else if (reply(c, "404 Not Found", "{}", 2) != 0) {
            return -1;
        }
        off += total;
    }
    if (off > 0) {
        memmove(c->in, c->in + off, c->in_len - off);
        c->in_len -= off;
    }
    return c->in_len == IN_CAP ? -1 : 0;
}

static void on_writable(conn *c)
{
    ssize_t n = write(c->fd, c->out, c->out_len);
    if (n < 0) {
        if (errno != EAGAIN)
            drop(c);
        return;
    }
    memmove(c->out, c->out + n, c->out_len - (size_t)n);
    if ((c->out_len -= (size_t)n) == 0) {
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
    }
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 8080, one = 1, lfd;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    struct epoll_event ev = {.events = EPOLLIN}, evs[256];

    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0)
            port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--host") == 0)
            host = argv[i + 1];
    }
    signal(SIGPIPE, SIG_IGN);
    sa.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1 ||
        (lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0)) < 0 ||
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(lfd, 4096) != 0 ||
        (ep = epoll_create1(0)) < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev) != 0) {
        perror("pl-floor");
        return 1;
    }
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            conn *c = evs[i].data.ptr;
            if (c != NULL && c->fd < 0)
                continue; /* dropped earlier in this batch */
            if (c == NULL) {
                int fd;
                while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if ((c = malloc(sizeof(*c))) == NULL) {
                        close(fd);
                        continue;
                    }
                    memset(c, 0, offsetof(conn, in));
                    c->fd = fd;
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
                    struct epoll_event cev = {.events = EPOLLIN, .data.ptr = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &cev);
                }
                continue;
            }
            if (evs[i].events & EPOLLOUT) {
                on_writable(c);
                continue; /* c may be gone; a read waits for the next turn */
            }
            ssize_t r = read(c->fd, c->in + c->in_len, IN_CAP - c->in_len);
            if (r == 0 || (r < 0 && errno != EAGAIN) || (r > 0 && (c->in_len += (size_t)r,
                                                                  on_input(c) != 0)))
                drop(c);
        }
        while (dead != NULL) {
            conn *c = dead;
            dead = c->qnext;
            free(c->out);
            free(c);
        }
    }
}
