// controllers.js -- k6: warm run controllers. Each VU is one controller on
// its own key (deployment x preset, round robin): it long-polls
// GET /warm-start with the real x-trigger-* headers, aborts the poll after
// CONNECTION_TIMEOUT_MS as the real client does, and re-polls at once when a
// payload arrives or the poll ends. Run it beside dispatch.js.
//
//   k6 run -e BASE_URL=http://127.0.0.1:8080 -e VUS=500 -e DURATION=60s controllers.js
import http from "k6/http";
import { check } from "k6";
import exec from "k6/execution";
import { Counter, Trend } from "k6/metrics";
import { BASE_URL, keyCount, keyOf, pollHeaders } from "./lib.js";

const CONNECTION_TIMEOUT_MS = parseInt(__ENV.CONNECTION_TIMEOUT_MS || "30000", 10);

const payloads = new Counter("warm_start_payloads");
const emptyPolls = new Counter("warm_start_empty_polls");
const waitTime = new Trend("warm_start_wait_duration", true);

export const options = {
  scenarios: {
    controllers: {
      executor: "constant-vus",
      vus: parseInt(__ENV.VUS || "500", 10),
      duration: __ENV.DURATION || "60s",
      gracefulStop: `${Math.ceil(CONNECTION_TIMEOUT_MS / 1000) + 5}s`,
    },
  },
  thresholds: {
    // A non-2xx answer ends warm starts for a real controller: none allowed.
    "checks{check:poll answered 200 or 204}": ["rate>0.99"],
  },
};

export function setup() {
  const r = http.get(`${BASE_URL}/connect`);
  check(r, { "connect 200": (res) => res.status === 200 });
  return r.status === 200 ? r.json() : {};
}

export default function () {
  const vu = exec.vu.idInTest;
  const key = keyOf((vu - 1) % keyCount());
  const id = `controller_k6_${vu}`; // the same id on every poll, as a real controller
  const started = Date.now();
  const r = http.get(`${BASE_URL}/warm-start`, {
    headers: pollHeaders(id, key),
    timeout: `${CONNECTION_TIMEOUT_MS}ms`,
    tags: { name: "warm-start poll" },
  });
  if (r.error_code === 1050) {
    // Our own timeout: the real client aborts and polls again.
    emptyPolls.add(1);
    return;
  }
  check(r, { "poll answered 200 or 204": (res) => res.status === 200 || res.status === 204 });
  if (r.status === 200) {
    payloads.add(1);
    waitTime.add(Date.now() - started);
    const m = r.json();
    check(m, { "payload is a DequeuedMessage for this key": (x) => x && x.deployment && x.deployment.friendlyId === key.deployment });
  } else {
    emptyPolls.add(1);
  }
}
