// bun-broker.ts -- the warm-start broker written to the design Trigger.dev
// published for Firestarter ("Why we replaced Node.js with Bun for 5x
// throughput"): Bun.serve() routes, one Map keyed by the four match fields
// joined with \0, presence checks instead of a schema library, and an abort
// listener that settles the pending response with 499. A reference peer for
// the pilotlight comparison, not a product.

type Waiter = {
  resolve: (r: Response) => void;
  controllerId: string;
  settled: boolean;
};

const args = process.argv.slice(2);
function flag(name: string, dflt: string): string {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
}
const hostname = flag("--host", "127.0.0.1");
const port = Number(flag("--port", "8080"));
const connectionTimeoutMs = 30000;
const keepaliveMs = 300000;

const waiters = new Map<string, Waiter[]>();

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}

function removeWaiter(key: string, w: Waiter): void {
  const list = waiters.get(key);
  if (!list) return;
  const i = list.indexOf(w);
  if (i >= 0) list.splice(i, 1);
  if (list.length === 0) waiters.delete(key);
}

function park(req: Request): Response | Promise<Response> {
  const h = req.headers;
  const controllerId = h.get("x-trigger-workload-controller-id");
  const dep = h.get("x-trigger-deployment-id");
  const ver = h.get("x-trigger-deployment-version");
  const cpu = h.get("x-trigger-machine-cpu");
  const mem = h.get("x-trigger-machine-memory");
  if (!controllerId) return json(400, { error: "missing x-trigger-workload-controller-id" });
  if (!dep) return json(400, { error: "missing x-trigger-deployment-id" });
  if (!ver) return json(400, { error: "missing x-trigger-deployment-version" });
  if (!cpu) return json(400, { error: "missing x-trigger-machine-cpu" });
  if (!mem) return json(400, { error: "missing x-trigger-machine-memory" });
  const key = `${dep}\0${ver}\0${cpu}\0${mem}`;
  return new Promise<Response>((resolve) => {
    const w: Waiter = { resolve, controllerId, settled: false };
    let list = waiters.get(key);
    if (!list) waiters.set(key, (list = []));
    list.push(w);
    // Bun fires abort twice for one disconnect: settle once.
    req.signal.addEventListener("abort", () => {
      if (w.settled) return;
      w.settled = true;
      removeWaiter(key, w);
      resolve(new Response(null, { status: 499 }));
    });
  });
}

async function dispatch(req: Request): Promise<Response> {
  let body: any;
  try {
    body = await req.json();
  } catch {
    return json(400, { error: "body is not JSON" });
  }
  const m = body?.dequeuedMessage;
  if (!m || typeof m !== "object") return json(400, { error: "missing dequeuedMessage" });
  const dep = m.deployment?.friendlyId;
  const ver = m.backgroundWorker?.version;
  const cpu = m.run?.machine?.cpu;
  const mem = m.run?.machine?.memory;
  if (dep === undefined || ver === undefined || cpu === undefined || mem === undefined) {
    return json(400, { error: "dequeuedMessage is missing a key field" });
  }
  const key = `${dep}\0${ver}\0${String(cpu)}\0${String(mem)}`;
  const list = waiters.get(key);
  while (list && list.length > 0) {
    const w = list.shift()!;
    if (list.length === 0) waiters.delete(key);
    if (w.settled) continue;
    w.settled = true;
    w.resolve(json(200, m));
    return json(200, { didWarmStart: true });
  }
  return json(200, { didWarmStart: false });
}

const server = Bun.serve({
  hostname,
  port,
  idleTimeout: 120,
  routes: {
    "/warm-start": { GET: park, POST: dispatch },
    "/connect": () => json(200, { connectionTimeoutMs, keepaliveMs }),
    "/healthz": () => json(200, { ok: true }),
  },
  fetch() {
    return json(404, { error: "not found" });
  },
});

console.error(JSON.stringify({ msg: "listening", address: `${server.hostname}:${server.port}` }));
for (const sig of ["SIGTERM", "SIGINT"] as const) process.on(sig, () => process.exit(0));
