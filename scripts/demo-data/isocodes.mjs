// iso-codes task (Debian package iso-codes): `translate` country names into other languages,
// from the gettext catalogues /usr/share/locale/<locale>/LC_MESSAGES/iso_3166-1.mo.
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { cmp, encode, fnv1a } from './lib.mjs';

const JSON_DIR = '/usr/share/iso-codes/json';

// GNU gettext .mo file: magic, revision, N, offset of original-string table, offset of
// translation table; each table entry is (length u32, offset u32). Returns Map msgid -> msgstr.
export function parseMo(buf) {
  const magic = buf.readUInt32LE(0);
  let u32;
  if (magic === 0x950412de) u32 = (o) => buf.readUInt32LE(o);
  else if (magic === 0xde120495) u32 = (o) => buf.readUInt32BE(o);
  else throw new Error('not a .mo file');
  const n = u32(8);
  const origTable = u32(12);
  const transTable = u32(16);
  const str = (table, i) => {
    const len = u32(table + 8 * i);
    const off = u32(table + 8 * i + 4);
    return buf.toString('utf8', off, off + len);
  };
  const out = new Map();
  for (let i = 0; i < n; i++) {
    const id = str(origTable, i);
    if (id === '' || id.includes('\u0004') || id.includes('\0')) continue; // header, context, plural
    const tr = str(transTable, i);
    if (tr !== '') out.set(id, tr);
  }
  return out;
}

function firstName(entry) {
  return (entry.name || '').split(';')[0].trim();
}

// English name of a locale like "fr", "pt_BR", "sr@latin", "zh_Hant": language from ISO 639,
// territory from ISO 3166-1, script modifiers spelled out. null when the language is unknown.
function localeName(locale, langs, countries) {
  const m = /^([a-z]{2,3})(?:_([A-Z]{2}|[A-Z][a-z]{3}))?(?:@([A-Za-z]+))?$/.exec(locale);
  if (!m) return null;
  const lang = langs.get(m[1]);
  if (!lang) return null;
  const extra = [];
  if (m[2]) {
    if (m[2] === 'Hans') extra.push('Simplified');
    else if (m[2] === 'Hant') extra.push('Traditional');
    else if (countries.has(m[2])) extra.push(countries.get(m[2]));
    else return null;
  }
  if (m[3]) {
    const scripts = { latin: 'Latin script', Latn: 'Latin script', cyrillic: 'Cyrillic script' };
    if (!scripts[m[3]]) return null; // e.g. en@quot, sr@ije, tt@iqtelif
    extra.push(scripts[m[3]]);
  }
  return extra.length ? `${lang} (${extra.join(', ')})` : lang;
}

// Selection: a (locale, country) pair is kept when FNV-1a("<locale>/<alpha_2>") % KEEP_MOD == 0;
// English locales are skipped; pairs whose translation equals the English name are skipped.
const KEEP_MOD = 13;

export function isoCodesTasks() {
  const iso639 = JSON.parse(readFileSync(`${JSON_DIR}/iso_639-3.json`, 'utf8'))['639-3'];
  const langs = new Map();
  for (const e of iso639) {
    const name = firstName(e);
    if (e.alpha_2) langs.set(e.alpha_2, name);
    langs.set(e.alpha_3, name);
  }
  const iso3166 = JSON.parse(readFileSync(`${JSON_DIR}/iso_3166-1.json`, 'utf8'))['3166-1'];
  const countries = new Map(iso3166.map((e) => [e.alpha_2, e.name]));
  const countryList = [...iso3166].sort((a, b) => cmp(a.alpha_2, b.alpha_2));

  const moFiles = execFileSync('dpkg-query', ['-L', 'iso-codes'], { encoding: 'utf8' })
    .split('\n')
    .filter((p) => /^\/usr\/share\/locale\/[^/]+\/LC_MESSAGES\/iso_3166-1\.mo$/.test(p))
    .sort(cmp);

  const samples = [];
  const localesUsed = [];
  for (const file of moFiles) {
    const locale = file.split('/')[4];
    if (locale === 'en' || locale.startsWith('en_') || locale.startsWith('en@')) continue;
    const language = localeName(locale, langs, countries);
    if (!language) continue;
    const catalogue = parseMo(readFileSync(file));
    let used = 0;
    for (const c of countryList) {
      const tr = catalogue.get(c.name);
      if (!tr || tr === c.name) continue;
      if (fnv1a(`${locale}/${c.alpha_2}`) % KEEP_MOD !== 0) continue;
      samples.push({
        task: 'translate',
        input_ids: encode(`Translate to ${language}: ${c.name}\n`),
        target_ids: encode(tr.trim()),
      });
      used++;
    }
    if (used) localesUsed.push(locale);
  }
  return { translate: samples, localesUsed };
}
