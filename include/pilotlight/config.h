/* config.h -- settings: built-in defaults < config file < PILOTLIGHT_* env <
 * command-line flags. One table describes every setting, so the file, env,
 * flags, --help and --check-config can never disagree. */
#ifndef PILOTLIGHT_CONFIG_H
#define PILOTLIGHT_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "pilotlight/cidr.h"

#define PL_CONFIG_HOST_MAX 256
#define PL_CONFIG_STRING_MAX 512
/* The configuration file: at most this many bytes, each line at most
 * PL_CONFIG_LINE_MAX (its newline aside); beyond either it is refused. */
#define PL_CONFIG_FILE_MAX (1024 * 1024)
#define PL_CONFIG_LINE_MAX 1024

typedef struct {
    char host[PL_CONFIG_HOST_MAX]; /* IPv4, IPv6 or a name; "" = not set */
    uint16_t port;
} pl_listen_addr;

typedef struct {
    pl_listen_addr listen;
    pl_listen_addr dispatch_listen; /* dispatch, metrics, admin; "" = on listen */
    uint64_t connection_timeout_ms; /* served by /connect */
    uint64_t keepalive_ms;          /* served by /connect */
    uint64_t park_timeout_ms;       /* 0 in input: connection_timeout + 5 s */
    int match_order;          /* pl_order */
    int delivery;             /* PL_DELIVERY_* */
    uint64_t confirm_timeout_ms;
    uint64_t confirm_wait_max_ms;
    uint64_t tcp_keepalive_idle_s;
    uint64_t tcp_keepalive_interval_s;
    uint64_t tcp_keepalive_count;
    uint64_t tcp_user_timeout_ms;
    uint64_t max_waiters;
    uint64_t max_waiters_per_key;
    uint64_t max_connections;
    uint64_t max_header_bytes;
    uint64_t max_url_bytes;
    uint64_t max_body_bytes;
    uint64_t header_timeout_ms;
    uint64_t idle_timeout_ms;
    uint64_t shutdown_timeout_ms;
    uint64_t drain_delay_ms;
    int token_mode;           /* PL_TOKEN_MODE_* */
    char token_secret[PL_CONFIG_STRING_MAX];      /* never printed or logged */
    char token_secret_file[PL_CONFIG_STRING_MAX]; /* read into token_secret */
    char dispatch_token[PL_CONFIG_STRING_MAX];    /* bearer for dispatch; "" = none */
    char dispatch_allow[PL_CONFIG_STRING_MAX];    /* who may dispatch; "" = anyone */
    pl_cidr_list dispatch_allow_nets;             /* ... as parsed */
    uint64_t dispatch_max_connections;            /* the dispatch listener's own */
    int warm_starts;                              /* PL_WARM_STARTS_* */
    char token_secret_previous[PL_CONFIG_STRING_MAX];      /* rotation; never printed */
    char token_secret_previous_file[PL_CONFIG_STRING_MAX]; /* read into the above */
    char upgrade_binary[PL_CONFIG_STRING_MAX];    /* SIGUSR2 runs it; "" = our own */
    char ring_peers[PL_CONFIG_STRING_MAX];        /* "host:port,..."; "" = no list */
    char ring_dns[PL_CONFIG_STRING_MAX];          /* "name:port"; "" = no name */
    char ring_self[PL_CONFIG_STRING_MAX];         /* this instance, "host:port" */
    uint64_t ring_check_ms;
    uint64_t ring_check_timeout_ms;
    uint64_t ring_resolve_ms;
    uint64_t upgrade_step_timeout_ms; /* each step of the new process, at most */
    int log_level;            /* pl_log_level */
    /* What loading found worth a word but not a refusal (an environment
     * variable that names no setting), one per line; "" = nothing. */
    char notes[512];
} pl_config;

enum { PL_DELIVERY_WRITTEN = 0, PL_DELIVERY_CONFIRM = 1 };
enum { PL_WARM_STARTS_ON = 0, PL_WARM_STARTS_OFF = 1 };
enum { PL_TOKEN_MODE_DISABLED = 0, PL_TOKEN_MODE_LOG, PL_TOKEN_MODE_ENFORCE };

typedef enum {
    PL_CONFIG_RUN = 0,
    PL_CONFIG_HELP,
    PL_CONFIG_VERSION,
    PL_CONFIG_CHECK,
} pl_config_action;

/* Fills <cfg> from defaults, the file named by --config or PILOTLIGHT_CONFIG,
 * <envp> (NULL-terminated "NAME=value" strings) and <argv>. Returns 0 and
 * sets *action; -EINVAL (a setting is invalid), or the negative errno of a
 * file that cannot be read, with a message naming the setting or file in
 * <err>. */
int pl_config_load(pl_config *cfg, int argc, char **argv, char **envp,
                   pl_config_action *action, char *err, size_t errlen);

/* Sets one setting by its file name (e.g. "max_waiters"). Returns 0, or
 * -EINVAL with a message in <err>. */
int pl_config_set(pl_config *cfg, const char *name, const char *value,
                  char *err, size_t errlen);

/* Prints the effective configuration as config-file lines; secrets print
 * as "(set)". */
void pl_config_print(const pl_config *cfg, FILE *out);

void pl_config_usage(FILE *out);

/* Calls <fn> with the name and printed value (secrets as "(set)") of every
 * setting whose value differs between <old> and <cfg>. Strings compare
 * whole buffers: both configs must come from pl_config_load. */
void pl_config_diff(const pl_config *old, const pl_config *cfg,
                    void (*fn)(const char *name, const char *value, void *arg), void *arg);

/* Logs each of cfg->notes as a warning (log.h). */
void pl_config_log_notes(const pl_config *cfg);

/* How <nofile> descriptors are shared out: the controllers' listener (or
 * the one listener), the dispatch listener's own (with dispatch_listen:
 * dispatches, /metrics and the ring's checks, out of reach of the
 * controllers), this instance's checks of its ring peers, and the
 * process's own (listeners, the loop, logs, a spare for refusing). */
typedef struct {
    uint64_t nofile, controllers, dispatch, ring, own;
} pl_config_fds;

/* Lowers max_connections (and dispatch_max_connections, when the limit is
 * too small for both) so that every plane fits <nofile> descriptors, each
 * connection over its limit still accepted and answered 503. Fills *fds
 * (NULL: not wanted). Returns the resulting max_connections. */
uint64_t pl_config_fit_nofile(pl_config *cfg, uint64_t nofile, pl_config_fds *fds);

#endif
