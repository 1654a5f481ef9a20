// controllers.mjs -- many idle run controllers in one process, each
// Trigger.dev's real WarmStartClient, for the impaired-network tests
// (tests/harness/impair.py).
//
// Usage: node controllers.mjs SPEC_JSON
//   SPEC: {"url": BASE_URL, "controllers": [{"id", "key": [deployment,
//          version, cpu, memory], "url"?: its own BASE_URL}], "work_ms":
//          [MIN, MAX], "max_runtime_s": S, "connect_each_poll": BOOL}
//
// Each controller calls /connect once, then loops as a warm container does:
// long-poll with warmStart(), "work" MIN..MAX ms on the run it got, poll
// again. With connect_each_poll it calls /connect before every poll, as
// Trigger.dev's managed run controller does (waitForNextRun in
// packages/cli-v3/src/entryPoints/managed/controller.ts). One JSON line on stdout per event; {"ev":"run","ctl","run"} is a
// receipt: the client returned the parsed run, so the controller would start
// it; {"ev":"backoff","ctl","s","t"} is a wait of the client's own back-off
// after a failed request, <s> seconds long, begun at <t>. Ends on SIGTERM or
// after max_runtime_s.

import { WarmStartClient } from "@trigger.dev/core/v3/workers";

// The client logs through console.*; stdout carries only our events.
for (const k of ["log", "info", "debug", "warn"]) console[k] = console.error;

function emit(event) {
  process.stdout.write(JSON.stringify(event) + "\n");
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function controller(spec, c) {
  const [deploymentId, deploymentVersion, cpu, memory] = c.key;
  const client = new WarmStartClient({
    apiUrl: new URL(c.url ?? spec.url),
    controllerId: c.id,
    deploymentId,
    deploymentVersion,
    machineCpu: String(cpu),
    machineMemory: String(memory),
  });
  // The client's back-off, timed (its own wait, reported as it ends), with
  // the error it logged just before.
  const backoff = client.backoff, logError = client.logger.error.bind(client.logger);
  let why = "";
  client.logger.error = (message, fields) => {
    const e = fields?.error;
    why = e?.cause ? `${e.cause.code ?? ""} ${e.cause.message ?? ""}` : String(e?.message ?? e ?? message);
    logError(message, fields);
  };
  client.backoff = {
    wait: async (retries) => {
      const t0 = Date.now();
      await backoff.wait(retries);
      emit({ ev: "backoff", ctl: c.id, retry: retries, s: (Date.now() - t0) / 1000, t: t0 / 1000, why });
    },
  };
  let connect = await client.connect();
  if (!connect.success) {
    emit({ ev: "connect_failed", ctl: c.id, error: String(connect.error) });
    return;
  }
  const [lo, hi] = spec.work_ms;
  let first = true;
  for (;;) {
    if (spec.connect_each_poll && !first) {
      connect = await client.connect();
      if (!connect.success) {
        emit({ ev: "connect_failed", ctl: c.id, error: String(connect.error) });
        return;
      }
    }
    const connectionTimeoutMs = connect.data.connectionTimeoutMs ?? 30_000;
    const keepaliveMs = connect.data.keepaliveMs ?? 300_000;
    const poll = client.warmStart({ workerInstanceName: "impaired-node", connectionTimeoutMs, keepaliveMs });
    if (first) {
      emit({ ev: "polling", ctl: c.id });
      first = false;
    }
    let run;
    try {
      run = await poll;
    } catch (e) {
      // A payload that fails the client's schema: the real controller exits.
      emit({ ev: "client_error", ctl: c.id, error: String(e) });
      return;
    }
    if (!run) {
      emit({ ev: "no_run", ctl: c.id });
      continue;
    }
    emit({ ev: "run", ctl: c.id, run: run.run.friendlyId, t: Date.now() / 1000 });
    await sleep(lo + Math.random() * (hi - lo));
  }
}

const spec = JSON.parse(process.argv[2] ?? "null");
if (!spec?.url || !Array.isArray(spec.controllers)) {
  console.error("usage: node controllers.mjs SPEC_JSON");
  process.exit(2);
}
process.on("SIGTERM", () => process.exit(0));
setTimeout(() => process.exit(3), spec.max_runtime_s * 1000);
for (const c of spec.controllers) {
  controller(spec, c).catch((e) => emit({ ev: "crashed", ctl: c.id, error: String(e?.stack ?? e) }));
}
