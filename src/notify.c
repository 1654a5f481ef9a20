/* notify.c -- tells the service manager how the service is (sd_notify). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/un.h>

#include "pilotlight/notify.h"

int pl_notify(const char *state)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len;
    socklen_t salen;
    int fd, rc;

    if (path == NULL || (path[0] != '/' && path[0] != '@') ||
        (len = strlen(path)) >= sizeof(sa.sun_path))
        return -ENOENT;
    memcpy(sa.sun_path, path, len);
    if (path[0] == '@')
        sa.sun_path[0] = '\0'; /* an abstract socket */
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    rc = sendto(fd, state, strlen(state), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) < 0
             ? -errno : 0;
    close(fd);
    return rc;
}
