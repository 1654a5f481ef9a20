// gen-dispatch.mjs -- writes dispatch.tsv: dispatch bodies with the verdict,
// key and payload that the controller's JavaScript reading gives them.
//
//   node tests/vectors/gen-dispatch.mjs > tests/vectors/dispatch.tsv
//
// A body is read as the controller reads a payload: UTF-8 decoded strictly
// (a lenient decoder would silently turn bad bytes into U+FFFD, so the
// controller would read other text than was sent), then JSON.parse. On top of
// what JSON.parse refuses, pilotlight refuses what it cannot read the same
// way, and what this script encodes as its policy: a member name twice in
// one object (JSON.parse keeps the last, a router reading first-wins would
// route on the other), key strings holding U+0000 (a C reading ends there;
// no header carries one) or a lone surrogate (no header carries one either),
// nesting deeper than 1000, and the protocol's key rules.
//
// Each line: ok <body hex> <friendlyId hex> <version hex> <cpu> <memory>
// <payload byte offset> <payload bytes> <label>, or bad <body hex> <text
// the 400's error must contain> <label>; fields are tab-separated.
import { isDeepStrictEqual } from 'node:util';

const MAX_DEPTH = 1000;
const FIELD_MAX = 512;
const KEY_PATHS = {
  friendlyId: ['dequeuedMessage', 'deployment', 'friendlyId'],
  version: ['dequeuedMessage', 'backgroundWorker', 'version'],
};
const NOT_HEADER_TEXT = /\u0000|\p{Surrogate}/u; // with the u flag, only lone ones

// Walks text JSON.parse accepted: member names per object (compared as
// JavaScript strings), nesting depth, and the raw span of every value on a
// path of up to three names.
function scan(text) {
  let i = 0, depth = 0, maxDepth = 0, dup;
  const spans = new Map();
  const ws = () => { while (' \t\n\r'.includes(text[i]) && i < text.length) i++; };
  const str = () => {
    const s = i++;
    while (text[i] !== '"') i += text[i] === '\\' ? 2 : 1;
    return text.slice(s, ++i);
  };
  const value = (path) => {
    ws();
    const start = i;
    if (text[i] === '{' || text[i] === '[') {
      const obj = text[i++] === '{', seen = new Set();
      maxDepth = Math.max(maxDepth, ++depth);
      ws();
      while (text[i] !== '}' && text[i] !== ']') {
        let sub = null;
        if (obj) {
          const raw = str(), name = JSON.parse(raw);
          if (seen.has(name) && dup === undefined) dup = raw.slice(1, -1);
          seen.add(name);
          if (path && path.length < 3) sub = path.concat([name]);
          ws();
          i++; // ':'
        }
        value(sub);
        ws();
        if (text[i] === ',') { i++; ws(); }
      }
      i++;
      depth--;
    } else if (text[i] === '"') {
      str();
    } else {
      while (i < text.length && !',]} \t\n\r'.includes(text[i])) i++;
    }
    if (path) spans.set(JSON.stringify(path), [start, i]);
  };
  value([]);
  return { maxDepth, dup, spans };
}

function judge(buf) {
  let text, doc;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(buf);
    doc = JSON.parse(text);
  } catch {
    return { bad: 'not valid JSON' };
  }
  const s = scan(text);
  if (s.maxDepth > MAX_DEPTH) return { bad: 'nested too deeply' };
  if (s.dup !== undefined)
    return { bad: s.dup.length <= 64 ? `duplicate member name \\"${s.dup}\\"` : 'duplicate member name' };
  const isObj = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
  const dm = isObj(doc) && Object.hasOwn(doc, 'dequeuedMessage') ? doc.dequeuedMessage : undefined;
  if (!isObj(dm)) return { bad: 'dequeuedMessage must be an object' };
  const at = (o, ...names) => names.reduce((v, n) => (isObj(v) && Object.hasOwn(v, n) ? v[n] : undefined), o);
  const key = {};
  for (const [field, path] of Object.entries(KEY_PATHS)) {
    const v = at(doc, ...path);
    if (typeof v !== 'string' || v === '') return { bad: `${field} must be a non-empty string` };
    if (NOT_HEADER_TEXT.test(v)) return { bad: `${field} must not contain \\\\u0000 or a lone surrogate` };
    if (Buffer.byteLength(v) > FIELD_MAX) return { bad: `${field} is too long` };
    key[field] = v;
  }
  for (const field of ['cpu', 'memory']) {
    const v = at(dm, 'run', 'machine', field);
    if (typeof v !== 'number' || !Number.isFinite(v)) return { bad: `${field} must be a number` };
    key[field] = v === 0 ? 0 : v;
  }
  const [p0, p1] = s.spans.get(JSON.stringify(['dequeuedMessage']));
  if (!isDeepStrictEqual(JSON.parse(text.slice(p0, p1)), dm)) throw new Error('payload span');
  const offset = Buffer.byteLength(text.slice(0, p0));
  return { key, offset, length: Buffer.byteLength(text.slice(p0, p1)) };
}

// ---- the bodies --------------------------------------------------------
const B = (s) => Buffer.from(s, 'utf8');
const dmText = (extra = '', dep = '"deployment_a"', ver = '"20261130.1"', cpu = '0.5', mem = '1') =>
  `{"deployment":{"friendlyId":${dep}},"backgroundWorker":{"version":${ver}},` +
  `"run":{"friendlyId":"run_1","machine":{"cpu":${cpu},"memory":${mem}}}${extra}}`;
const body = (extra, ...k) => `{"dequeuedMessage":${dmText(extra, ...k)}}`;
const raw = (...parts) => Buffer.concat(parts.map((p) => (typeof p === 'string' ? B(p) : Buffer.from(p))));

const cases = [
  ['minimal', B(body())],
  ['pretty', B(JSON.stringify(JSON.parse(body(',"payload":{"a":[1,2,{"b":null}]}')), null, 2))],
  ['ws-all-four', B(` \t\r\n{ "dequeuedMessage" :\n${dmText()} }\r\n\t `)],
  ['members-around', B(`{"other":{"dequeuedMessage":1},"dequeuedMessage":${dmText()},"tail":[1,{}]}`)],
  ['numbers-valid', B(body(',"n":[0,-0,1.5,-2e10,3E+2,4e-2,0.0001,123456789012345678901234567890,1e999,-1e-999]'))],
  ['cpu-exp', B(body('', undefined, undefined, '5e-1', '1.0e0'))],
  ['cpu-negzero', B(body('', undefined, undefined, '-0', '-0.0'))],
  ['cpu-long-digits', B(body('', undefined, undefined, '0.50000000000000000000000000000000000001', '2'))],
  ['strings-escapes', B(body(',"s":"\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\ud83d\\ude00 \\u0000"'))],
  ['strings-lone-surrogates', B(body(',"s":"\\ud800 \\udc00 \\udbff"'))],
  ['strings-utf8', B(body(',"s":"é € 😀 \u{10FFFF} \u007f"'))],
  ['key-utf8', B(body('', '"déploiement_é"', '"v€"'))],
  ['escaped-dm-name', B(`{"\\u0064equeuedMessage":${dmText()}}`)],
  ['escaped-other-names', B(body(',"\\u0061":1,"b\\n":2,"\\ud83d\\ude00":3'))],
  ['same-name-other-objects', B(body(',"a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]'))],
  ['lone-surrogate-names-differ', B(body(',"\\ud83d":1,"\\ude00":2,"\\ud83d\\ude00":3'))],
  ['deep-ok', B(body(`,"a":${'['.repeat(MAX_DEPTH - 2)}${']'.repeat(MAX_DEPTH - 2)}`))],
  ['big-object', B(body(`,"x":{${Array.from({ length: 1500 }, (_, n) => `"k${n}":${n}`).join(',')}}`))],
  // what JSON.parse refuses
  ['leading-zero', B(body(',"cpu2":01'))],
  ['leading-zero-key', B(body('', undefined, undefined, '01'))],
  ['leading-zero-neg', B(body(',"n":-01'))],
  ['trailing-dot', B(body(',"n":1.'))],
  ['leading-dot', B(body(',"n":.5'))],
  ['plus-sign', B(body(',"n":+1'))],
  ['exp-no-digits', B(body(',"n":1e'))],
  ['exp-sign-no-digits', B(body(',"n":1e+'))],
  ['minus-alone', B(body(',"n":-'))],
  ['hex-number', B(body(',"n":0x10'))],
  ['nan', B(body(',"n":NaN'))],
  ['infinity', B(body(',"n":Infinity'))],
  ['ctl-as-ws', raw('{"dequeuedMessage":{"id":"r",', [0x01], `"deployment":{"friendlyId":"deployment_a"},"backgroundWorker":{"version":"v"},"run":{"machine":{"cpu":1,"memory":1}}}}`)],
  ['formfeed-as-ws', raw(body(), [0x0c])],
  ['vtab-as-ws', raw([0x0b], body())],
  ['nbsp-as-ws', raw(body(), [0xc2, 0xa0])],
  ['raw-lf-in-string', B(body(',"s":"a\nb"'))],
  ['raw-bel-in-string', raw(body(',"s":"a'), [0x07], '"}}').subarray(0)],
  ['raw-tab-in-string', B(body(',"s":"a\tb"'))],
  ['raw-nul-in-string', raw('{"dequeuedMessage":', dmText(',"s":"a'), [0x00], '"}').subarray(0)],
  ['raw-del-in-string-ok', raw(body(',"s":"a'), [0x7f], '"}}').subarray(0)],
  ['trailing-nul', raw(body(), [0x00])],
  ['trailing-nuls', raw(body(), [0x00, 0x00, 0x00])],
  ['trailing-garbage', B(body() + ' x')],
  ['two-documents', B(body() + body())],
  ['bom', raw([0xef, 0xbb, 0xbf], body())],
  ['utf8-overlong-slash', raw(body(',"s":"'), [0xc0, 0xaf], '"')],
  ['utf8-overlong-3', raw(body(',"s":"'), [0xe0, 0x80, 0xaf], '"')],
  ['utf8-surrogate', raw(body(',"s":"'), [0xed, 0xa0, 0x80], '"')],
  ['utf8-above-10ffff', raw(body(',"s":"'), [0xf4, 0x90, 0x80, 0x80], '"')],
  ['utf8-truncated', raw(body(',"s":"'), [0xe2, 0x82], '"')],
  ['utf8-lone-continuation', raw(body(',"s":"'), [0x80], '"')],
  ['utf8-in-name', raw(body(',"'), [0xff], '":1')],
  ['bad-escape', B(body(',"s":"\\x"'))],
  ['short-u-escape', B(body(',"s":"\\u12"'))],
  ['single-quotes', B(body(",\"s\":'x'"))],
  ['trailing-comma-array', B(body(',"a":[1,]'))],
  ['trailing-comma-object', B(`{"dequeuedMessage":${dmText()},}`)],
  ['comment', B(`{"dequeuedMessage":${dmText()} /* c */}`)],
  ['unterminated', B(body().slice(0, -1))],
  ['empty', B('')],
  ['deep-too-deep', B(body(`,"a":${'['.repeat(MAX_DEPTH - 1)}${']'.repeat(MAX_DEPTH - 1)}`))],
  // what another reader could take otherwise than JSON.parse: repeated
  // member names, key strings spelt with escapes
  ['dup-deployment', B('{"dequeuedMessage":{"deployment":{"friendlyId":"B"},"backgroundWorker":{"version":"v"},' +
                       '"run":{"machine":{"cpu":1,"memory":1}},"deployment":{"friendlyId":"A"}}}')],
  ['dup-friendlyId', B(body('', '"B","friendlyId":"A"'))],
  ['dup-dequeuedMessage', B(`{"dequeuedMessage":${dmText('', '"B"')},"dequeuedMessage":${dmText('', '"A"')}}`)],
  ['dup-escaped-spelling', B(`{"dequeuedMessage":${dmText()},"\\u0064equeuedMessage":1}`)],
  ['dup-deep', B(body(',"x":[{"a":1,"b":{"c":1,"c":2},"a":2}]'))],
  ['dup-pair-vs-raw', B(body(',"😀":1,"\\ud83d\\ude00":2'))],
  ['dup-cpu', B(body('', undefined, undefined, '1,"cpu":2'))],
  ['dup-top-level-other', B(`{"x":1,"x":2,"dequeuedMessage":${dmText()}}`)],
  ['nul-in-friendlyId', B(body('', '"A\\u0000B"'))],
  ['nul-at-end-of-friendlyId', B(body('', '"deployment_a\\u0000"'))],
  ['lone-surrogate-in-friendlyId', B(body('', '"deployment_\\ud800"'))],
  ['lone-surrogate-in-version', B(body('', undefined, '"v\\udfff"'))],
  ['pair-in-friendlyId', B(body('', '"deployment_\\ud83d\\ude00"'))],
  ['escape-in-friendlyId', B(body('', '"deployment_\\u0061"'))],
  ['escape-in-version', B(body('', undefined, '"1\\/2"'))],
  ['quote-backslash-tab-in-friendlyId', B(body('', '"deployment_q\\"uote\\\\back\\tslash"'))],
  ['escaped-friendlyId-too-long', B(body('', `"${'\\u0078'.repeat(FIELD_MAX + 1)}"`))],
  ['escaped-friendlyId-longest', B(body('', `"${'\\u0078'.repeat(FIELD_MAX)}"`))],
  ['nul-in-dm-name', B(`{"dequeuedMessage\\u0000x":${dmText()}}`)],
  ['nul-in-dm-name-and-real', B(`{"dequeuedMessage\\u0000x":${dmText('', '"B"')},"dequeuedMessage":${dmText('', '"A"')}}`)],
  // the key rules
  ['top-array', B(`[${body()}]`)],
  ['top-string', B('"dequeuedMessage"')],
  ['no-dm', B('{}')],
  ['dm-array', B('{"dequeuedMessage":[]}')],
  ['dm-null', B('{"dequeuedMessage":null}')],
  ['friendlyId-number', B(body('', '7'))],
  ['friendlyId-empty', B(body('', '""'))],
  ['friendlyId-too-long', B(body('', `"${'x'.repeat(FIELD_MAX + 1)}"`))],
  ['friendlyId-longest', B(body('', `"${'x'.repeat(FIELD_MAX)}"`))],
  ['deployment-array', B('{"dequeuedMessage":{"deployment":["friendlyId"]}}')],
  ['version-missing', B('{"dequeuedMessage":{"deployment":{"friendlyId":"d"}}}')],
  ['cpu-string', B(body('', undefined, undefined, '"1"'))],
  ['cpu-null', B(body('', undefined, undefined, 'null'))],
  ['memory-missing', B('{"dequeuedMessage":{"deployment":{"friendlyId":"d"},"backgroundWorker":{"version":"v"},"run":{"machine":{"cpu":1}}}}')],
  ['memory-overflow', B(body('', undefined, undefined, '1', '1e999'))],
];

const hex = (b) => Buffer.from(b).toString('hex');
const out = ['# generated by tests/vectors/gen-dispatch.mjs (Node ' + process.version + '); do not edit'];
const labels = new Set();
for (const [label, buf] of cases) {
  if (labels.has(label)) throw new Error(`label ${label} twice`);
  labels.add(label);
  const v = judge(buf);
  out.push(v.bad !== undefined
    ? ['bad', hex(buf), v.bad, label].join('\t')
    : ['ok', hex(buf), hex(B(v.key.friendlyId)), hex(B(v.key.version)), String(v.key.cpu),
       String(v.key.memory), v.offset, v.length, label].join('\t'));
}
process.stdout.write(out.join('\n') + '\n');
