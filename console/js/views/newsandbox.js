// The "New sandbox" dialog: POST /v1/sandboxes, then the new sandbox's page.

import { h, field } from '../dom.js';
import { api } from '../api.js';
import { dialog } from '../ui.js';
import { mib } from '../format.js';
import { sandboxHref } from './actions.js';

/** "K=V" lines → an object; throws naming the first bad line. */
export function parsePairs(text, what = 'metadata') {
  const out = {};
  text.split('\n').forEach((line, i) => {
    const l = line.trim();
    if (!l) return;
    const eq = l.indexOf('=');
    if (eq < 1) throw new Error(`${what}, line ${i + 1}: write KEY=VALUE`);
    out[l.slice(0, eq).trim()] = l.slice(eq + 1).trim();
  });
  return out;
}

/** The newest version of each template name, by name. */
export function newestByName(templates) {
  const best = new Map();
  for (const t of templates) {
    const b = best.get(t.name);
    if (!b || t.created_unix_ms > b.created_unix_ms) best.set(t.name, t);
  }
  return [...best.values()].sort((a, b) => a.name.localeCompare(b.name));
}

function optionalInt(input, label) {
  const v = input.value.trim();
  if (!v) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${label} must be a whole number`);
  return n;
}

export function newSandboxDialog(app) {
  const template = h('select', { test: 'create-template', required: true, disabled: true },
    h('option', { value: '' }, 'Loading templates…'));
  const version = h('input', { type: 'text', placeholder: 'newest', test: 'create-version',
    autocomplete: 'off' });
  const vcpus = h('input', { type: 'number', min: 1, max: 64, placeholder: 'template default',
    test: 'create-vcpus' });
  const memory = h('input', { type: 'number', min: 64, step: 64, placeholder: 'template default',
    test: 'create-memory' });
  const metadata = h('textarea', { rows: 3, placeholder: 'owner=me\nproject=demo',
    test: 'create-metadata', spellcheck: 'false' });

  api('GET', '/v1/templates').then(({ templates }) => {
    template.replaceChildren();
    const list = newestByName(templates || []);
    for (const t of list) {
      template.appendChild(h('option', { value: t.name },
        `${t.name} (${t.version}; ${t.vcpus} vCPU, ${mib(t.memory_mib)})`));
    }
    if (list.some((t) => t.name === 'minimal')) template.value = 'minimal';
    if (list.length === 0) template.appendChild(h('option', { value: '' }, 'No templates'));
    template.disabled = false;
  }).catch((err) => {
    template.replaceChildren(h('option', { value: '' }, `Cannot list templates: ${err.message}`));
  });

  const body = h('div', { class: 'form-grid' },
    field('Template', template),
    field('Version', version),
    field('vCPUs', vcpus),
    field('Memory, MiB', memory),
    field('Metadata', metadata, 'One KEY=VALUE a line'));

  return dialog('New sandbox', body, {
    ok: 'Create',
    okTest: 'create-submit',
    submit: async () => {
      if (!template.value) throw new Error('Choose a template');
      const req = { template: template.value };
      if (version.value.trim()) req.version = version.value.trim();
      const v = optionalInt(vcpus, 'vCPUs');
      if (v) req.vcpus = v;
      const m = optionalInt(memory, 'Memory');
      if (m) req.memory_mib = m;
      const md = parsePairs(metadata.value);
      if (Object.keys(md).length) req.metadata = md;
      const sb = await api('POST', '/v1/sandboxes', { json: req });
      app.navigate(sandboxHref(sb.id));
      return sb;
    },
  });
}
