/* lg_body.c -- the requests pl-loadgen sends: keys, polls and dispatches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "lg.h"

/* Trigger.dev machine presets that fit the protocol's cpu/memory values. */
static const struct {
  const char *name, *cpu, *mem;
  const char *cents;
} presets[] = {
    {"micro", "0.25", "0.25", "0.0000042"},  {"small-1x", "0.5", "0.5", "0.0000169"},
    {"small-2x", "1", "1", "0.0000338"},     {"medium-1x", "1", "2", "0.0000675"},
    {"medium-2x", "2", "4", "0.000135"},     {"large-1x", "4", "8", "0.00027"},
};
#define N_PRESETS 6
static const char version[] = "20261130.1";

void lg_key_fields(long k, char prefix, char *dep, size_t dn, const char **ver,
                   const char **cpu, const char **mem)
{
  snprintf(dep, dn, "deployment_lg%c%012ldabcdefghijk", prefix, k / N_PRESETS);
  *ver = version;
  *cpu = presets[k % N_PRESETS].cpu;
  *mem = presets[k % N_PRESETS].mem;
}

static size_t host_header(const lg_opts_t *o, char *buf, size_t cap)
{
  return (size_t)snprintf(buf, cap, "Host: %s:%d\r\n", o->host, o->port);
}

char *lg_req_poll(const lg_opts_t *o, long ctl_id, long k, size_t *len)
{
  char dep[64], host[64];
  const char *ver, *cpu, *mem;
  char *buf = malloc(768);
  if (buf == NULL)
    abort();
  lg_key_fields(k, 'd', dep, sizeof(dep), &ver, &cpu, &mem);
  host_header(o, host, sizeof(host));
  /* What Node's fetch (undici) sends for the run controller's poll. Its id
   * is "controller_" and a UUID (47 bytes): the last group is 12 hex digits. */
  int n = snprintf(buf, 768,
                   "GET /warm-start HTTP/1.1\r\n%s"
                   "x-trigger-workload-controller-id: controller_%08lx-7c1e-4d2a-9b3f-%012lx\r\n"
                   "x-trigger-deployment-id: %s\r\n"
                   "x-trigger-deployment-version: %s\r\n"
                   "x-trigger-machine-cpu: %s\r\n"
                   "x-trigger-machine-memory: %s\r\n"
                   "x-trigger-worker-instance-name: lg-worker-%ld\r\n"
                   "accept: */*\r\naccept-language: *\r\nsec-fetch-mode: cors\r\n"
                   "user-agent: node\r\naccept-encoding: gzip, deflate\r\n"
                   "connection: keep-alive\r\n\r\n",
                   host, ctl_id, ((unsigned long)ctl_id * 2654435761UL) & 0xffffffffffffUL, dep, ver, cpu,
                   mem, ctl_id % 64);
  *len = (size_t)n;
  return buf;
}

static void channel_id(long k, char prefix, char *buf, size_t cap)
{
  char dep[64];
  const char *ver, *cpu, *mem;
  lg_key_fields(k, prefix, dep, sizeof(dep), &ver, &cpu, &mem);
  snprintf(buf, cap, "%s_%s_%s_%s", dep, ver, cpu, mem);
}

/* The payload: the shape of tests/blackbox/data/dequeued-message.json. */
static int message(char *buf, size_t cap, long k, char prefix, uint64_t seq)
{
  char dep[64];
  const char *ver, *cpu, *mem;
  const int p = (int)(k % N_PRESETS);
  lg_key_fields(k, prefix, dep, sizeof(dep), &ver, &cpu, &mem);
  return snprintf(
      buf, cap,
      "{\"version\":\"1\",\"snapshot\":{\"id\":\"cm8x0snap%016llxk\","
      "\"friendlyId\":\"snapshot_cm8x0snap%016llxk\",\"executionStatus\":\"PENDING_EXECUTING\","
      "\"description\":\"Run was dequeued for execution\",\"createdAt\":\"2026-11-30T04:40:00.000Z\"},"
      "\"dequeuedAt\":\"2026-11-30T04:40:00.120Z\",\"workerQueueLength\":3,"
      "\"image\":\"registry.example.com/proj_abc/deployment:%s\",\"completedWaitpoints\":[],"
      "\"backgroundWorker\":{\"id\":\"cm8x0bw0000001abcdefghijk\","
      "\"friendlyId\":\"worker_cm8x0bw0000001abcdefghijk\",\"version\":\"%s\",\"runtime\":\"node-22\"},"
      "\"deployment\":{\"id\":\"cm8x0dep000001abcdefghijk\",\"friendlyId\":\"%s\","
      "\"imagePlatform\":\"linux/amd64\"},"
      "\"run\":{\"id\":\"cm8x0run%016llxk\",\"friendlyId\":\"run_lg%llu\",\"isTest\":false,"
      "\"isReplay\":false,\"machine\":{\"name\":\"%s\",\"cpu\":%s,\"memory\":%s,\"centsPerMs\":%s},"
      "\"attemptNumber\":1,\"masterQueue\":\"main\",\"traceContext\":{\"traceparent\":"
      "\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"},"
      "\"annotations\":{\"triggerSource\":\"sdk\",\"triggerAction\":\"trigger\","
      "\"rootTriggerSource\":\"sdk\"}},"
      "\"environment\":{\"id\":\"cm8x0env000001abcdefghijk\",\"type\":\"PRODUCTION\"},"
      "\"organization\":{\"id\":\"cm8x0org000001abcdefghijk\"},"
      "\"project\":{\"id\":\"cm8x0prj000001abcdefghijk\"}}",
      (unsigned long long)seq, (unsigned long long)seq, ver, ver, dep, (unsigned long long)seq,
      (unsigned long long)seq, presets[p].name, cpu, mem, presets[p].cents);
}

size_t lg_req_dispatch(const lg_opts_t *o, char *buf, size_t cap, long k, char prefix,
                       uint64_t seq)
{
  char body[2048], host[64];
  int bl;
  host_header(o, host, sizeof(host));
  if (o->proto == LG_PROTO_NCHAN) {
    char ch[128];
    channel_id(k, prefix, ch, sizeof(ch));
    bl = message(body, sizeof(body), k, prefix, seq);
    return (size_t)snprintf(buf, cap,
                            "POST /pub/%s HTTP/1.1\r\n%sAccept: application/json\r\n"
                            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
                            ch, host, bl, body);
  }
  memcpy(body, "{\"dequeuedMessage\":", 19);
  bl = 19 + message(body + 19, sizeof(body) - 20, k, prefix, seq);
  body[bl++] = '}';
  body[bl] = '\0';
  return (size_t)snprintf(buf, cap,
                          "POST /warm-start HTTP/1.1\r\n%scontent-type: application/json\r\n"
                          "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-%016llx-01\r\n"
                          "content-length: %d\r\n\r\n%s",
                          host, (unsigned long long)seq + 1, bl, body);
}

size_t lg_req_get(const lg_opts_t *o, char *buf, size_t cap, const char *path)
{
  char host[64];
  host_header(o, host, sizeof(host));
  return (size_t)snprintf(buf, cap, "GET %s HTTP/1.1\r\n%saccept: */*\r\n\r\n", path, host);
}

size_t lg_req_nchan_poll(const lg_opts_t *o, char *buf, size_t cap, long k, const lg_conn_t *c)
{
  char host[64], ch[128];
  (void)c;
  host_header(o, host, sizeof(host));
  channel_id(k, 'd', ch, sizeof(ch));
  /* No If-None-Match: with nchan_subscriber_first_message newest each poll
   * waits for the next message, as a warm-start poll does; sending the last
   * Etag would replay what was published while nobody listened. */
  return (size_t)snprintf(buf, cap, "GET /sub/%s HTTP/1.1\r\n%saccept: */*\r\n\r\n", ch, host);
}

int lg_find_run(const char *body, size_t len, uint64_t *seq)
{
  const char *p = body ? memmem(body, len, "run_lg", 6) : NULL;
  if (p == NULL)
    return -1;
  p += 6;
  uint64_t v = 0;
  int digits = 0;
  while (p < body + len && *p >= '0' && *p <= '9') {
    v = v * 10 + (uint64_t)(*p++ - '0');
    digits++;
  }
  if (digits == 0)
    return -1;
  *seq = v;
  return 0;
}
