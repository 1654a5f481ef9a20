/* poll.c -- a long-poll's key from its headers, tokens verified or read. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/log.h"
#include "pilotlight/poll.h"
#include "pilotlight/utf8.h"

static const char *const header_names[] = {
    "x-trigger-workload-controller-id", "x-trigger-deployment-id",
    "x-trigger-deployment-version", "x-trigger-machine-cpu",
    "x-trigger-machine-memory",
};

/* Whether the eight bytes of <x> are all printable ASCII (0x20 to 0x7e).
 * With no byte at 0x80 or above, the borrow tricks below are exact: a byte
 * below 0x20 is one that subtracting 0x20 wraps, and 0x7f is one that
 * XOR 0x7f makes zero. */
static inline int printable8(uint64_t x)
{
    const uint64_t ones = 0x0101010101010101u, high = 0x8080808080808080u;
    uint64_t del = x ^ (ones * 0x7f);

    return (x & high) == 0 && ((x - ones * 0x20) & ~x & high) == 0 &&
           ((del - ones) & ~del & high) == 0;
}

/* What keeps <len> bytes at <s> from being a key string a dispatch body
 * can name (well-formed UTF-8, no control character: message.c's reading
 * of a JSON string), or NULL. A poll keyed otherwise could never match.
 * Ids and versions are printable ASCII: eight bytes are checked at a time
 * while they are, every poll reading about a hundred. */
static const char *not_text(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;

    for (uint64_t x; i + 8 <= len; i += 8) {
        memcpy(&x, p + i, 8);
        if (!printable8(x))
            break;
    }
    if (i + 8 > len && len >= 8) { /* the rest, as the last eight bytes */
        uint64_t x;
        memcpy(&x, p + len - 8, 8);
        if (printable8(x))
            return NULL;
    }
    for (size_t n; i < len; i += n) {
        if (p[i] < 0x20 || p[i] == 0x7f)
            return "holds a control character";
        if ((n = pl_utf8_len(p + i, len - i)) == 0)
            return "is not valid UTF-8";
    }
    return NULL;
}

/* A refused poll's key: the deployment its token claims (never verified)
 * or the bare id, if that is text a key could hold; else none. Read for
 * the status page, to say whose poll was refused. */
static void refused_deployment(const char *id, size_t len, pl_key *key,
                               pl_token_claims *claims)
{
    long n = pl_token_deployment(id, len, claims->deployment, sizeof(claims->deployment));

    key->deployment_len = 0;
    if (n < 0 && n != PL_TOKEN_NOT_JWT)
        return;
    if (n >= 0) {
        id = claims->deployment;
        len = (size_t)n;
    }
    if (len <= PL_KEY_FIELD_MAX && not_text(id, len) == NULL) {
        key->deployment = id;
        key->deployment_len = len;
    }
}

/* Sets the key's deployment from the deployment-id header. */
static int read_deployment(const pl_request *req, pl_token_verifier *verifier,
                           int enforce, double now, pl_key *key,
                           pl_token_claims *claims, int *token, const char **err)
{
    const char *id = req->header[PL_HDR_DEPLOYMENT_ID];
    size_t len = req->header_len[PL_HDR_DEPLOYMENT_ID];
    long n;

    if (verifier != NULL) {
        const char *why = "";
        pl_token_result r = pl_token_verify(verifier, id, len, now, claims, &why);

        if (r == PL_TOKEN_VALID && (strlen(claims->deployment_version) != key->version_len ||
                                    memcmp(claims->deployment_version, key->version,
                                           key->version_len) != 0)) {
            r = PL_TOKEN_INVALID; /* signed for another version */
            why = "version_mismatch";
        }
        *token = (int)r;
        if (r == PL_TOKEN_VALID) {
            key->deployment = claims->deployment;
            key->deployment_len = strlen(claims->deployment);
            return 0;
        }
        PL_LOG(PL_LOG_DEBUG, "deployment token refused", "\"reason\":\"%s\",\"enforced\":%s",
               why, enforce ? "true" : "false");
        if (enforce) {
            *err = r == PL_TOKEN_LEGACY ? "a signed deployment token is required"
                                        : "invalid deployment token";
            refused_deployment(id, len, key, claims);
            return -EACCES;
        }
    }
    /* unverified: a token's claim names the key, nothing more; a value
     * that does not decode as a JWT is a bare id, dots or not */
    n = pl_token_deployment(id, len, claims->deployment, sizeof(claims->deployment));
    if (n < 0 && n != PL_TOKEN_NOT_JWT) {
        *err = "x-trigger-deployment-id is a token without a deployment claim";
        return -EINVAL;
    }
    if (n >= 0) {
        id = claims->deployment;
        len = (size_t)n;
    }
    if (len > PL_KEY_FIELD_MAX) {
        *err = "x-trigger-deployment-id is too long";
        return -EINVAL;
    }
    key->deployment = id;
    key->deployment_len = len;
    return 0;
}

int pl_poll_key(const pl_request *req, pl_token_verifier *verifier, int enforce,
                double now, pl_key *key, pl_token_claims *claims, int *token,
                const char **err, char *msg, size_t msglen)
{
    static const pl_header required[] = {
        PL_HDR_CONTROLLER_ID, PL_HDR_DEPLOYMENT_ID, PL_HDR_DEPLOYMENT_VERSION,
        PL_HDR_MACHINE_CPU, PL_HDR_MACHINE_MEMORY,
    };
    static const pl_header texts[] = {PL_HDR_CONTROLLER_ID, PL_HDR_DEPLOYMENT_VERSION};
    const char *why;
    int rc;

    *token = PL_TOKEN_UNCHECKED;
    *err = NULL;
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++) {
        pl_header h = required[i];
        if (req->header[h] == NULL || req->header_len[h] == 0) {
            if (h == PL_HDR_DEPLOYMENT_ID && verifier != NULL)
                *token = PL_TOKEN_ABSENT;
            snprintf(msg, msglen, "missing header %s", header_names[h]);
            *err = msg;
            return -EINVAL;
        }
    }
    if (req->header_len[PL_HDR_CONTROLLER_ID] > PL_POLL_CONTROLLER_ID_MAX)
        *err = "x-trigger-workload-controller-id is too long";
    else if (req->header_len[PL_HDR_DEPLOYMENT_VERSION] > PL_KEY_FIELD_MAX)
        *err = "x-trigger-deployment-version is too long";
    else if (pl_key_parse_number(req->header[PL_HDR_MACHINE_CPU],
                                 req->header_len[PL_HDR_MACHINE_CPU], &key->cpu) != 0)
        *err = "x-trigger-machine-cpu must be a number";
    else if (pl_key_parse_number(req->header[PL_HDR_MACHINE_MEMORY],
                                 req->header_len[PL_HDR_MACHINE_MEMORY], &key->memory) != 0)
        *err = "x-trigger-machine-memory must be a number";
    if (*err != NULL)
        return -EINVAL;
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        pl_header h = texts[i];
        if ((why = not_text(req->header[h], req->header_len[h])) != NULL) {
            snprintf(msg, msglen, "%s %s", header_names[h], why);
            *err = msg;
            return -EINVAL;
        }
    }
    key->version = req->header[PL_HDR_DEPLOYMENT_VERSION];
    key->version_len = req->header_len[PL_HDR_DEPLOYMENT_VERSION];
    rc = read_deployment(req, verifier, enforce, now, key, claims, token, err);
    if (rc == 0 && (why = not_text(key->deployment, key->deployment_len)) != NULL) {
        /* the header's own bytes, or its token's deployment claim */
        snprintf(msg, msglen, "%s %s", header_names[PL_HDR_DEPLOYMENT_ID], why);
        *err = msg;
        return -EINVAL;
    }
    return rc;
}

unsigned pl_poll_trust(int token, const pl_token_claims *claims, const pl_key *key,
                       const pl_request *req)
{
    if (token == PL_TOKEN_VALID)
        return claims->previous ? PL_POLL_TRUST_PREVIOUS : PL_POLL_TRUST_CURRENT;
    if (token == PL_TOKEN_INVALID)
        return PL_POLL_TRUST_INVALID;
    /* Legacy, or not verified: a bare id is the header itself, a token's
     * claim is not. */
    return key->deployment == req->header[PL_HDR_DEPLOYMENT_ID] ? PL_POLL_TRUST_BARE
                                                                : PL_POLL_TRUST_UNKNOWN;
}

int pl_poll_rejudge_init(pl_poll_rejudge *r, const pl_config *old, const pl_config *next)
{
    r->old = old;
    r->next = next;
    r->remap = strcmp(old->token_secret, next->token_secret) != 0 ||
               strcmp(old->token_secret_previous, next->token_secret_previous) != 0;
    r->enforce = next->token_mode == PL_TOKEN_MODE_ENFORCE &&
                 (old->token_mode != PL_TOKEN_MODE_ENFORCE || r->remap);
    return r->remap || r->enforce;
}

/* Which of <next>'s secrets <secret> is, as a tag; INVALID once dropped. */
static unsigned secret_now(const char *secret, const pl_config *next)
{
    if (*secret != '\0' && strcmp(secret, next->token_secret) == 0)
        return PL_POLL_TRUST_CURRENT;
    if (*secret != '\0' && strcmp(secret, next->token_secret_previous) == 0)
        return PL_POLL_TRUST_PREVIOUS;
    return PL_POLL_TRUST_INVALID;
}

int pl_poll_rejudge_one(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    const pl_poll_rejudge *r = arg;

    (void)info;
    if (r->remap) {
        if (*tag == PL_POLL_TRUST_CURRENT)
            *tag = secret_now(r->old->token_secret, r->next);
        else if (*tag == PL_POLL_TRUST_PREVIOUS)
            *tag = secret_now(r->old->token_secret_previous, r->next);
        else if (*tag == PL_POLL_TRUST_INVALID)
            *tag = PL_POLL_TRUST_UNKNOWN; /* a new secret may verify it */
    }
    if (!r->enforce || *tag == PL_POLL_TRUST_CURRENT || *tag == PL_POLL_TRUST_PREVIOUS)
        return 0;
    *why = *tag == PL_POLL_TRUST_BARE      ? "a signed deployment token is required"
           : *tag == PL_POLL_TRUST_INVALID ? "invalid deployment token"
                                           : NULL;
    return 1;
}

int pl_poll_verifier_new(const pl_config *cfg, pl_token_verifier **out)
{
    const char *cur = cfg->token_secret, *prev = cfg->token_secret_previous;

    *out = NULL;
    if (cfg->token_mode == PL_TOKEN_MODE_DISABLED)
        return 0;
    *out = pl_token_verifier_new((const unsigned char *)cur, strlen(cur));
    if (*out != NULL && *prev != '\0' &&
        pl_token_verifier_set_previous(*out, (const unsigned char *)prev, strlen(prev)) != 0) {
        pl_token_verifier_free(*out);
        *out = NULL;
    }
    return *out != NULL ? 0 : -ENOMEM;
}

/* pl_engine_settle_if's judge for warm_starts = off: every poll goes. */
static int judge_off(const pl_waiter_info *info, unsigned *tag, const void **why, void *arg)
{
    (void)info, (void)tag, (void)arg;
    *why = PL_POLL_OFF_REASON;
    return 1;
}

void pl_poll_reload_parked(pl_engine *e, const pl_config *old, const pl_config *next)
{
    pl_poll_rejudge r;
    size_t revoked = 0, rejected = 0;

    if (pl_poll_rejudge_init(&r, old, next))
        revoked = pl_engine_settle_if(e, PL_OUTCOME_REVOKED, pl_poll_rejudge_one, &r);
    /* Warm starts turned off: a non-2xx answer ends a controller's wait
     * for its next run at once (WarmStartClient returns no run, and the
     * run controller exits), where a closed poll would be retried. */
    if (next->warm_starts == PL_WARM_STARTS_OFF && old->warm_starts != PL_WARM_STARTS_OFF)
        rejected = pl_engine_settle_if(e, PL_OUTCOME_REJECTED, judge_off, NULL);
    else if (next->max_waiters < old->max_waiters ||
             next->max_waiters_per_key < old->max_waiters_per_key)
        rejected = pl_engine_enforce_caps(e);
    if (revoked + rejected > 0)
        PL_LOG(PL_LOG_WARN, "reload: parked polls refused under the new settings",
               "\"revoked\":%zu,\"rejected\":%zu", revoked, rejected);
}

int pl_poll_expiring(uint64_t parked_at, uint64_t now, uint64_t timeout_ms, uint32_t rtt_us,
                     uint32_t rttvar_us)
{
    uint64_t rtt = rtt_us != 0 ? rtt_us : 1000;
    uint64_t margin_ms = (2 * rtt + 4 * (uint64_t)rttvar_us) / 1000 + 10;

    return now >= parked_at + timeout_ms ||
           now + margin_ms >= parked_at + timeout_ms;
}
