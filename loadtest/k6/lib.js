// lib.js -- what the two k6 scenarios share: the deployment x machine-preset
// key space and a DequeuedMessage shaped like tests/blackbox/data/dequeued-message.json.

export const BASE_URL = __ENV.BASE_URL || "http://127.0.0.1:8080";
export const DISPATCH_URL = __ENV.DISPATCH_URL || BASE_URL;
export const DEPLOYMENTS = parseInt(__ENV.DEPLOYMENTS || "5", 10);
export const VERSION = __ENV.DEPLOYMENT_VERSION || "20261130.1";

// Trigger.dev machine presets within the protocol's cpu/memory values.
export const PRESETS = [
  { name: "micro", cpu: 0.25, memory: 0.25, centsPerMs: 0.0000042 },
  { name: "small-1x", cpu: 0.5, memory: 0.5, centsPerMs: 0.0000169 },
  { name: "small-2x", cpu: 1, memory: 1, centsPerMs: 0.0000338 },
  { name: "medium-1x", cpu: 1, memory: 2, centsPerMs: 0.0000675 },
  { name: "medium-2x", cpu: 2, memory: 4, centsPerMs: 0.000135 },
  { name: "large-1x", cpu: 4, memory: 8, centsPerMs: 0.00027 },
];

export function deploymentId(i) {
  return `deployment_k6${String(i).padStart(6, "0")}abcdefghijklmn`;
}

// Key number k -> the four match fields.
export function keyOf(k) {
  const p = PRESETS[k % PRESETS.length];
  return { deployment: deploymentId(Math.floor(k / PRESETS.length) % DEPLOYMENTS), version: VERSION, preset: p };
}

export function keyCount() {
  return DEPLOYMENTS * PRESETS.length;
}

export function randomKey() {
  return keyOf(Math.floor(Math.random() * keyCount()));
}

// The controller's poll headers: header values are JavaScript String(number).
export function pollHeaders(controllerId, key) {
  return {
    "x-trigger-workload-controller-id": controllerId,
    "x-trigger-deployment-id": key.deployment,
    "x-trigger-deployment-version": key.version,
    "x-trigger-machine-cpu": String(key.preset.cpu),
    "x-trigger-machine-memory": String(key.preset.memory),
    "x-trigger-worker-instance-name": "k6",
  };
}

export function dequeuedMessage(key, runId) {
  const now = new Date().toISOString();
  return {
    version: "1",
    snapshot: {
      id: `cm8x0snap${runId}`,
      friendlyId: `snapshot_cm8x0snap${runId}`,
      executionStatus: "PENDING_EXECUTING",
      description: "Run was dequeued for execution",
      createdAt: now,
    },
    dequeuedAt: now,
    workerQueueLength: 3,
    image: `registry.example.com/proj_abc/deployment:${key.version}`,
    completedWaitpoints: [],
    backgroundWorker: {
      id: "cm8x0bw0000001abcdefghijk",
      friendlyId: "worker_cm8x0bw0000001abcdefghijk",
      version: key.version,
      runtime: "node-22",
    },
    deployment: { id: "cm8x0dep000001abcdefghijk", friendlyId: key.deployment, imagePlatform: "linux/amd64" },
    run: {
      id: `cm8x0run${runId}`,
      friendlyId: `run_${runId}`,
      isTest: false,
      isReplay: false,
      machine: { name: key.preset.name, cpu: key.preset.cpu, memory: key.preset.memory, centsPerMs: key.preset.centsPerMs },
      attemptNumber: 1,
      masterQueue: "main",
      traceContext: { traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" },
      annotations: { triggerSource: "sdk", triggerAction: "trigger", rootTriggerSource: "sdk" },
    },
    environment: { id: "cm8x0env000001abcdefghijk", type: "PRODUCTION" },
    organization: { id: "cm8x0org000001abcdefghijk" },
    project: { id: "cm8x0prj000001abcdefghijk" },
  };
}
