#!/usr/bin/env node
// Prints records of the demo JSONL decoded back to text (as JSON strings, so whitespace shows).
// usage: node decode_sample.mjs demo.jsonl TASK INDEX [INDEX...]   (INDEX counts within TASK)
import { readFileSync } from 'node:fs';
import { decode } from './lib.mjs';

const [file, task, ...idx] = process.argv.slice(2);
if (!file || !task || idx.length === 0) {
  console.error('usage: node decode_sample.mjs demo.jsonl TASK INDEX [INDEX...]');
  process.exit(2);
}
const recs = readFileSync(file, 'utf8').trim().split('\n').map(JSON.parse).filter((r) => r.task === task);
for (const i of idx.map(Number)) {
  const r = recs[i];
  if (!r) {
    console.log(`===== ${task} #${i}: no such record (${recs.length} records)`);
    continue;
  }
  console.log(`===== ${task} #${i} (input ${r.input_ids.length} tokens, target ${r.target_ids?.length ?? '-'})`);
  console.log(JSON.stringify(decode(r.input_ids)));
  if (r.target_ids) console.log('--> ' + JSON.stringify(decode(r.target_ids)));
}
