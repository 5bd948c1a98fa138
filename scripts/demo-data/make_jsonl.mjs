#!/usr/bin/env node
// Writes the packpipe demo multi-task dataset as JSON lines:
//   {"task": "...", "input_ids": [...], "target_ids": [...]}   (target_ids only for input/target tasks)
// GPT-2 BPE ids (r50k_base), no EOD. Records are grouped by task in TASK_ORDER, each task in
// source order. The output depends only on the installed packages: no clock, no Math.random.
//
// usage: node make_jsonl.mjs OUTPUT.jsonl [STATS.json]
import { writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { lengthStats } from './lib.mjs';
import { wordnetTasks } from './wordnet.mjs';
import { isoCodesTasks } from './isocodes.mjs';
import { manTasks } from './manpages.mjs';

const TASK_ORDER = ['define', 'synonyms', 'translate', 'man_summarize', 'man_explain', 'man_text'];

async function main() {
  const [outPath, statsPath] = process.argv.slice(2);
  if (!outPath) {
    console.error('usage: node make_jsonl.mjs OUTPUT.jsonl [STATS.json]');
    process.exit(2);
  }
  const wn = wordnetTasks();
  const iso = isoCodesTasks();
  const man = await manTasks();
  const byTask = { ...wn, ...iso, ...man };

  const lines = [];
  const stats = { tasks: {}, records: 0, input_tokens: 0, target_tokens: 0 };
  for (const task of TASK_ORDER) {
    const recs = byTask[task];
    const st = { count: recs.length, input: lengthStats(recs.map((r) => r.input_ids.length)) };
    if (recs.length && recs[0].target_ids) st.target = lengthStats(recs.map((r) => r.target_ids.length));
    stats.tasks[task] = st;
    stats.records += recs.length;
    stats.input_tokens += st.input.total;
    stats.target_tokens += st.target ? st.target.total : 0;
    for (const r of recs) {
      for (const id of [...r.input_ids, ...(r.target_ids ?? [])]) {
        if (!Number.isInteger(id) || id < 0 || id >= 50256) throw new Error(`bad token id ${id} in ${task}`);
      }
      if (r.input_ids.length === 0 || (r.target_ids && r.target_ids.length === 0)) {
        throw new Error(`empty sequence in ${task}`);
      }
      const o = { task, input_ids: r.input_ids };
      if (r.target_ids) o.target_ids = r.target_ids;
      lines.push(JSON.stringify(o));
    }
  }
  stats.total_tokens = stats.input_tokens + stats.target_tokens;
  stats.sources = {
    wordnet_synsets: wn.synsetCount,
    man_pages: man.pageCount,
    iso_codes_locales: iso.localesUsed.length,
  };

  mkdirSync(path.dirname(path.resolve(outPath)), { recursive: true });
  writeFileSync(outPath, lines.join('\n') + '\n');
  if (statsPath) writeFileSync(statsPath, JSON.stringify(stats, null, 2) + '\n');

  console.log(`wrote ${stats.records} records, ${stats.total_tokens} tokens to ${outPath}`);
  console.log('task            count   input min/median/p90/max      target min/median/p90/max');
  for (const [task, st] of Object.entries(stats.tasks)) {
    const f = (s) => (s ? `${s.min}/${s.median}/${s.p90}/${s.max}` : '-');
    console.log(`${task.padEnd(15)} ${String(st.count).padStart(6)}   ${f(st.input).padEnd(28)}  ${f(st.target)}`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
