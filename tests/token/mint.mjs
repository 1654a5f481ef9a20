// mint.mjs -- deployment-token test vectors for pilotlight's verifier.
//
// Usage: node mint.mjs OUT.json
//        node mint.mjs --one SECRET DEPLOYMENT VERSION EXP_SECONDS
//        node mint.mjs --many < SPECS.json   (see liveToken() below)
//
// Genuine tokens are minted with the real `jose` library exactly as
// Trigger.dev's mintWorkloadDeploymentToken() does (@trigger.dev/core 4.8.3,
// v3/workloadDeploymentToken.js + v3/jwt.js generateJWT): payload
// {ver: 1, ...claims}, setIssuer("https://id.trigger.dev"),
// setAudience("https://api.trigger.dev"), protected header {alg: "HS256"},
// setExpirationTime(<absolute seconds>), no iat, key = UTF-8 bytes of the
// secret string. Forgeries are built from those, by jose where it can
// produce them, by hand (node:crypto HMAC) where it refuses to.
//
// Each vector records what pilotlight must answer ("expect", "why") and what
// jose + Trigger.dev's claims schema answer ("jose"), computed here live, so
// the test can check pilotlight is never more lenient than Trigger.dev.
// When tests/compat has @trigger.dev/core installed, the genuine token is
// also minted by Trigger.dev's own function and must be byte-identical.
import { createHmac } from "node:crypto";
import { writeFileSync } from "node:fs";
import { SignJWT, UnsecuredJWT, jwtVerify } from "jose";

const ISSUER = "https://id.trigger.dev";
const AUDIENCE = "https://api.trigger.dev";
const NOW = 1750000000; // seconds; the verifier is given this as "now"
const EXP = NOW + 3600;
const SECRET = "tr_wdt_2f8c1e0b9a7d4c3b8e6f5a4d3c2b1a09";
const CLAIMS = {
  deployment: "deployment_cm3xk9y2p0001abcd",
  deployment_version: "20250615.3",
  environment_id: "cm3xk9y2p0002efgh",
  environment_type: "PRODUCTION",
  org_id: "cm3xk9y2p0003ijkl",
  project_id: "cm3xk9y2p0004mnop",
};
const STRING_CLAIMS = Object.keys(CLAIMS);

const enc = new TextEncoder();
const b64 = (text) => Buffer.from(text, "utf8").toString("base64url");

// Trigger.dev's mint, step for step (generateJWT with omitIssuedAt). An
// <exp> of null leaves exp out.
async function mint(claims = CLAIMS, secret = SECRET, exp = EXP, opts = {}) {
  const jwt = new SignJWT({ ver: 1, ...claims })
    .setIssuer(opts.iss ?? ISSUER)
    .setAudience(opts.aud ?? AUDIENCE)
    .setProtectedHeader(opts.header ?? { alg: "HS256" });
  if (exp !== null) jwt.setExpirationTime(exp);
  if (opts.iat !== undefined) jwt.setIssuedAt(opts.iat);
  return jwt.sign(enc.encode(secret));
}

// A token from raw JSON texts, HMAC-signed with <alg>'s hash.
function signRaw(headerText, payloadText, secret = SECRET, hash = "sha256") {
  const input = `${b64(headerText)}.${b64(payloadText)}`;
  return `${input}.${createHmac(hash, enc.encode(secret)).update(input).digest("base64url")}`;
}

// Re-signs the first two segments of <token> as they are (text, not bytes).
function resign(token, secret = SECRET) {
  const [h, p] = token.split(".");
  const input = `${h}.${p}`;
  return `${input}.${createHmac("sha256", enc.encode(secret)).update(input).digest("base64url")}`;
}

// The standard claims as one JSON text, iss/aud/exp where jose puts them.
function payloadText(extra = "", claims = CLAIMS) {
  const body = JSON.stringify({ ver: 1, ...claims, iss: ISSUER, aud: AUDIENCE, exp: EXP });
  return extra ? body.slice(0, -1) + "," + extra + "}" : body;
}

// What Trigger.dev's verifyWorkloadDeploymentToken() would say at NOW:
// jwtVerify with issuer/audience, then the zod schema of the claims.
async function joseVerdict(token, secret) {
  if (token.split(".").length !== 3 || token.split(".").some((p) => p === "")) return "not-a-token";
  try {
    const { payload } = await jwtVerify(token, enc.encode(secret), {
      issuer: ISSUER,
      audience: AUDIENCE,
      currentDate: new Date(NOW * 1000),
    });
    const ok =
      payload.ver === 1 &&
      STRING_CLAIMS.every((k) => typeof payload[k] === "string") &&
      typeof payload.exp === "number" &&
      Number.isFinite(payload.exp);
    return ok ? "valid" : "invalid";
  } catch {
    return "invalid";
  }
}

const vectors = [];
// <stricter>: pilotlight refuses what Trigger.dev's own verifier accepts,
// on purpose (documented in the vector's note).
function add(name, token, expect, why, { secret = SECRET, claims = null, stricter = null } = {}) {
  const v = { name, secret, token, expect, why };
  if (claims) {
    v.deployment = claims.deployment;
    v.deployment_version = claims.deployment_version;
  }
  if (stricter) v.stricter = stricter;
  vectors.push(v);
}

const without = (k) => Object.fromEntries(Object.entries(CLAIMS).filter(([n]) => n !== k));
const flip = (s, i) => s.slice(0, i) + (s[i] === "A" ? "B" : "A") + s.slice(i + 1);

async function build() {
  const good = await mint();
  add("trigger-minted", good, "valid", "valid", { claims: CLAIMS });
  add("exp-fractional-future", await mint(CLAIMS, SECRET, NOW + 0.5), "valid", "valid", { claims: CLAIMS });
  add("exp-fractional-past", await mint(CLAIMS, SECRET, NOW - 0.5), "invalid", "expired");
  add("exp-now", await mint(CLAIMS, SECRET, NOW), "invalid", "expired");
  add("exp-past", await mint(CLAIMS, SECRET, NOW - 1), "invalid", "expired");
  add("exp-missing", await mint(CLAIMS, SECRET, null), "invalid", "bad_claim");
  const uni = "sécret-🔑-ключ";
  add("unicode-secret", await mint(CLAIMS, uni), "valid", "valid", { secret: uni, claims: CLAIMS });
  const long = "L".repeat(100) + "ü"; // longer than SHA-256's block: HMAC hashes the key
  add("long-secret", await mint(CLAIMS, long), "valid", "valid", { secret: long, claims: CLAIMS });
  const uc = { ...CLAIMS, deployment: "deployment_ünïcödé", environment_type: "PRÖD" };
  add("unicode-claims", await mint(uc), "valid", "valid", { claims: uc });
  const ev = { ...CLAIMS, deployment_version: "" };
  add("empty-version", await mint(ev), "valid", "valid", { claims: ev });
  add("aud-array-with", await mint(CLAIMS, SECRET, EXP, { aud: ["https://x.example", AUDIENCE] }),
      "valid", "valid", { claims: CLAIMS });
  add("typ-jwt", await mint(CLAIMS, SECRET, EXP, { header: { alg: "HS256", typ: "JWT" } }),
      "valid", "valid", { claims: CLAIMS });
  add("with-iat", await mint(CLAIMS, SECRET, EXP, { iat: NOW - 10 }), "valid", "valid", { claims: CLAIMS });

  add("wrong-secret", await mint(CLAIMS, "another-secret"), "invalid", "bad_signature");
  const [h, p, s] = good.split(".");
  const other = (await mint({ ...CLAIMS, deployment: "deployment_victim" })).split(".")[1];
  add("swapped-payload", `${h}.${other}.${s}`, "invalid", "bad_signature");
  add("tampered-signature", `${h}.${p}.${flip(s, 0)}`, "invalid", "bad_signature");
  add("short-signature", `${h}.${p}.${"A".repeat(42)}`, "invalid", "bad_signature");
  add("long-signature", `${h}.${p}.${s}AAAA`, "invalid", "bad_signature");

  add("alg-none-unsecured", new UnsecuredJWT({ ver: 1, ...CLAIMS }).setIssuer(ISSUER)
      .setAudience(AUDIENCE).setExpirationTime(EXP).encode(), "invalid", "malformed");
  add("alg-none-signed", signRaw('{"alg":"none"}', payloadText()), "invalid", "bad_alg");
  add("alg-hs512", await mint(CLAIMS, SECRET, EXP, { header: { alg: "HS512" } }), "invalid", "bad_alg",
      { stricter: "Trigger.dev's validateJWT does not restrict algorithms; only HS256 is minted" });
  add("alg-hs384", await mint(CLAIMS, SECRET, EXP, { header: { alg: "HS384" } }), "invalid", "bad_alg",
      { stricter: "as alg-hs512" });
  add("alg-hs512-in-hs256-header", signRaw('{"alg":"HS512"}', payloadText()), "invalid", "bad_alg");
  // No "alg": not a JWT header, so the value is a bare id (ids are opaque).
  add("alg-missing", signRaw('{"typ":"JWT"}', payloadText()), "legacy", "legacy");
  add("alg-lowercase", signRaw('{"alg":"hs256"}', payloadText()), "invalid", "bad_alg");
  add("crit", signRaw('{"alg":"HS256","crit":["exp"],"exp":1}', payloadText()), "invalid", "crit");
  add("typ-other", signRaw('{"alg":"HS256","typ":"at+jwt"}', payloadText()), "invalid", "bad_typ",
      { stricter: "typ must be absent or JWT" });
  add("duplicate-header-key", signRaw('{"alg":"none","alg":"HS256"}', payloadText()), "invalid",
      "bad_header", { stricter: "JSON.parse keeps the last duplicate; pilotlight refuses duplicates" });
  add("duplicate-payload-key",
      signRaw('{"alg":"HS256"}', payloadText('"deployment":"deployment_victim"')), "invalid",
      "bad_payload", { stricter: "as duplicate-header-key" });
  add("nul-escape-in-claim",
      signRaw('{"alg":"HS256"}', payloadText('"note":"a\\u0000b"')), "invalid", "bad_payload",
      { stricter: "\\u0000 would end a C string early" });
  add("lone-surrogate-in-claim",
      signRaw('{"alg":"HS256"}', payloadText('"note":"a\\ud800b"')), "invalid", "bad_payload",
      { stricter: "a lone surrogate is no text a C string or a header can carry" });
  // JSON.parse refuses these, so jose does: a signed token is no exception.
  add("raw-tab-in-claim", signRaw('{"alg":"HS256"}', payloadText('"note":"a\tb"')), "invalid",
      "bad_payload");
  add("leading-zero-number", signRaw('{"alg":"HS256"}', payloadText('"note":01')), "invalid",
      "bad_payload");
  add("trailing-dot-number", signRaw('{"alg":"HS256"}', payloadText('"note":1.')), "invalid",
      "bad_payload");
  // jose's TextDecoder drops a byte order mark before the JSON text.
  add("bom-before-payload", signRaw('{"alg":"HS256"}', "\ufeff" + payloadText()), "valid", "valid",
      { claims: CLAIMS });

  add("wrong-iss", await mint(CLAIMS, SECRET, EXP, { iss: "https://id.evil.dev" }), "invalid", "bad_iss");
  add("wrong-aud", await mint(CLAIMS, SECRET, EXP, { aud: "https://app.trigger.dev" }), "invalid", "bad_aud");
  add("aud-array-without", await mint(CLAIMS, SECRET, EXP, { aud: ["https://x.example"] }),
      "invalid", "bad_aud");
  add("ver-2", signRaw('{"alg":"HS256"}', payloadText().replace('"ver":1', '"ver":2')),
      "invalid", "bad_ver");
  add("ver-string", signRaw('{"alg":"HS256"}', payloadText().replace('"ver":1', '"ver":"1"')),
      "invalid", "bad_ver");
  add("nbf-future", signRaw('{"alg":"HS256"}', payloadText(`"nbf":${NOW + 60}`)),
      "invalid", "not_yet_valid");
  add("exp-string", signRaw('{"alg":"HS256"}', payloadText().replace(`"exp":${EXP}`, `"exp":"${EXP}"`)),
      "invalid", "bad_claim");
  add("exp-infinite", signRaw('{"alg":"HS256"}', payloadText().replace(`"exp":${EXP}`, '"exp":1e999')),
      "invalid", "bad_claim");
  for (const k of STRING_CLAIMS) {
    add(`missing-${k}`, await mint(without(k)), "invalid", "bad_claim");
    add(`number-${k}`, await mint({ ...CLAIMS, [k]: 42 }), "invalid", "bad_claim");
    const upper = k[0].toUpperCase() + k.slice(1);
    add(`case-${upper}`, await mint({ ...without(k), [upper]: CLAIMS[k] }), "invalid", "bad_claim");
  }
  add("empty-deployment", await mint({ ...CLAIMS, deployment: "" }), "invalid", "bad_claim",
      { stricter: "an empty deployment can never name a key" });

  // A genuine token whose signature has '-' or '_', rewritten in the
  // standard alphabet ('+', '/'): the same bytes to a lenient decoder.
  for (let i = 0; ; i++) {
    if (i === 200) throw new Error("no signature with '-' or '_' in 200 tries");
    const c = { ...CLAIMS, deployment_version: `20250615.${i}` };
    const [ch, cp, cs] = (await mint(c)).split(".");
    const std = cs.replace(/-/g, "+").replace(/_/g, "/");
    if (std === cs) continue;
    add("standard-alphabet-signature", `${ch}.${cp}.${std}`, "invalid", "bad_base64",
        { stricter: "Node's base64url decoder accepts the standard alphabet too" });
    break;
  }
  add("plus-in-signature", `${h}.${p}.${s.slice(0, 5)}+${s.slice(6)}`, "invalid", "bad_base64");
  add("padded-signature", `${good}=`, "invalid", "bad_base64",
      { stricter: "Node's base64url decoder ignores padding" });
  add("padded-payload", resign(`${h}.${p}==.x`), "invalid", "bad_base64",
      { stricter: "as padded-signature" });
  // Not base64url, so no JWT header: a bare id (enforce answers 401 all the same).
  add("space-in-header", resign(`${h.slice(0, 4)} ${h.slice(4)}.${p}.x`), "legacy", "legacy",
      { stricter: "Node's base64url decoder skips whitespace" });
  const a64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  const last = a64.indexOf(s[s.length - 1]); // 32 bytes: 2 unused bits, zero
  add("noncanonical-signature-bits", `${h}.${p}.${s.slice(0, -1)}${a64[last | 1]}`, "invalid",
      "bad_base64", { stricter: "non-zero unused bits are a second encoding of the same bytes" });
  add("extra-segment", `${good}.${s}`, "invalid", "malformed");
  add("empty-payload-segment", `${h}..${s}`, "invalid", "malformed");
  add("empty-signature-segment", `${h}.${p}.`, "invalid", "malformed");
  const big = { ...CLAIMS, project_id: "p".repeat(3200) };
  add("too-long", await mint(big), "invalid", "too_long",
      { stricter: "tokens over 4096 bytes are refused unread" });
  add("legacy-bare-id", CLAIMS.deployment, "legacy", "legacy");
  add("absent", "", "absent", "absent");
  return good;
}

// Trigger.dev's own mint, when tests/compat has it installed.
async function checkTriggerCore(good) {
  const path = new URL(
    "../compat/node_modules/@trigger.dev/core/dist/esm/v3/workloadDeploymentToken.js",
    import.meta.url,
  );
  let mod;
  try {
    mod = await import(path.href);
  } catch {
    return "unavailable";
  }
  const theirs = await mod.mintWorkloadDeploymentToken(CLAIMS, SECRET, EXP);
  if (theirs !== good) throw new Error(`Trigger.dev minted ${theirs}, jose here minted ${good}`);
  // Its verifier reads the real clock: give it a token that is live now.
  const live = Math.floor(Date.now() / 1000) + 3600;
  const fresh = await mint(CLAIMS, SECRET, live);
  if ((await mod.mintWorkloadDeploymentToken(CLAIMS, SECRET, live)) !== fresh)
    throw new Error("Trigger.dev's mint differs for a live expiry");
  const check = await mod.verifyWorkloadDeploymentToken(fresh, SECRET);
  if (!check.ok) throw new Error(`Trigger.dev does not verify our token: ${check.error}`);
  return "identical";
}

// ---- live tokens for the black-box tests (tests/blackbox/test_identity.py)
//
// --one SECRET DEPLOYMENT VERSION EXP_SECONDS prints one token minted as
// above, expiring EXP_SECONDS (negative: already expired) from the real clock.
// --many reads a JSON array of specs on stdin and prints a JSON array of
// tokens, one per spec: {secret, deployment, version, exp (seconds from now,
// default 3600) or exp_at (absolute, seconds since the epoch), kind}. kind "jose" (default) mints as Trigger.dev does;
// "unsecured" is jose's UnsecuredJWT (alg none, empty signature); "raw" signs
// the JSON text of spec.header over the same claims by hand (HMAC-SHA256),
// for headers jose refuses to write, such as {"alg":"none"}.
async function liveToken(spec) {
  const claims = { ...CLAIMS, deployment: spec.deployment, deployment_version: spec.version };
  const exp = spec.exp_at ?? Math.floor(Date.now() / 1000) + Number(spec.exp ?? 3600);
  const secret = spec.secret ?? SECRET;
  switch (spec.kind ?? "jose") {
    case "jose":
      return mint(claims, secret, exp);
    case "unsecured":
      return new UnsecuredJWT({ ver: 1, ...claims }).setIssuer(ISSUER).setAudience(AUDIENCE)
        .setExpirationTime(exp).encode();
    case "raw":
      return signRaw(JSON.stringify(spec.header),
                     JSON.stringify({ ver: 1, ...claims, iss: ISSUER, aud: AUDIENCE, exp }), secret);
    default:
      throw new Error(`unknown kind ${spec.kind}`);
  }
}

async function readStdin() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  return Buffer.concat(chunks).toString("utf8");
}

const mode = process.argv[2];
if (mode === "--one") {
  const [secret, deployment, version, exp] = process.argv.slice(3);
  if (exp === undefined || !Number.isFinite(Number(exp))) {
    console.error("usage: node mint.mjs --one SECRET DEPLOYMENT VERSION EXP_SECONDS");
    process.exit(2);
  }
  console.log(await liveToken({ secret, deployment, version, exp: Number(exp) }));
} else if (mode === "--many") {
  const specs = JSON.parse(await readStdin());
  const tokens = [];
  for (const spec of specs) tokens.push(await liveToken(spec));
  console.log(JSON.stringify(tokens));
} else {
  const out = mode;
  if (!out || out.startsWith("--")) {
    console.error("usage: node mint.mjs OUT.json | --one SECRET DEPLOYMENT VERSION EXP_SECONDS | --many < SPECS.json");
    process.exit(2);
  }
  const good = await build();
  for (const v of vectors) v.jose = await joseVerdict(v.token, v.secret);
  const triggerCore = await checkTriggerCore(good);
  writeFileSync(out, JSON.stringify({ now: NOW, trigger_core: triggerCore, vectors }, null, 1));
  console.log(`${vectors.length} vectors, trigger_core ${triggerCore}`);
}
