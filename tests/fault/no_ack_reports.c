/* no_ack_reports.c -- LD_PRELOAD shim for tests: the kernel "refuses"
 * SO_TIMESTAMPING, as an old or restricted one would, so pilotlight's
 * fallback to polling for a controller's ACK can be tested. */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>

#ifndef SO_TIMESTAMPING_NEW
#define SO_TIMESTAMPING_NEW 65
#endif

int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
    static int (*real)(int, int, int, const void *, socklen_t);

    if (level == SOL_SOCKET && (name == SO_TIMESTAMPING || name == SO_TIMESTAMPING_NEW)) {
        errno = EINVAL;
        return -1;
    }
    if (real == NULL)
        *(void **)&real = dlsym(RTLD_NEXT, "setsockopt");
    return real(fd, level, name, val, len);
}
