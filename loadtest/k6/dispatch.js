// dispatch.js -- k6: the supervisor side, after the Firestarter article's
// benchmark. VUs post DequeuedMessages for random deployment x machine-preset
// keys to POST /warm-start and count hits (didWarmStart true) and misses.
// Start controllers.js first so there are parked polls to hit.
//
//   k6 run -e DISPATCH_URL=http://127.0.0.1:8080 -e VUS=50 -e DURATION=60s dispatch.js
import http from "k6/http";
import { check } from "k6";
import exec from "k6/execution";
import { Counter, Trend } from "k6/metrics";
import { DISPATCH_URL, dequeuedMessage, randomKey } from "./lib.js";

const hits = new Counter("warm_start_hits");
const misses = new Counter("warm_start_misses");
const matchDuration = new Trend("warm_start_match_duration", true);

export const options = {
  scenarios: {
    dispatch: {
      executor: "constant-vus",
      vus: parseInt(__ENV.VUS || "50", 10),
      duration: __ENV.DURATION || "60s",
    },
  },
  thresholds: {
    http_req_failed: ["rate<0.01"],
    http_req_duration: [`p(95)<${__ENV.P95_MS || "50"}`],
    warm_start_match_duration: [`p(95)<${__ENV.MATCH_P95_MS || "50"}`],
  },
};

export default function () {
  const key = randomKey();
  const runId = `k6${exec.vu.idInTest}x${exec.vu.iterationInScenario}`;
  const body = JSON.stringify({ dequeuedMessage: dequeuedMessage(key, runId) });
  const r = http.post(`${DISPATCH_URL}/warm-start`, body, {
    headers: { "content-type": "application/json" },
    tags: { name: "warm-start dispatch" },
  });
  const ok = check(r, { "dispatch 200": (res) => res.status === 200 });
  if (!ok) return;
  const warm = r.json("didWarmStart") === true;
  if (warm) {
    hits.add(1);
    matchDuration.add(r.timings.duration);
  } else {
    misses.add(1);
  }
}
