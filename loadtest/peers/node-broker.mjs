// node-broker.mjs -- the warm-start broker as Firestarter's phase 1 ran it:
// node:http and a Map of waiting responses keyed by the four match fields.
// A reference peer for the pilotlight comparison, not a product.
import http from "node:http";

const args = process.argv.slice(2);
const flag = (name, dflt) => {
  const i = args.indexOf(name);
  return i >= 0 && i + 1 < args.length ? args[i + 1] : dflt;
};
const host = flag("--host", "127.0.0.1");
const port = Number(flag("--port", "8080"));
const connectionTimeoutMs = 30000;
const keepaliveMs = 300000;

// key -> array of waiters { res, controllerId, settled }
const waiters = new Map();

const KEY_HEADERS = [
  "x-trigger-deployment-id",
  "x-trigger-deployment-version",
  "x-trigger-machine-cpu",
  "x-trigger-machine-memory",
];

function json(res, status, body) {
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}

function removeWaiter(key, w) {
  const list = waiters.get(key);
  if (!list) return;
  const i = list.indexOf(w);
  if (i >= 0) list.splice(i, 1);
  if (list.length === 0) waiters.delete(key);
}

function park(req, res) {
  for (const h of ["x-trigger-workload-controller-id", ...KEY_HEADERS]) {
    if (!req.headers[h]) return json(res, 400, { error: `missing header ${h}` });
  }
  const key = KEY_HEADERS.map((h) => req.headers[h]).join("\0");
  const w = { res, controllerId: req.headers["x-trigger-workload-controller-id"], settled: false };
  let list = waiters.get(key);
  if (!list) waiters.set(key, (list = []));
  list.push(w);
  // The controller aborted its fetch: forget the waiter (499 for the log only).
  res.on("close", () => {
    if (w.settled) return;
    w.settled = true;
    w.status = 499;
    removeWaiter(key, w);
  });
}

function dispatch(req, res) {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    let body;
    try {
      body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
    } catch {
      return json(res, 400, { error: "body is not JSON" });
    }
    const m = body && body.dequeuedMessage;
    const dep = m && m.deployment && m.deployment.friendlyId;
    const ver = m && m.backgroundWorker && m.backgroundWorker.version;
    const machine = m && m.run && m.run.machine;
    if (!dep || !ver || !machine || machine.cpu === undefined || machine.memory === undefined) {
      return json(res, 400, { error: "dequeuedMessage is missing a key field" });
    }
    const key = [dep, ver, String(machine.cpu), String(machine.memory)].join("\0");
    const list = waiters.get(key);
    while (list && list.length > 0) {
      const w = list.shift();
      if (list.length === 0) waiters.delete(key);
      if (w.settled || w.res.destroyed) continue;
      w.settled = true;
      json(w.res, 200, m);
      return json(res, 200, { didWarmStart: true });
    }
    json(res, 200, { didWarmStart: false });
  });
}

const server = http.createServer((req, res) => {
  const path = req.url.split("?")[0];
  if (path === "/warm-start") {
    if (req.method === "GET") return park(req, res);
    if (req.method === "POST") return dispatch(req, res);
    res.writeHead(405, { allow: "GET, POST" });
    return res.end();
  }
  if (path === "/connect") return json(res, 200, { connectionTimeoutMs, keepaliveMs });
  if (path === "/healthz") return json(res, 200, { ok: true });
  json(res, 404, { error: "not found" });
});
server.keepAliveTimeout = 120000;
server.headersTimeout = 60000;
server.requestTimeout = 0;
server.timeout = 0;
server.maxConnections = 1000000;
server.listen(port, host, () => {
  const a = server.address();
  process.stderr.write(JSON.stringify({ msg: "listening", address: `${a.address}:${a.port}` }) + "\n");
});
for (const sig of ["SIGTERM", "SIGINT"]) process.on(sig, () => process.exit(0));
