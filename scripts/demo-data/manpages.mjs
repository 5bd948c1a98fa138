// Man-page tasks (Debian packages manpages, manpages-dev): `man_summarize`, `man_explain`, the
// decoder-only `man_text` and, built only on request, the decoder-only long-document `man_page`.
// Pages are rendered to plain text with groff (groff-base), so no roff markup reaches the data.
import { readFileSync, lstatSync } from 'node:fs';
import { execFileSync, spawn } from 'node:child_process';
import { gunzipSync } from 'node:zlib';
import { cmp, encode, fnv1a, makeRng } from './lib.mjs';

const PACKAGES = ['manpages', 'manpages-dev'];

// Regular (non-symlink) page files owned by the packages, sorted by path.
export function listPages() {
  const out = [];
  for (const pkg of PACKAGES) {
    const files = execFileSync('dpkg-query', ['-L', pkg], { encoding: 'utf8' }).split('\n');
    for (const f of files) {
      if (!/^\/usr\/share\/man\/man[1-9]\/[^/]+\.gz$/.test(f)) continue;
      if (lstatSync(f).isSymbolicLink()) continue;
      out.push(f);
    }
  }
  return out.sort(cmp);
}

// groff with tbl, the man macros, UTF-8 output without overstriking, a line length too long
// to ever wrap (every filled paragraph becomes one line) and no hyphenation.
const GROFF_ARGS = ['-t', '-man', '-Tutf8', '-rLL=3000n', '-rHY=0', '-P', '-cbou'];

function renderOne(roff) {
  return new Promise((resolve, reject) => {
    const p = spawn('groff', GROFF_ARGS, {
      env: { PATH: process.env.PATH, LC_ALL: 'C.UTF-8' },
      stdio: ['pipe', 'pipe', 'ignore'],
    });
    const chunks = [];
    p.stdout.on('data', (c) => chunks.push(c));
    p.on('error', reject);
    p.on('close', (code) => {
      if (code !== 0) reject(new Error(`groff exited with ${code}`));
      else resolve(Buffer.concat(chunks).toString('utf8'));
    });
    p.stdin.end(roff);
  });
}

// Renders all pages, `jobs` groff processes at a time; results in input order.
export async function renderPages(files, jobs = 2) {
  const results = new Array(files.length);
  let next = 0;
  async function worker() {
    while (next < files.length) {
      const i = next++;
      const roff = gunzipSync(readFileSync(files[i]));
      // A page that is only a `.so` link to another page has no text of its own.
      if (/^\.so\s/.test(roff.toString('utf8', 0, 8))) {
        results[i] = null;
        continue;
      }
      results[i] = await renderOne(roff);
    }
  }
  await Promise.all(Array.from({ length: jobs }, worker));
  return results;
}

// Typographic characters groff emits for roff escapes, mapped back to the ASCII a person
// would type (\- and \(hy become U+2212/U+2010, \(aq and quotes become curly quotes...).
const CHAR_MAP = new Map([
  ['\u2212', '-'], ['\u2010', '-'], ['\u2011', '-'], ['\u2018', "'"], ['\u2019', "'"],
  ['\u201c', '"'], ['\u201d', '"'], ['\u00a0', ' '], ['\u00b4', "'"], ['\u02c6', '^'],
  ['\u02dc', '~'], ['\u27e8', '<'], ['\u27e9', '>'],
]);
const CHAR_RE = new RegExp(`[${[...CHAR_MAP.keys()].join('')}]`, 'g');

function cleanLine(s) {
  return s
    .replace(CHAR_RE, (c) => CHAR_MAP.get(c))
    .replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, '') // stray control characters
    .replace(/\s+$/, '')
    // groff puts two spaces after a sentence end; a writer would put one.
    .replace(/([a-z0-9)\]"'][.!?])  (?=\S)/g, '$1 ')
    .replace(/([a-z0-9)\]"'][:;])  (?=[A-Z("'])/g, '$1 ');
}

// tbl draws boxed tables across the full line length when a column is expandable (`x`), so
// with the very long line length a rule can be thousands of characters wide. In each run of
// consecutive lines holding box-drawing characters, a column where every line has a space or
// a horizontal rule is padding (after the block's indentation): keep at most two such columns in a row, delete the rest.
const BOX_RE = /[\u2500-\u257f]/;

function compactTables(lines) {
  const out = [];
  for (let i = 0; i < lines.length; ) {
    if (!BOX_RE.test(lines[i])) {
      out.push(lines[i++]);
      continue;
    }
    let j = i;
    while (j < lines.length && BOX_RE.test(lines[j])) j++;
    const block = lines.slice(i, j).map((l) => [...l]);
    const width = Math.max(...block.map((l) => l.length));
    const lead = Math.min(...block.map((l) => l.findIndex((c) => c !== ' ')));
    const keep = [];
    for (let p = 0; p < lead; p++) keep.push(p); // the indentation stays
    let run = 0;
    for (let p = lead; p < width; p++) {
      const pad = block.every((l) => p >= l.length || l[p] === ' ' || l[p] === '\u2500');
      run = pad ? run + 1 : 0;
      if (run <= 2) keep.push(p);
    }
    for (const l of block) out.push(keep.map((p) => l[p] ?? ' ').join('').replace(/\s+$/, ''));
    i = j;
  }
  return out;
}

// {name, sec} of a page file: /usr/share/man/man2/open.2.gz -> {name: 'open', sec: '2'}.
export function pageKey(file) {
  const base = file.split('/').pop().replace(/\.gz$/, '');
  const dot = base.lastIndexOf('.');
  return { name: base.slice(0, dot), sec: base.slice(dot + 1) };
}

// The hash that assigns pages to tasks (below): FNV-1a of "<name>.<sec>".
function pageHash({ name, sec }) {
  return fnv1a(`${name}.${sec}`);
}

// Splits rendered text into {name, sec, title, sections: [{title, lines: [{indent, text}]}]}.
// Section headings are at column 0, subsection headings at column 3, body text at column 7.
export function parsePage(file, rendered) {
  const page = { ...pageKey(file), sections: [] };
  const raw = compactTables(rendered.split('\n').map(cleanLine));
  // Drop the running header (first non-empty line) and footer (last non-empty line).
  let a = 0;
  while (a < raw.length && raw[a] === '') a++;
  let b = raw.length - 1;
  while (b >= 0 && raw[b] === '') b--;
  let cur = null;
  for (const line of raw.slice(a + 1, b)) {
    const indent = line.length - line.trimStart().length;
    const text = line.trim();
    if (text !== '' && indent === 0) {
      cur = { title: text, lines: [] };
      page.sections.push(cur);
    } else if (cur) {
      cur.lines.push({ indent, text });
    }
  }
  for (const s of page.sections) {
    while (s.lines.length && s.lines[0].text === '') s.lines.shift();
    while (s.lines.length && s.lines[s.lines.length - 1].text === '') s.lines.pop();
  }
  return page;
}

// Plain text of a list of lines: body column 7 becomes column 0, deeper indentation is kept,
// subsection headings (column 3) start at column 0; runs of blank lines become one.
function linesToText(lines, baseIndent = 7) {
  const out = [];
  for (const { indent, text } of lines) {
    if (text === '') {
      if (out.length && out[out.length - 1] !== '') out.push('');
      continue;
    }
    out.push(' '.repeat(Math.max(0, indent - baseIndent)) + text);
  }
  while (out.length && out[out.length - 1] === '') out.pop();
  return out;
}

function section(page, title) {
  return page.sections.find((s) => s.title === title);
}

// Largest prefix of `lines` (whole lines) whose encoding, after `prefix`, fits in `limit`.
function encodeTruncated(prefix, lines, limit) {
  let ids = encode(prefix + lines.join('\n'));
  if (ids.length <= limit) return ids;
  let lo = 1;
  let hi = lines.length - 1;
  let best = null;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const cand = encode(prefix + lines.slice(0, mid).join('\n').trimEnd());
    if (cand.length <= limit) {
      best = cand;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return best ?? ids.slice(0, limit); // a single over-long first line: cut at the token limit
}

// man_summarize: input = "Summarize the manual page <name>(<sec>):\n\n" + DESCRIPTION text,
// at most SUMMARIZE_MAX_INPUT tokens (cut at a line boundary); target = the NAME line's
// description (the part after " - ").
const SUMMARIZE_MAX_INPUT = 3000;

function summarize(page) {
  const name = section(page, 'NAME');
  const desc = section(page, 'DESCRIPTION');
  if (!name || !desc) return null;
  const nameLine = name.lines.map((l) => l.text).join(' ');
  const dash = nameLine.indexOf(' - ');
  if (dash < 0) return null;
  const summary = nameLine.slice(dash + 3).trim();
  const body = linesToText(desc.lines);
  if (summary === '' || body.length === 0) return null;
  return {
    task: 'man_summarize',
    input_ids: encodeTruncated(`Summarize the manual page ${page.name}(${page.sec}):\n\n`, body, SUMMARIZE_MAX_INPUT),
    target_ids: encode(summary),
  };
}

// man_explain: tagged paragraphs (.TP/.IP items: an option, flag, error code, field...) of
// the DESCRIPTION, OPTIONS, ERRORS, RETURN VALUE and ENVIRONMENT sections.
// input = "In <name>(<sec>), what does <tag> mean?\n"; target = the item's text.
// At most EXPLAIN_PER_PAGE items per page, spread evenly over the page's items.
const EXPLAIN_SECTIONS = new Set(['DESCRIPTION', 'OPTIONS', 'ERRORS', 'RETURN VALUE', 'ENVIRONMENT']);
const EXPLAIN_PER_PAGE = 3;
const EXPLAIN_MAX_TARGET = 2000;

function taggedItems(lines) {
  const items = [];
  for (let i = 0; i < lines.length; i++) {
    const { indent, text } = lines[i];
    if (text === '') continue;
    let tag = null;
    let bodyIndent = -1;
    let first = null;
    const next = lines[i + 1];
    if (indent < 7) continue; // subsection headings are not items
    if (next && next.text !== '' && next.indent > indent) {
      // Tag on its own line, item text indented below it.
      tag = text;
      bodyIndent = next.indent;
    } else {
      // Short tag on the same line as the start of the item text (default .TP width 7).
      const m = /^(\S(?:\S| (?! ))*?)( {2,})(\S.*)$/.exec(text);
      if (m && m[1].length + m[2].length === 7) {
        tag = m[1];
        bodyIndent = indent + 7;
        first = m[3];
      }
    }
    if (tag === null) continue;
    const body = first === null ? [] : [{ indent: bodyIndent, text: first }];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const l = lines[j];
      if (l.text !== '' && l.indent < bodyIndent) break;
      body.push(l);
    }
    items.push({ tag, body: linesToText(body, bodyIndent) });
    i = j - 1;
  }
  return items;
}

function plausibleItem({ tag, body }) {
  if (tag.length > 60 || !/[A-Za-z]/.test(tag) || /[{;,]$/.test(tag)) return false;
  if (body.length === 0) return false;
  const text = body.join('\n');
  // Prose, not a code block: several words and a sentence end.
  return /[a-z]{2,} [a-z]{2,} [a-z]{2,}/.test(text) && /[.)]$/.test(text);
}

function explain(page) {
  const items = [];
  for (const s of page.sections) {
    if (!EXPLAIN_SECTIONS.has(s.title)) continue;
    for (const it of taggedItems(s.lines)) if (plausibleItem(it)) items.push(it);
  }
  const picked = [];
  const k = Math.min(EXPLAIN_PER_PAGE, items.length);
  for (let n = 0; n < k; n++) picked.push(items[Math.floor(((2 * n + 1) * items.length) / (2 * k))]);
  return picked.map(({ tag, body }) => {
    let target = encode(body.join('\n'));
    if (target.length > EXPLAIN_MAX_TARGET) target = encodeTruncated('', body, EXPLAIN_MAX_TARGET);
    return {
      task: 'man_explain',
      input_ids: encode(`In ${page.name}(${page.sec}), what does ${tag} mean?\n`),
      target_ids: target,
    };
  });
}

// man_text (decoder-only): the whole page as plain text, cut at line boundaries into chunks
// whose lengths are drawn log-uniformly from [TEXT_MIN, TEXT_MAX] tokens by a PRNG seeded
// with FNV-1a of the page name; a chunk never exceeds TEXT_MAX tokens; a last chunk shorter
// than TEXT_MIN tokens is dropped.
const TEXT_MIN = 50;
const TEXT_MAX = 2048;

function pageText(page) {
  const out = [];
  for (const s of page.sections) {
    if (out.length) out.push('');
    out.push(s.title);
    out.push(...linesToText(s.lines));
  }
  return out;
}

function textChunks(page) {
  const rng = makeRng(pageHash(page));
  const lines = pageText(page);
  const lineTokens = lines.map((l) => encode(l + '\n').length);
  const chunks = [];
  let i = 0;
  while (i < lines.length) {
    const want = Math.round(Math.exp(Math.log(TEXT_MIN) + rng() * Math.log(TEXT_MAX / TEXT_MIN)));
    let j = i;
    let n = 0;
    while (j < lines.length && n < want) n += lineTokens[j++];
    const piece = lines.slice(i, j);
    while (piece.length && piece[piece.length - 1] === '') piece.pop();
    i = j;
    while (i < lines.length && lines[i] === '') i++; // next chunk starts at text
    if (piece.length === 0) continue;
    let ids = encode(piece.join('\n'));
    if (ids.length > TEXT_MAX) ids = encodeTruncated('', piece, TEXT_MAX);
    if (ids.length < TEXT_MIN) continue;
    chunks.push({ task: 'man_text', input_ids: ids });
  }
  return chunks;
}

// man_page (decoder-only, long documents): the whole page as plain text (the same text
// man_text cuts into chunks), cut at a line boundary to at most PAGE_MAX tokens, so that with
// the EOD the dataset builder appends every document fits a context of 8192; pages under
// PAGE_MIN tokens are dropped.
const PAGE_MIN = 256;
const PAGE_MAX = 8191;

function wholePage(page) {
  const lines = pageText(page);
  const ids = encodeTruncated('', lines, PAGE_MAX);
  if (ids.length < PAGE_MIN) return null;
  return { task: 'man_page', input_ids: ids };
}

// Page assignment by h = FNV-1a("<name>.<sec>"), which keeps the token count modest and the
// long-text tasks on disjoint pages: man_text uses pages with h % 4 == 0, man_summarize
// pages with h % 2 == 1, man_page pages with h % 4 == 2, man_explain every page.

export async function manTasks() {
  const files = listPages();
  const rendered = await renderPages(files);
  const out = { man_summarize: [], man_explain: [], man_text: [] };
  let pages = 0;
  files.forEach((f, i) => {
    if (rendered[i] === null) return;
    const page = parsePage(f, rendered[i]);
    pages++;
    const h = pageHash(page);
    if (h % 2 === 1) {
      const s = summarize(page);
      if (s) out.man_summarize.push(s);
    }
    out.man_explain.push(...explain(page));
    if (h % 4 === 0) out.man_text.push(...textChunks(page));
  });
  return { ...out, pageCount: pages };
}

// The long-document task alone (not part of manTasks, so the six-task demo.jsonl is unchanged):
// only the pages with h % 4 == 2 are rendered.
export async function manPageTask() {
  const files = listPages().filter((f) => pageHash(pageKey(f)) % 4 === 2);
  const rendered = await renderPages(files);
  const out = { man_page: [] };
  let pages = 0;
  files.forEach((f, i) => {
    if (rendered[i] === null) return;
    pages++;
    const doc = wholePage(parsePage(f, rendered[i]));
    if (doc) out.man_page.push(doc);
  });
  return { ...out, pageCount: pages };
}
