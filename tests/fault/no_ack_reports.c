/* no_ack_reports.c -- LD_PRELOAD shim for tests: the kernel "refuses"
 * SO_TIMESTAMPING, as an old or restricted one would, so pilotlight's
 * fallback to polling for a controller's ACK can be tested. By default the
 * socket option is refused; with PL_NO_ACK_REPORTS=write the option is
 * taken but a write asking for a report (SO_TIMESTAMPING in a control
 * message) fails with EINVAL, as on kernels before per-write requests.
 * With PL_ACK_REQUEST_LOG=FILE nothing is refused: each write that asks for
 * a report appends a byte to FILE, so a test can count them. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_TIMESTAMPING_NEW
#define SO_TIMESTAMPING_NEW 65
#endif

enum { REFUSE_OPTION, REFUSE_WRITES, LOG_REQUESTS };

static int mode(void)
{
    const char *m = getenv("PL_NO_ACK_REPORTS");

    if (getenv("PL_ACK_REQUEST_LOG") != NULL)
        return LOG_REQUESTS;
    return m != NULL && strcmp(m, "write") == 0 ? REFUSE_WRITES : REFUSE_OPTION;
}

static int is_timestamping(int level, int name)
{
    return level == SOL_SOCKET && (name == SO_TIMESTAMPING || name == SO_TIMESTAMPING_NEW);
}

static void log_request(void)
{
    const char *path = getenv("PL_ACK_REQUEST_LOG");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);

    if (fd >= 0) {
        (void)!write(fd, "r", 1);
        close(fd);
    }
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    static int (*real)(int, int, int, const void *, socklen_t);

    if (is_timestamping(level, name) && mode() == REFUSE_OPTION) {
        errno = EINVAL;
        return -1;
    }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "setsockopt");
    return real(fd, level, name, val, len);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
    static ssize_t (*real)(int, const struct msghdr *, int);
    int m = mode();

    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); m != REFUSE_OPTION && cm != NULL;
         cm = CMSG_NXTHDR((struct msghdr *)msg, cm))
        if (is_timestamping(cm->cmsg_level, cm->cmsg_type)) {
            if (m == LOG_REQUESTS) {
                log_request();
            } else {
                errno = EINVAL;
                return -1;
            }
        }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "sendmsg");
    return real(fd, msg, flags);
}
