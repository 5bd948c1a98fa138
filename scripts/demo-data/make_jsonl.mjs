#!/usr/bin/env node
// Writes the packpipe demo multi-task dataset as JSON lines:
//   {"task": "...", "input_ids": [...], "target_ids": [...]}   (target_ids only for input/target tasks)
// GPT-2 BPE ids (r50k_base), no EOD. Records are grouped by task in TASK_ORDER, each task in
// source order. The output depends only on the installed packages: no clock, no Math.random.
//
// usage: node make_jsonl.mjs [--tasks TASK,...] OUTPUT.jsonl [STATS.json]
//   --tasks: the tasks to write (default: DEMO_TASKS below, the six tasks of demo.jsonl); the
//   long-document task man_page is written only when named, e.g. --tasks man_page.
import { writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { lengthStats } from './lib.mjs';
import { wordnetTasks } from './wordnet.mjs';
import { isoCodesTasks } from './isocodes.mjs';
import { manTasks, manPageTask } from './manpages.mjs';

// Every task, in output order, with the source module that makes it.
const TASK_ORDER = ['define', 'synonyms', 'translate', 'man_summarize', 'man_explain', 'man_text', 'man_page'];
const SOURCE = {
  define: 'wordnet', synonyms: 'wordnet', translate: 'iso', man_summarize: 'man', man_explain: 'man',
  man_text: 'man', man_page: 'man_page',
};
const DEMO_TASKS = TASK_ORDER.slice(0, 6);

const USAGE = 'usage: node make_jsonl.mjs [--tasks TASK,...] OUTPUT.jsonl [STATS.json]';

function parseArgs(argv) {
  let tasks = DEMO_TASKS;
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--tasks' || a.startsWith('--tasks=')) {
      const v = a === '--tasks' ? argv[++i] : a.slice('--tasks='.length);
      const want = (v ?? '').split(',').filter((t) => t !== '');
      const unknown = want.filter((t) => !TASK_ORDER.includes(t));
      if (want.length === 0 || unknown.length) {
        console.error(`make_jsonl: --tasks: unknown or no task '${unknown.join(',')}' (expected some of ${TASK_ORDER.join(',')})`);
        process.exit(2);
      }
      tasks = TASK_ORDER.filter((t) => want.includes(t));
    } else {
      rest.push(a);
    }
  }
  return { tasks, outPath: rest[0], statsPath: rest[1] };
}

async function main() {
  const { tasks, outPath, statsPath } = parseArgs(process.argv.slice(2));
  if (!outPath) {
    console.error(USAGE);
    process.exit(2);
  }
  // Only the sources the chosen tasks need are read.
  const need = new Set(tasks.map((t) => SOURCE[t]));
  const wn = need.has('wordnet') ? wordnetTasks() : null;
  const iso = need.has('iso') ? isoCodesTasks() : null;
  const man = need.has('man') ? await manTasks() : null;
  const manPage = need.has('man_page') ? await manPageTask() : null;
  const byTask = { ...wn, ...iso, ...man, ...manPage };

  const lines = [];
  const stats = { tasks: {}, records: 0, input_tokens: 0, target_tokens: 0 };
  for (const task of tasks) {
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
  stats.sources = {};
  if (wn) stats.sources.wordnet_synsets = wn.synsetCount;
  if (man) stats.sources.man_pages = man.pageCount;
  if (iso) stats.sources.iso_codes_locales = iso.localesUsed.length;
  if (manPage) stats.sources.man_page_pages = manPage.pageCount; // pages with h % 4 == 2

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
