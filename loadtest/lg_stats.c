/* lg_stats.c -- latency samples, /proc readings and the /metrics ledger. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>
#include "lg.h"

void lg_samples_add(lg_samples_t *s, uint64_t ns)
{
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 65536;
    s->v = realloc(s->v, s->cap * sizeof(*s->v));
    if (s->v == NULL)
      abort();
  }
  s->v[s->n++] = ns;
}

void lg_samples_reset(lg_samples_t *s)
{
  s->n = 0;
}

void lg_samples_free(lg_samples_t *s)
{
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

static int cmp_u64(const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

double lg_samples_q(lg_samples_t *s, double q)
{
  if (s->n == 0)
    return 0;
  qsort(s->v, s->n, sizeof(*s->v), cmp_u64);
  size_t i = q >= 1 ? s->n - 1 : (size_t)(q * (double)s->n);
  if (i >= s->n)
    i = s->n - 1;
  return (double)s->v[i] / 1000.0;
}

/* Sum of per-thread run time from schedstat: nanosecond resolution where
 * /proc/<pid>/stat has clock ticks. Returns -1 when unavailable. */
static int64_t schedstat_ns(int pid)
{
  char path[96];
  snprintf(path, sizeof(path), "/proc/%d/task", pid);
  DIR *d = opendir(path);
  if (d == NULL)
    return -1;
  int64_t sum = 0;
  int seen = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    unsigned long long ns;
    snprintf(path, sizeof(path), "/proc/%d/task/%.16s/schedstat", pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    if (fscanf(f, "%llu", &ns) == 1) {
      sum += (int64_t)ns;
      seen++;
    }
    fclose(f);
  }
  closedir(d);
  return seen ? sum : -1;
}

int64_t lg_proc_cpu_ns(int pid)
{
  if (pid > 0) {
    int64_t ns = schedstat_ns(pid);
    if (ns >= 0)
      return ns;
  }
  char path[64], buf[1024];
  if (pid <= 0)
    return -1;
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Fields after the ")" that ends comm: state is field 3, utime 14, stime 15. */
  char *p = strrchr(buf, ')');
  if (p == NULL)
    return -1;
  unsigned long long ut = 0, st = 0;
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  long hz = sysconf(_SC_CLK_TCK);
  return (int64_t)((ut + st) * (1000000000ULL / (unsigned long long)hz));
}

int lg_server_quiet(int pid)
{
  int64_t a = lg_proc_cpu_ns(pid);
  lg_run_for(0.2, NULL);
  int64_t b = lg_proc_cpu_ns(pid);
  return a < 0 || b < 0 || b - a < 1000000;
}

long lg_proc_rss_kb(int pid)
{
  char path[64], line[256];
  long kb = -1;
  if (pid <= 0)
    return -1;
  snprintf(path, sizeof(path), "/proc/%d/status", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  while (fgets(line, sizeof(line), f) != NULL) {
    if (strncmp(line, "VmRSS:", 6) == 0) {
      kb = strtol(line + 6, NULL, 10);
      break;
    }
  }
  fclose(f);
  return kb;
}

int64_t lg_self_cpu_ns(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
         (int64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
}

static const char *outcomes[6] = {"matched", "timeout", "disconnect",
                                  "replaced", "shutdown", "rejected"};

static void parse_line(const char *line, size_t len, lg_ledger_t *l)
{
  char tmp[256];
  if (len == 0 || line[0] == '#' || len >= sizeof(tmp))
    return;
  memcpy(tmp, line, len);
  tmp[len] = '\0';
  char *sp = strrchr(tmp, ' ');
  if (sp == NULL)
    return;
  double v = strtod(sp + 1, NULL);
  if (strncmp(tmp, "pilotlight_parked_now ", 22) == 0) {
    l->parked_now = v;
    l->ok |= 1;
  } else if (strncmp(tmp, "pilotlight_parked_total ", 24) == 0) {
    l->parked_total = v;
    l->ok |= 2;
  } else if (strncmp(tmp, "pilotlight_connections_open ", 28) == 0) {
    l->open_conns = v;
  } else if (strncmp(tmp, "pilotlight_settled_total{", 25) == 0) {
    for (int i = 0; i < 6; i++) {
      char want[48];
      snprintf(want, sizeof(want), "outcome=\"%s\"", outcomes[i]);
      if (strstr(tmp, want) != NULL)
        l->settled[i] = v;
    }
    l->settled_sum += v;
    l->ok |= 4;
  }
}

void lg_ledger_parse(const char *text, size_t len, lg_ledger_t *l)
{
  memset(l, 0, sizeof(*l));
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i == len || text[i] == '\n') {
      parse_line(text + start, i - start, l);
      start = i + 1;
    }
  }
  l->ok = l->ok == 7;
}

int lg_scrape(lg_ledger_t *l)
{
  static char text[65536];
  memset(l, 0, sizeof(*l));
  if (lg_http_get("/metrics", text, sizeof(text), 5.0) != 200)
    return -1;
  lg_ledger_parse(text, strlen(text), l);
  return l->ok ? 0 : -1;
}
