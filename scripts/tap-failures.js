#!/usr/bin/env node
// What failed in a tap log (TAP 14, as `tap -R tap` prints it), one line per failed assertion:
//   <file> › <subtest> › … › <assertion>: found … wanted … (or the error's message)
// .ci/run prints it last, just above the totals, where a shortened log still shows it: the
// detailed diagnostics above it may be cut, these lines name every failure and what it saw.
// Usage: node scripts/tap-failures.js <log> [max lines]
'use strict';
const fs = require('node:fs');

const [file, maxArg] = process.argv.slice(2);
const max = Number(maxArg ?? 60);
const lines = fs.readFileSync(file, 'utf8').split('\n');
const indentOf = (l) => l.match(/^ */)[0].length;
const clip = (s, n) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);
const flat = (s) => s.replace(/\s+/g, ' ').trim();

const path = []; // subtest names by nesting level (4 spaces a level)
const out = [];
for (let i = 0; i < lines.length; i++) {
  const line = lines[i];
  const sub = line.match(/^( *)# Subtest: (.*)$/);
  if (sub) {
    const level = sub[1].length / 4;
    path.length = level;
    path[level] = sub[2];
    continue;
  }
  const bad = line.match(/^( *)not ok \d+ - (.*?)(?: # time=[\d.]+m?s)?$/);
  if (!bad) continue;
  const level = bad[1].length / 4;
  // A subtest's own "not ok" (its children failed) follows its diagnostics-less children: skip
  // it when a failure inside it was already reported.
  const prefix = path.slice(0, level).filter(Boolean);
  const here = [...prefix, bad[2]].join(' › ');
  if (out.some((o) => o.path.startsWith(`${here} › `))) continue;
  // The YAML block under it, if any: found/wanted, else the first line of a message or diff.
  const diag = {};
  if ((lines[i + 1] ?? '').trim() === '---') {
    const base = indentOf(lines[i + 1]);
    let key = '';
    for (let j = i + 2; j < lines.length && j < i + 200; j++) {
      const l = lines[j];
      if (l.trim() === '...' && indentOf(l) === base) break;
      const kv = l.match(/^ *([a-zA-Z_]+): ?(.*)$/);
      if (kv && indentOf(l) === base) {
        key = kv[1];
        diag[key] = kv[2] === '>' || kv[2] === '|' || kv[2] === '>-' || kv[2] === '|-' ? '' : kv[2];
      } else if (key && indentOf(l) > base) diag[key] += ` ${l.trim()}`;
    }
  }
  let what = '';
  if ('found' in diag || 'wanted' in diag) what = `found ${clip(flat(diag.found ?? ''), 160)} wanted ${clip(flat(diag.wanted ?? ''), 120)}`;
  else if (diag.diff) what = clip(flat(diag.diff).replace(/^--- expected \+\+\+ actual /, '').replace(/@@ [-+\d, ]+ @@ ?/g, ''), 240);
  else if (diag.message) what = clip(flat(diag.message), 240);
  out.push({ path: here, text: what ? `${here}: ${what}` : here });
}
if (out.length) {
  console.log(`failed assertions (${out.length}):`);
  for (const o of out.slice(0, max)) console.log(`  ${clip(o.text, 400)}`);
  if (out.length > max) console.log(`  … and ${out.length - max} more`);
}
