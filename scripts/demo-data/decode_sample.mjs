import { readFileSync } from 'node:fs';
import { decode } from './lib.mjs';
const [file, task, ...idx] = process.argv.slice(2);
const recs = readFileSync(file, 'utf8').trim().split('\n').map(JSON.parse).filter(r => r.task === task);
for (const i of idx.map(Number)) {
  const r = recs[i];
  console.log(`===== ${task} #${i} (${r.input_ids.length}/${r.target_ids?.length ?? '-'})`);
  console.log(JSON.stringify(decode(r.input_ids)).slice(0, 1500));
  if (r.target_ids) console.log('--> ' + JSON.stringify(decode(r.target_ids)).slice(0, 1500));
}
