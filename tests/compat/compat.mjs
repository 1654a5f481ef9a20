// compat.mjs -- drives pilotlight with Trigger.dev's real WarmStartClient.
//
// Usage: node compat.mjs BASE_URL [--case match|dotted|abort|repoll ...]
//
// The controller side is the WarmStartClient from @trigger.dev/core (the code
// a real run controller runs); the supervisor side is a POST shaped exactly
// like the supervisor's tryWarmStart(). Server state is read from /metrics.
// Prints one JSON result line on stdout; exits 1 on any failure.

import { randomUUID } from "node:crypto";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";

import { WarmStartClient } from "@trigger.dev/core/v3/workers";
import { DequeuedMessage } from "@trigger.dev/core/v3/schemas";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");
const HARD_TIMEOUT_MS = 60_000;
const STEP_TIMEOUT_MS = 5_000;

// The client logs through console.log/info; keep stdout for the result line.
for (const k of ["log", "info", "debug", "warn"]) console[k] = console.error;

const realFetch = globalThis.fetch;
/** Last raw long-poll response seen per controller id: {status, contentType, text}. */
const polled = new Map();
/** Called with (controller id, time) as each long poll starts (case expiring). */
let onPollStart = null;

// Observe (never alter) the client's long-poll responses, so the raw JSON the
// server sent can be compared with what was dispatched.
globalThis.fetch = async (input, init) => {
  const pid = init?.headers?.["x-trigger-workload-controller-id"];
  if (pid && onPollStart) onPollStart(pid, performance.now());
  const res = await realFetch(input, init);
  const id = init?.headers?.["x-trigger-workload-controller-id"];
  if (id) {
    const text = await res.clone().text();
    polled.set(id, { status: res.status, contentType: res.headers.get("content-type"), text });
  }
  return res;
};

class Failure extends Error {}

function check(cond, what, detail) {
  if (!cond) {
    const extra = detail === undefined ? "" : `: ${JSON.stringify(detail)}`;
    throw new Failure(`${what}${extra}`);
  }
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

/** Resolves with p's value, or rejects with a Failure after ms. */
async function within(p, ms, what) {
  let timer;
  const t = new Promise((_, rej) => {
    timer = setTimeout(() => rej(new Failure(`timed out: ${what}`)), ms);
  });
  try {
    return await Promise.race([p, t]);
  } finally {
    clearTimeout(timer);
  }
}

function packageVersion() {
  const require = createRequire(import.meta.url);
  return require("@trigger.dev/core/package.json").version;
}

function loadExample() {
  const p = path.join(REPO, "tests", "blackbox", "data", "dequeued-message.json");
  if (!fs.existsSync(p)) throw new Failure(`example message not found at ${p}`);
  return JSON.parse(fs.readFileSync(p, "utf8"));
}

// ---- /metrics --------------------------------------------------------------

/** Parses Prometheus text into Map("name{k="v",...}" with sorted labels -> number). */
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = [...(m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"/g)]
      .map(([, k, v]) => `${k}="${v}"`)
      .sort()
      .join(",");
    out.set(labels ? `${m[1]}{${labels}}` : m[1], Number(m[3]));
  }
  return out;
}

function metric(map, name, labels = {}) {
  const l = Object.entries(labels)
    .map(([k, v]) => `${k}="${v}"`)
    .sort()
    .join(",");
  return map.get(l ? `${name}{${l}}` : name) ?? 0;
}

const OUTCOMES = ["matched", "timeout", "disconnect", "replaced", "shutdown", "rejected"];

async function scrape(base) {
  const res = await realFetch(new URL("/metrics", base));
  check(res.status === 200, "GET /metrics status", res.status);
  const map = parseMetrics(await res.text());
  check(map.has("pilotlight_parked_now"), "pilotlight_parked_now missing from /metrics");
  const s = {
    parkedNow: metric(map, "pilotlight_parked_now"),
    parkedTotal: metric(map, "pilotlight_parked_total"),
    hit: metric(map, "pilotlight_dispatch_total", { result: "hit" }),
    miss: metric(map, "pilotlight_dispatch_total", { result: "miss" }),
    settled: {},
  };
  let sum = 0;
  for (const o of OUTCOMES) {
    s.settled[o] = metric(map, "pilotlight_settled_total", { outcome: o });
    sum += s.settled[o];
  }
  check(s.parkedNow + sum === s.parkedTotal, "invariant parked_now + sum(settled) == parked_total", s);
  return s;
}

/** Scrapes until pred(snapshot) holds; returns that snapshot. */
async function waitMetrics(base, pred, what, ms = STEP_TIMEOUT_MS) {
  const deadline = Date.now() + ms;
  let s;
  while (Date.now() < deadline) {
    s = await scrape(base);
    if (pred(s)) return s;
    await sleep(20);
  }
  throw new Failure(`timed out waiting for ${what}; last /metrics ${JSON.stringify(s)}`);
}

// ---- the two real parties --------------------------------------------------

/** A match key plus the message the supervisor would dispatch for it. */
function makeJob(example, machine, friendlyId = (tag) => `deployment_compat${tag}`) {
  const tag = randomUUID().replaceAll("-", "").slice(0, 16);
  const msg = structuredClone(example);
  msg.deployment.friendlyId = friendlyId(tag);
  msg.backgroundWorker.version = example.backgroundWorker.version;
  msg.run.id = `compatrun${tag}`;
  msg.run.friendlyId = `run_compatrun${tag}`;
  msg.run.machine = { ...msg.run.machine, ...machine };
  // The supervisor holds a parsed DequeuedMessage; validate as it would.
  const parsed = DequeuedMessage.safeParse(msg);
  check(parsed.success, "example message fails DequeuedMessage", parsed.error?.issues);
  // Every field of the example is one the client's schema knows (an
  // unknown one would be stripped), so the pass-through covers them all.
  check(isDeepStrictEqual(JSON.parse(JSON.stringify(parsed.data)), msg),
    "DequeuedMessage drops or changes a field of the example", JSON.stringify(parsed.data));
  return {
    deploymentId: msg.deployment.friendlyId,
    version: msg.backgroundWorker.version,
    cpu: msg.run.machine.cpu,
    memory: msg.run.machine.memory,
    message: parsed.data,
  };
}

/**
 * A controller as ManagedRunController builds it: TRIGGER_MACHINE_CPU/MEMORY
 * are env strings that the supervisor set from the machine's numbers.
 */
function makeController(base, job) {
  const controllerId = `controller_${randomUUID()}`;
  const client = new WarmStartClient({
    apiUrl: new URL(base),
    controllerId,
    deploymentId: job.deploymentId,
    deploymentVersion: job.version,
    machineCpu: String(job.cpu),
    machineMemory: String(job.memory),
  });
  return { client, controllerId, workerInstanceName: `compat-node-${process.pid}` };
}

/** The controller's waitForNextRun() up to the long poll: returns the poll's settlement promise. */
async function connectAndPoll(ctl) {
  const connect = await within(ctl.client.connect(), STEP_TIMEOUT_MS, "connect()");
  check(connect.success, "connect() failed", connect);
  const connectionTimeoutMs = connect.data.connectionTimeoutMs ?? 30_000;
  const keepaliveMs = connect.data.keepaliveMs ?? 300_000;
  check(connectionTimeoutMs > 0 && keepaliveMs > 0, "controller would disable warm starts", connect.data);
  ctl.config = { connectionTimeoutMs, keepaliveMs };
  const poll = ctl.client.warmStart({
    workerInstanceName: ctl.workerInstanceName,
    connectionTimeoutMs,
    keepaliveMs,
  });
  return poll.then(
    (value) => ({ value }),
    (error) => ({ error: String(error) }),
  );
}

/** The supervisor's tryWarmStart(): returns {status, body, didWarmStart}. */
async function dispatch(base, message) {
  const res = await realFetch(new URL("/warm-start", base), {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ dequeuedMessage: message }),
  });
  const text = await res.text();
  let body;
  try {
    body = JSON.parse(text);
  } catch {
    body = text;
  }
  const didWarmStart = res.ok && typeof body?.didWarmStart === "boolean" ? body.didWarmStart : false;
  return { status: res.status, body, didWarmStart };
}

/** Checks the controller got exactly the dispatched message, raw and parsed. */
function checkDelivered(ctl, job, settled) {
  check(!settled.error, "warmStart() threw", settled.error);
  check(isDeepStrictEqual(settled.value, job.message), "warmStart() result differs from the dispatched message", {
    got: settled.value,
    sent: job.message,
  });
  const raw = polled.get(ctl.controllerId);
  check(raw && raw.status === 200, "long poll status", raw?.status);
  check(/^application\/json\b/i.test(raw.contentType ?? ""), "long poll content-type", raw.contentType);
  const sentJson = JSON.parse(JSON.stringify(job.message));
  check(isDeepStrictEqual(JSON.parse(raw.text), sentJson), "long poll body differs from dispatched JSON", raw.text);
}

// ---- cases -----------------------------------------------------------------

async function caseMatch(base, example) {
  return matchOnce(base, makeJob(example, { name: "small-1x", cpu: 0.5, memory: 0.5 }));
}

/** Ids are opaque: a bare id with two dots (shaped like a JWT) is an id. */
async function caseDotted(base, example) {
  const job = makeJob(example, { name: "small-2x", cpu: 1, memory: 1 }, (tag) => `deployment_${tag}.v2.eu`);
  return { deploymentId: job.deploymentId, ...(await matchOnce(base, job)) };
}

async function matchOnce(base, job) {
  const ctl = makeController(base, job);
  const before = await scrape(base);
  check(before.parkedNow === 0, "parked_now at start", before.parkedNow);
  const poll = connectAndPoll(ctl);
  await waitMetrics(base, (s) => s.parkedNow === 1, "pilotlight_parked_now 1");
  const d = await dispatch(base, job.message);
  check(d.status === 200 && isDeepStrictEqual(d.body, { didWarmStart: true }), "dispatch answer", d);
  checkDelivered(ctl, job, await within(poll, STEP_TIMEOUT_MS, "warmStart() after dispatch"));
  const after = await waitMetrics(base, (s) => s.parkedNow === 0, "pilotlight_parked_now 0");
  check(after.settled.matched === before.settled.matched + 1, "settled matched +1", { before, after });
  check(after.hit === before.hit + 1, "dispatch hit +1", { before, after });
  return { controllerId: ctl.controllerId, config: ctl.config };
}

async function caseAbort(base, example) {
  const job = makeJob(example, { name: "medium-1x", cpu: 1, memory: 2 });
  const ctl = makeController(base, job);
  const poll = connectAndPoll(ctl);
  const before = await waitMetrics(base, (s) => s.parkedNow === 1, "pilotlight_parked_now 1");
  ctl.client.abort();
  const settled = await within(poll, STEP_TIMEOUT_MS, "warmStart() after abort()");
  check(!settled.error && settled.value === null, "aborted warmStart() should resolve null", settled);
  const after = await waitMetrics(
    base,
    (s) => s.parkedNow === 0 && s.settled.disconnect === before.settled.disconnect + 1,
    "parked_now 0 and settled disconnect +1",
  );
  check(after.settled.matched === before.settled.matched, "no match after abort", { before, after });
  const d = await dispatch(base, job.message);
  check(d.status === 200 && isDeepStrictEqual(d.body, { didWarmStart: false }), "dispatch after abort", d);
  const last = await scrape(base);
  check(last.miss === before.miss + 1, "dispatch miss +1", { before, last });
  check(!polled.has(ctl.controllerId), "aborted poll received a response", polled.get(ctl.controllerId));
  return { controllerId: ctl.controllerId };
}

/**
 * The client aborts each fetch after connectionTimeoutMs and polls again at
 * once; the abandoned poll must be dropped and the dispatch reach the new one.
 */
async function caseRepoll(base, example) {
  const job = makeJob(example, { name: "micro", cpu: 0.25, memory: 0.25 });
  const ctl = makeController(base, job);
  const start = await scrape(base);
  const poll = connectAndPoll(ctl);
  await waitMetrics(base, (s) => s.parkedNow === 1, "pilotlight_parked_now 1");
  const cto = ctl.config?.connectionTimeoutMs ?? 0;
  if (cto > 3_000) {
    ctl.client.abort();
    await within(poll, STEP_TIMEOUT_MS, "warmStart() after abort()");
    return { skipped: `connectionTimeoutMs ${cto} > 3000` };
  }
  const repolled = await waitMetrics(
    base,
    (s) => s.parkedNow === 1 && s.parkedTotal >= start.parkedTotal + 2 && s.settled.disconnect >= start.settled.disconnect + 1,
    "a re-poll after connectionTimeoutMs",
    cto * 3 + STEP_TIMEOUT_MS,
  );
  check(repolled.settled.replaced === start.settled.replaced, "timed-out poll was replaced, not disconnected", {
    start,
    repolled,
  });
  const d = await dispatch(base, job.message);
  check(d.status === 200 && isDeepStrictEqual(d.body, { didWarmStart: true }), "dispatch answer after re-poll", d);
  checkDelivered(ctl, job, await within(poll, STEP_TIMEOUT_MS, "warmStart() after dispatch"));
  const polls = repolled.parkedTotal - start.parkedTotal;
  await waitMetrics(base, (s) => s.parkedNow === 0, "pilotlight_parked_now 0");
  return { controllerId: ctl.controllerId, polls };
}

/**
 * warm_starts = off by SIGHUP, with the server's configuration file and pid
 * in PL_COMPAT_CONF and PL_COMPAT_PID (not among the cases run by default).
 * The run controller's own rules, from its waitForNextRun(): a warmStart()
 * that comes back without a run ends the process; so does a /connect
 * answering 0 for either value. Both must happen, and on again serves.
 */
async function caseOff(base, example) {
  const conf = process.env.PL_COMPAT_CONF, pid = Number(process.env.PL_COMPAT_PID);
  check(conf && pid > 0, "case off needs PL_COMPAT_CONF and PL_COMPAT_PID");
  const setOff = async (off) => {
    fs.writeFileSync(conf, `warm_starts = ${off ? "off" : "on"}\n`);
    process.kill(pid, "SIGHUP");
    const want = (d) => (off ? d.connectionTimeoutMs === 0 : d.connectionTimeoutMs > 0);
    const deadline = Date.now() + STEP_TIMEOUT_MS;
    for (;;) {
      const c = await ctlFor(base, example).client.connect();
      if (c.success && want(c.data)) return c.data;
      check(Date.now() < deadline, "reload not taken up", c);
      await sleep(20);
    }
  };
  const job = makeJob(example, { name: "small-1x", cpu: 0.5, memory: 0.5 });
  const ctl = makeController(base, job);
  const poll = connectAndPoll(ctl);
  await waitMetrics(base, (s) => s.parkedNow === 1, "pilotlight_parked_now 1");
  const t0 = Date.now();
  const offConnect = await setOff(true);
  const settled = await within(poll, STEP_TIMEOUT_MS, "warmStart() after warm_starts = off");
  const leftMs = Date.now() - t0;
  check(!settled.error && settled.value === null, "a parked warmStart() should come back with no run", settled);
  // ... because its poll was answered (not timed out by the client)
  check(polled.get(ctl.controllerId)?.status === 503, "the parked poll's answer", polled.get(ctl.controllerId));
  check(!offConnect.connectionTimeoutMs || !offConnect.keepaliveMs,
    "/connect should make the controller exit (0 for a value)", offConnect);
  const d = await dispatch(base, job.message);
  check(d.status === 200 && isDeepStrictEqual(d.body, { didWarmStart: false }), "dispatch while off", d);
  await setOff(false);
  const again = await matchOnce(base, makeJob(example, { name: "small-2x", cpu: 1, memory: 1 }));
  return { leftMs, offConnect, again: again.config };
}

function ctlFor(base, example) {
  return makeController(base, makeJob(example, { name: "micro", cpu: 0.25, memory: 0.25 }));
}

/**
 * Runs dispatched into the last milliseconds of a poll, where the client is
 * about to abort it at connectionTimeoutMs (its own timer, from the moment
 * it calls fetch): for each poll the client starts, one dispatch at
 * <start + connectionTimeoutMs - d> for d from 16 ms down to 0. Every run
 * answered true must be one the client returns; the broker passes over the
 * polls too near their end (pilotlight_expiring_passed_total), so some of
 * those runs are answered false instead. Not among the default cases: the
 * server's connection_timeout_ms must be short (a second or two).
 */
async function caseExpiring(base, example) {
  const offsets = [16, 12, 8, 4, 2, 0];
  const rounds = 2;
  const job = makeJob(example, { name: "small-1x", cpu: 0.5, memory: 0.5 });
  const ctl = makeController(base, job);
  const connect = await within(ctl.client.connect(), STEP_TIMEOUT_MS, "connect()");
  check(connect.success, "connect() failed", connect);
  const T = connect.data.connectionTimeoutMs, keepaliveMs = connect.data.keepaliveMs;
  check(T > 0 && T <= 3000, "case expiring needs a connectionTimeoutMs of 3 s at most", connect.data);
  const sent = []; // {runId, d, answer}
  const received = new Set();
  let next = 0, poll = null;
  const startPoll = () => {
    poll = ctl.client.warmStart({ workerInstanceName: ctl.workerInstanceName, connectionTimeoutMs: T,
      keepaliveMs }).then((run) => { if (run) received.add(run.run.friendlyId); startPoll(); },
      () => startPoll());
  };
  const inFlight = [];
  onPollStart = (id, t) => {
    if (id !== ctl.controllerId || next >= offsets.length * rounds) return;
    const d = offsets[next % offsets.length], n = next++;
    const msg = structuredClone(job.message);
    msg.run.id = `${job.message.run.id}e${n}`;
    msg.run.friendlyId = `${job.message.run.friendlyId}e${n}`;
    const wait = t + T - d - performance.now();
    inFlight.push(new Promise((resolve) => setTimeout(async () => {
      const a = await dispatch(base, msg);
      sent.push({ runId: msg.run.friendlyId, d, answer: a.body?.didWarmStart });
      resolve();
    }, Math.max(0, wait))));
  };
  startPoll();
  const deadline = Date.now() + (offsets.length * rounds + 4) * (T + 200) + 10_000;
  while (next < offsets.length * rounds && Date.now() < deadline) await sleep(20);
  await Promise.all(inFlight);
  await sleep(T + 300); // a last poll's run, if any, reaches the client
  onPollStart = null;
  ctl.client.abort();
  const trueNotReceived = sent.filter((s) => s.answer === true && !received.has(s.runId));
  check(trueNotReceived.length === 0, "true for runs the client never returned", trueNotReceived);
  check(sent.length === offsets.length * rounds, "a dispatch per poll", { sent: sent.length });
  return {
    dispatched: sent.length,
    trueAnswers: sent.filter((s) => s.answer === true).length,
    received: received.size,
    byOffset: Object.fromEntries(offsets.map((d) => [d, sent.filter((s) => s.d === d && s.answer).length])),
  };
}

const CASES = { match: caseMatch, dotted: caseDotted, abort: caseAbort, repoll: caseRepoll, off: caseOff,
  expiring: caseExpiring };
const BY_DEFAULT = ["match", "dotted", "abort", "repoll"];

async function main() {
  const args = process.argv.slice(2);
  const base = args.find((a) => !a.startsWith("--"));
  const chosen = [];
  for (let i = 0; i < args.length; i++) if (args[i] === "--case") chosen.push(args[++i]);
  const names = chosen.length ? chosen : BY_DEFAULT;
  const result = { ok: false, package: `@trigger.dev/core@${packageVersion()}`, node: process.version, cases: {} };
  const hard = setTimeout(() => {
    result.error = `hard timeout ${HARD_TIMEOUT_MS} ms`;
    process.stdout.write(JSON.stringify(result) + "\n");
    process.exit(1);
  }, HARD_TIMEOUT_MS);
  hard.unref();
  try {
    check(base && /^https?:\/\//.test(base), "usage: node compat.mjs BASE_URL [--case NAME ...]");
    for (const n of names) check(CASES[n], "unknown case", n);
    const example = loadExample();
    for (const n of names) {
      const t0 = Date.now();
      result.case = n;
      result.cases[n] = { ...(await CASES[n](base, example)), ms: Date.now() - t0 };
    }
    delete result.case;
    result.ok = true;
  } catch (e) {
    result.error = e instanceof Failure ? e.message : String(e?.stack ?? e);
  }
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(result.ok ? 0 : 1);
}

main();
