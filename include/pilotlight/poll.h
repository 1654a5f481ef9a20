/* poll.h -- what a controller's long-poll asks for: its key, read from the
 * x-trigger-* headers, with the deployment token verified when configured.
 * No sockets: the broker and the fuzzers call it alike. */
#ifndef PILOTLIGHT_POLL_H
#define PILOTLIGHT_POLL_H

#include "pilotlight/config.h"
#include "pilotlight/engine.h"
#include "pilotlight/h1.h"
#include "pilotlight/key.h"
#include "pilotlight/token.h"

#define PL_POLL_CONTROLLER_ID_MAX 256

/* Fills <key> from the headers of <req>. <key>'s strings point into <req>
 * or <claims>. With a <verifier>, the deployment-id header is verified
 * (<now> in seconds since the epoch) and *token set to its pl_token_result;
 * otherwise *token is PL_TOKEN_UNCHECKED. A valid token names the deployment, and must be
 * for the version in the header. The controller id, the version and the
 * key's deployment (the header, or its token's claim) must be well-formed
 * UTF-8 without control characters, as any key a dispatch body can name.
 * Returns 0, or -EINVAL (malformed: answered 400, *err naming the header)
 * or -EACCES (<enforce> and the token is not valid: 401), with *err set,
 * possibly to <msg>. On -EACCES, <key> is what the poll asked for as far as
 * it can be told: the deployment its token claims (never verified) or the
 * bare id, or an empty deployment when that is not readable text. */
int pl_poll_key(const pl_request *req, pl_token_verifier *verifier, int enforce,
                double now, pl_key *key, pl_token_claims *claims, int *token,
                const char **err, char *msg, size_t msglen);

/* What a poll's deployment id was found to be as it parked, kept as its
 * waiter's tag (engine.h, 7 bits): a reload that tightens the token rules
 * judges the poll by it, as the token itself is not kept. UNKNOWN (0) is
 * also what a poll adopted from an older process has: the hand-over does
 * not carry it. */
enum {
    PL_POLL_TRUST_UNKNOWN = 0, /* a token's claim read, never verified here */
    PL_POLL_TRUST_BARE,        /* a bare deployment id */
    PL_POLL_TRUST_INVALID,     /* a token that failed verification */
    PL_POLL_TRUST_CURRENT,     /* valid, signed with the current secret */
    PL_POLL_TRUST_PREVIOUS,    /* valid, signed with the previous secret */
};

/* The tag of a poll keyed by pl_poll_key() (<token>, <claims>, <key> as it
 * filled them) from <req>. */
unsigned pl_poll_trust(int token, const pl_token_claims *claims, const pl_key *key,
                       const pl_request *req);

/* What a poll and a parked poll are told while warm_starts = off. */
#define PL_POLL_OFF_REASON "warm starts are off (warm_starts = off)"

/* Sets *out to a verifier for <cfg>'s secrets, or NULL when tokens are
 * disabled. Returns 0, or -ENOMEM (*out NULL). */
int pl_poll_verifier_new(const pl_config *cfg, pl_token_verifier **out);

/* Applies a reload from <old> to <next> to the polls parked in <e>: token
 * mode and secrets (pl_poll_rejudge), warm_starts turned off, lower caps.
 * Each poll refused is settled as a new one would be answered (REVOKED,
 * REJECTED) and the count logged. */
void pl_poll_reload_parked(pl_engine *e, const pl_config *old, const pl_config *next);

/* A reload's view of the parked polls' tags: they name the secrets of
 * <old>, the configuration in force until now. */
typedef struct {
    const pl_config *old, *next;
    int remap;   /* the secrets changed */
    int enforce; /* enforce's rules apply anew */
} pl_poll_rejudge;

/* Fills <r> for a reload from <old> to <next>. Returns whether a parked
 * poll can be refused under <next>, so that judging them is worth it. */
int pl_poll_rejudge_init(pl_poll_rejudge *r, const pl_config *old, const pl_config *next);

/* pl_engine_settle_if()'s judge (<arg> a pl_poll_rejudge): nonzero when a
 * new poll with the same deployment id would be refused under <next>, as
 * far as the tag tells, with *why the 401's reason (NULL: never verified
 * here, to be closed unanswered so its controller polls again and is
 * judged then); else *tag is what it names under <next>. Expiry is not
 * judged again: a token is checked when its poll parks. */
int pl_poll_rejudge_one(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg);

/* A controller gives up on its poll <timeout_ms> (the connectionTimeoutMs
 * /connect told it) after it sent it: its client aborts the request unless
 * the answer's head has come by then. A run is not handed to a poll that
 * close to the end: */

/* Until this long before the end no poll is near it, whatever its path:
 * nothing need be asked of TCP. */
#define PL_POLL_NEAR_MS 2000

/* Whether a poll parked at <parked_at> (ms) is too near its controller's
 * end at <now> for a run to reach it in time: the request took a round
 * trip and a half to arrive (a connection's handshake too), the answer's
 * head takes half a round trip, plus four deviations of the round trip and
 * 10 ms for timers on either side. <rtt_us>, <rttvar_us>: the kernel's
 * view of the path (0: unknown, taken as 1 ms and 0). */
int pl_poll_expiring(uint64_t parked_at, uint64_t now, uint64_t timeout_ms, uint32_t rtt_us,
                     uint32_t rttvar_us);

#endif
