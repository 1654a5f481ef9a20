/* notify.h -- the service manager's notifications (systemd's sd_notify
 * protocol, written here: one datagram to NOTIFY_SOCKET). */
#ifndef PILOTLIGHT_NOTIFY_H
#define PILOTLIGHT_NOTIFY_H

/* Sends <state> (e.g. "READY=1", "MAINPID=1234") to the service manager
 * when NOTIFY_SOCKET names one. Returns 0, -ENOENT when there is none, or
 * the negative errno of the send that failed. */
int pl_notify(const char *state);

#endif
