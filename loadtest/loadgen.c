/* loadgen.c -- pl-loadgen: drives a warm-start broker from both sides and
 * reports throughput, latency and the server's CPU and memory. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "lg.h"

/* jitter: how long this CPU goes missing. A loop that only reads the clock
 * for --duration seconds records every gap between two readings; on a quiet
 * bare-metal core gaps stay in microseconds, on a virtual CPU the host's
 * preemptions show up here and set a floor under any latency tail. */
static int scenario_jitter(const lg_opts_t *o)
{
  static const uint64_t edges[] = {10000, 100000, 1000000, 5000000};
  long counts[4] = {0, 0, 0, 0};
  uint64_t start = lg_now(), prev = start, now, max = 0, lost = 0;
  uint64_t end = start + (uint64_t)(o->duration_s * 1e9);
  while ((now = lg_now()) < end) {
    uint64_t d = now - prev;
    prev = now;
    if (d > max)
      max = d;
    if (d > edges[1])
      lost += d;
    for (int i = 0; i < 4; i++)
      counts[i] += d > edges[i];
  }
  double secs = (double)(now - start) / 1e9;
  if (!o->json_only)
    printf("== jitter (%s)\n", o->label);
  lg_row(o, "gaps per second", ">10us %.1f, >100us %.1f, >1ms %.1f, >5ms %.1f",
         counts[0] / secs, counts[1] / secs, counts[2] / secs, counts[3] / secs);
  lg_row(o, "longest gap", "%.3f ms; %.3f%% of the time in gaps >100us", (double)max / 1e6,
         (double)lost / 1e7 / secs);
  printf("{\"scenario\":\"jitter\",\"label\":\"%s\",\"secs\":%.3f,\"gaps_10us_per_s\":%.2f,"
         "\"gaps_100us_per_s\":%.2f,\"gaps_1ms_per_s\":%.2f,\"gaps_5ms_per_s\":%.2f,"
         "\"max_gap_us\":%.1f,\"lost_pct\":%.4f}\n",
         o->label, secs, counts[0] / secs, counts[1] / secs, counts[2] / secs, counts[3] / secs,
         (double)max / 1e3, (double)lost / 1e7 / secs);
  fflush(stdout);
  return 0;
}

static void usage(FILE *f)
{
  fprintf(f,
          "usage: pl-loadgen [options] SCENARIO[,SCENARIO...]\n"
          "scenarios: cycle idle churn scale jitter\n"
          "  --target HOST:PORT        server address (127.0.0.1:8080)\n"
          "  --proto warm-start|nchan  URL scheme (warm-start)\n"
          "  --server-pid PID          read the server's CPU and RSS from /proc\n"
          "  --label NAME              system name for the JSON lines\n"
          "  --metrics                 scrape /metrics (pilotlight) for the ledger\n"
          "  --duration S              measured seconds per cycle run (5)\n"
          "  --warmup S                warm-up seconds before measuring (1)\n"
          "  --controllers N           cycle: parked controllers (500)\n"
          "  --dispatchers N           cycle: dispatcher connections (50)\n"
          "  --rate R                  cycle: offered dispatches/s (0 = closed loop);\n"
          "                            churn: offered cycles/s (0 = as fast as it goes)\n"
          "  --pace spin|timer         rate pacing (spin: busy-poll for us precision)\n"
          "  --hold MS                 cycle: a controller polls again MS after a payload,\n"
          "                            as one running its task would (0: at once)\n"
          "  --keys N                  distinct keys (deployments x presets) (30)\n"
          "  --parked N                idle: parked polls (10000)\n"
          "  --idle-warmup N           idle: polls parked and closed before the baseline (1000)\n"
          "  --cycles N                churn: connect-park-abort cycles (200000)\n"
          "  --churn-warmup N          churn: warm-up cycles before the baseline (20000)\n"
          "  --concurrency N           churn: cycles in flight (64)\n"
          "  --abort fin|rst           churn: how a poll is aborted (fin, as fetch does)\n"
          "  --scale-small N --scale-large N --scale-rate R --scale-miss-keys N\n"
          "                            scale: parked counts (1000, 18000), rate (5000),\n"
          "                            never-parked key space (100000)\n"
          "  --source-addrs N          spread connections over 127.0.0.1..N (4; churn 8)\n"
          "  --probe PATH              idle: path asked after the close (/healthz)\n"
          "  --json                    JSON lines only\n");
}

static int parse_target(const char *s, lg_opts_t *o)
{
  static char host[64];
  const char *colon = strrchr(s, ':');
  if (colon == NULL || (size_t)(colon - s) >= sizeof(host))
    return -1;
  memcpy(host, s, (size_t)(colon - s));
  host[colon - s] = '\0';
  o->host = host;
  o->port = atoi(colon + 1);
  return o->port > 0 ? 0 : -1;
}

static int parse_args(int argc, char **argv, lg_opts_t *o, char **scenarios)
{
  enum { O_TARGET = 1000, O_PROTO, O_PID, O_LABEL, O_METRICS, O_DUR, O_WARM, O_CTL, O_DISP,
         O_RATE, O_PACE, O_HOLD, O_KEYS, O_PARKED, O_CYCLES, O_CWARM, O_CONC, O_SSMALL, O_SLARGE,
         O_SRATE, O_SMISS, O_SRC, O_PROBE, O_ABORT, O_IWARM, O_JSON, O_HELP };
  static const struct option lo[] = {
      {"target", 1, 0, O_TARGET},       {"proto", 1, 0, O_PROTO},
      {"server-pid", 1, 0, O_PID},      {"label", 1, 0, O_LABEL},
      {"metrics", 0, 0, O_METRICS},     {"duration", 1, 0, O_DUR},
      {"warmup", 1, 0, O_WARM},         {"controllers", 1, 0, O_CTL},
      {"dispatchers", 1, 0, O_DISP},    {"rate", 1, 0, O_RATE},
      {"pace", 1, 0, O_PACE},           {"keys", 1, 0, O_KEYS},
      {"hold", 1, 0, O_HOLD},
      {"parked", 1, 0, O_PARKED},       {"cycles", 1, 0, O_CYCLES},
      {"churn-warmup", 1, 0, O_CWARM},  {"concurrency", 1, 0, O_CONC},
      {"scale-small", 1, 0, O_SSMALL},  {"scale-large", 1, 0, O_SLARGE},
      {"scale-rate", 1, 0, O_SRATE},    {"scale-miss-keys", 1, 0, O_SMISS},
      {"source-addrs", 1, 0, O_SRC},    {"probe", 1, 0, O_PROBE},
      {"abort", 1, 0, O_ABORT},          {"idle-warmup", 1, 0, O_IWARM},
      {"json", 0, 0, O_JSON},           {"help", 0, 0, O_HELP},
      {0, 0, 0, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    switch (ch) {
    case O_TARGET: if (parse_target(optarg, o) != 0) return -1; break;
    case O_PROTO:
      if (strcmp(optarg, "nchan") == 0) o->proto = LG_PROTO_NCHAN;
      else if (strcmp(optarg, "warm-start") == 0) o->proto = LG_PROTO_WARMSTART;
      else return -1;
      break;
    case O_PID: o->server_pid = atoi(optarg); break;
    case O_LABEL: o->label = optarg; break;
    case O_METRICS: o->metrics = 1; break;
    case O_DUR: o->duration_s = atof(optarg); break;
    case O_WARM: o->warmup_s = atof(optarg); break;
    case O_CTL: o->controllers = atoi(optarg); break;
    case O_DISP: o->dispatchers = atoi(optarg); break;
    case O_RATE: o->rate = atof(optarg); break;
    case O_PACE: o->spin = strcmp(optarg, "timer") != 0; break;
    case O_HOLD: o->hold_ms = atof(optarg); break;
    case O_KEYS: o->keys = atoi(optarg); break;
    case O_PARKED: o->parked = atol(optarg); break;
    case O_CYCLES: o->cycles = atol(optarg); break;
    case O_CWARM: o->churn_warmup = atol(optarg); break;
    case O_CONC: o->concurrency = atoi(optarg); break;
    case O_SSMALL: o->scale_small = atoi(optarg); break;
    case O_SLARGE: o->scale_large = atoi(optarg); break;
    case O_SRATE: o->scale_rate = atof(optarg); break;
    case O_SMISS: o->scale_misskeys = atol(optarg); break;
    case O_SRC: o->source_addrs = atoi(optarg); break;
    case O_PROBE: o->probe_path = optarg; break;
    case O_IWARM: o->idle_warmup = atol(optarg); break;
    case O_ABORT: o->abort_rst = strcmp(optarg, "rst") == 0; break;
    case O_JSON: o->json_only = 1; break;
    case O_HELP: usage(stdout); exit(0);
    default: return -1;
    }
  }
  if (optind != argc - 1)
    return -1;
  *scenarios = argv[optind];
  if (o->controllers < 1 || o->dispatchers < 1 || o->keys < 1 || o->concurrency < 1 ||
      o->parked < 1 || o->cycles < 1 || o->scale_small < 1 || o->scale_large < 1 ||
      o->scale_misskeys < 1 || o->duration_s <= 0 || o->warmup_s < 0)
    return -1;
  return 0;
}

/* Lifts the soft open-file limit to the hard one: idle wants ~19 k sockets. */
static void raise_nofile(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

int main(int argc, char **argv)
{
  lg_opts_t o = {
      .host = "127.0.0.1", .port = 8080, .label = "server", .duration_s = 5, .warmup_s = 1,
      .controllers = 500, .dispatchers = 50, .spin = 1, .keys = 30, .parked = 10000, .idle_warmup = 1000,
      .cycles = 200000, .churn_warmup = 20000, .concurrency = 64, .scale_small = 1000,
      .scale_large = 18000, .scale_rate = 5000, .scale_misskeys = 100000,
      .probe_path = "/healthz",
  };
  char *scenarios;
  /* A write to a connection the server closed is an error to count (and
   * the connection redone), not the end of the run: runs of a minute at
   * 5 k/s were seen to die of SIGPIPE with nothing printed. */
  signal(SIGPIPE, SIG_IGN);
  if (parse_args(argc, argv, &o, &scenarios) != 0) {
    usage(stderr);
    return 2;
  }
  /* Several source addresses by default: ports left in TIME_WAIT by an
   * earlier churn run then never slow down the connects of the next run. */
  if (o.source_addrs == 0)
    o.source_addrs = 4;
  raise_nofile();
  lg_run_start(&o);
  int rc = 0;
  for (char *s = strtok(scenarios, ","); s != NULL; s = strtok(NULL, ",")) {
    if (strcmp(s, "cycle") == 0)
      rc |= lg_scenario_cycle(&o);
    else if (strcmp(s, "idle") == 0)
      rc |= lg_scenario_idle(&o);
    else if (strcmp(s, "churn") == 0)
      rc |= lg_scenario_churn(&o);
    else if (strcmp(s, "scale") == 0)
      rc |= lg_scenario_scale(&o);
    else if (strcmp(s, "jitter") == 0)
      rc |= scenario_jitter(&o);
    else {
      fprintf(stderr, "pl-loadgen: unknown scenario %s\n", s);
      return 2;
    }
  }
  lg_run_stop();
  return rc;
}
