// Shared helpers for the demo-data generator: tokenizer, deterministic PRNG and hashing,
// statistics. Nothing here reads the clock or Math.random, so output depends only on inputs.
import { encode as r50kEncode, decode as r50kDecode } from 'gpt-tokenizer/encoding/r50k_base';

// GPT-2 BPE (r50k_base, 50257 ids). Special-token strings in the text are encoded as plain
// text, never as <|endoftext|> (50256): the dataset builder appends EOD itself.
export function encode(text) {
  return r50kEncode(text, { disallowedSpecial: new Set() });
}

export function decode(ids) {
  return r50kDecode(ids);
}

// 32-bit FNV-1a over the UTF-8 bytes of a string.
export function fnv1a(str) {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(str, 'utf8')) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

// mulberry32: small fixed-seed PRNG, returns floats in [0, 1).
export function makeRng(seed) {
  let a = seed >>> 0;
  return function next() {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code-point order comparison (independent of locale settings).
export function cmp(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

// Nearest-rank percentile of a sorted array.
function pct(sorted, p) {
  if (sorted.length === 0) return 0;
  const k = Math.max(0, Math.ceil((p / 100) * sorted.length) - 1);
  return sorted[Math.min(k, sorted.length - 1)];
}

export function lengthStats(lengths) {
  const s = [...lengths].sort((x, y) => x - y);
  const sum = s.reduce((x, y) => x + y, 0);
  return {
    min: s.length ? s[0] : 0,
    median: pct(s, 50),
    p90: pct(s, 90),
    max: s.length ? s[s.length - 1] : 0,
    mean: s.length ? Math.round((sum / s.length) * 10) / 10 : 0,
    total: sum,
  };
}
