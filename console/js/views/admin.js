// Admin: #/admin/tenants (list, create) and #/admin/tenants/{name} (quotas, keys).
// A new key's secret is shown once, in a box the user dismisses; it is never stored.

import { h, fill, field } from '../dom.js';
import { api } from '../api.js';
import { errorLine, showError, confirmDialog, toast, busy, copyButton, emptyNote } from '../ui.js';
import { time, mib, span } from '../format.js';

const NAME_RE = /^[a-z0-9][a-z0-9-]{0,39}$/;
const tenantPath = (name, rest = '') => `/v1/tenants/${encodeURIComponent(name)}${rest}`;
const QUOTAS = [
  ['max_sandboxes', 'Sandboxes', (v) => String(v)],
  ['max_vcpus', 'vCPUs', (v) => String(v)],
  ['max_memory_mib', 'Memory, MiB', (v) => mib(v)],
  ['max_volume_mib', 'Volumes, MiB', (v) => mib(v)],
  ['max_suspended_ms', 'Suspended for, ms', (v) => (v === null || v === undefined ? 'forever' : span(v))],
];

/** The box that shows a just-made key, once. */
function keyBox(created) {
  const box = h('div', { class: 'key-once', role: 'alert' },
    h('strong', {}, 'Copy this key now: it is shown only this once.'),
    h('p', { class: 'small' }, `Key ${created.id} of tenant ${created.tenant}` +
      `${created.admin ? ' (admin)' : ''}. The server keeps only its hash; a lost key ` +
      'cannot be shown again, only revoked and replaced.'),
    h('div', { class: 'key-line' }, h('code', { test: 'key-shown-once' }, created.key),
      copyButton(created.key)),
    h('button', { type: 'button', class: 'small', onclick: () => box.remove() }, 'I have copied it'));
  return box;
}

/** Quota inputs; read() gives only the fields filled in (the rest keep or take defaults). */
function quotaInputs(current = {}) {
  const inputs = QUOTAS.map(([key, label]) => [key, label, h('input', { type: 'number', min: 0,
    test: `quota-${key}`, placeholder: current[key] === undefined ? 'default'
      : String(current[key] ?? 'forever') })]);
  return {
    el: h('div', { class: 'form-grid' }, inputs.map(([, label, input]) => field(label, input))),
    read() {
      const out = {};
      for (const [key, label, input] of inputs) {
        const v = input.value.trim();
        if (!v) continue;
        const n = Number(v);
        if (!Number.isInteger(n) || n < 0) throw new Error(`${label}: a whole number`);
        out[key] = n;
      }
      return out;
    },
  };
}

export function mountTenants(el) {
  const tbody = h('tbody');
  const error = errorLine('tenants-error');
  const created = h('div');
  const name = h('input', { type: 'text', test: 'tenant-name', placeholder: 'acme',
    autocomplete: 'off', spellcheck: 'false' });
  const quotas = quotaInputs();
  const formError = errorLine('tenant-create-error');
  const submit = h('button', { type: 'submit', class: 'primary', test: 'tenant-create' }, 'Create tenant');

  async function load() {
    try {
      const { tenants } = await api('GET', '/v1/tenants');
      showError(error, null);
      fill(tbody, tenants.length ? tenants.map((t) => h('tr', { test: 'tenant-row', 'data-name': t.name },
        h('td', { class: 'mono' }, h('a', { href: `#/admin/tenants/${encodeURIComponent(t.name)}` }, t.name)),
        QUOTAS.map(([key, , show]) => h('td', { class: 'num' }, show(t.quotas?.[key]))),
        h('td', { class: 'num nowrap' }, time(t.created_unix_ms))))
        : h('tr', {}, h('td', { colspan: 7 }, emptyNote('No tenants.'))));
    } catch (err) {
      showError(error, err);
    }
  }

  async function create(e) {
    e.preventDefault();
    showError(formError, null);
    submit.disabled = true;
    try {
      const n = name.value.trim();
      if (!NAME_RE.test(n)) throw new Error('A name is 1 to 40 of a-z, 0-9 and -, not starting with -');
      const q = quotas.read();
      const body = Object.keys(q).length ? { name: n, quotas: q } : { name: n };
      const res = await api('POST', '/v1/tenants', { json: body });
      fill(created, keyBox(res.key));
      name.value = '';
      toast(`Tenant ${res.tenant.name} created`);
      await load();
    } catch (err) {
      showError(formError, err);
    } finally {
      submit.disabled = false;
    }
  }

  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Tenants')),
    created, error,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Name', ...QUOTAS.map(([, label]) => label.replace(/, \w+$/, '')),
        'Created'].map((x) => h('th', {}, x)))), tbody)),
    h('form', { class: 'card', onsubmit: create }, h('h2', {}, 'New tenant'),
      field('Name', name), h('p', { class: 'muted small' }, 'Quotas left empty take the defaults.'),
      quotas.el, formError, h('div', { class: 'buttons' }, submit)));
  load();
  return {};
}

export function mountTenant(el, params) {
  const { name } = params;
  const error = errorLine('tenant-error');
  const quotaView = h('div', { class: 'facts' });
  const quotaForm = h('div');
  const keys = h('tbody');
  const created = h('div');
  const label = h('input', { type: 'text', test: 'key-label', placeholder: 'what the key is for',
    maxlength: 200, autocomplete: 'off' });
  const adminBox = h('input', { type: 'checkbox', test: 'key-admin' });
  const keyError = errorLine('key-create-error');

  async function loadTenant() {
    const { tenants } = await api('GET', '/v1/tenants');
    const t = tenants.find((x) => x.name === name);
    if (!t) throw new Error(`No tenant ${name}`);
    fill(quotaView, QUOTAS.map(([key, text, show]) => h('span', { class: 'fact' },
      h('span', { class: 'muted' }, `${text.replace(/, \w+$/, '')} `), show(t.quotas?.[key]))));
    const inputs = quotaInputs(t.quotas);
    const save = h('button', { type: 'submit', class: 'small' }, 'Save quotas');
    fill(quotaForm, h('form', { class: 'quota-edit', onsubmit: (e) => {
      e.preventDefault();
      busy(save, async () => {
        await api('PATCH', tenantPath(name), { json: { quotas: inputs.read() } });
        toast('Quotas saved');
        await loadTenant();
      });
    } }, h('details', {}, h('summary', {}, 'Change quotas'), inputs.el,
      h('div', { class: 'buttons' }, save))));
  }

  const keyRow = (k) => h('tr', { test: 'key-row', 'data-id': k.id },
    h('td', { class: 'mono' }, k.id),
    h('td', {}, k.admin ? 'admin' : 'tenant'),
    h('td', {}, k.label || ''),
    h('td', { class: 'num nowrap' }, time(k.created_unix_ms)),
    h('td', {}, k.revoked_unix_ms
      ? h('span', { class: 'bad' }, `revoked ${time(k.revoked_unix_ms)}`) : 'active'),
    h('td', { class: 'col-actions' }, k.revoked_unix_ms ? null : h('button', { type: 'button',
      class: 'small danger', test: 'key-revoke', onclick: (e) => revoke(k, e.currentTarget) }, 'Revoke')));

  async function loadKeys() {
    const res = await api('GET', tenantPath(name, '/keys'));
    fill(keys, res.keys.length ? res.keys.map(keyRow)
      : h('tr', {}, h('td', { colspan: 6 }, emptyNote('No keys.'))));
  }

  async function revoke(k, button) {
    const yes = await confirmDialog(`Revoke key ${k.id}${k.label ? ` (${k.label})` : ''}? ` +
      'Every call made with it is refused from now on.', { ok: 'Revoke', danger: true, title: 'Revoke key' });
    if (!yes) return;
    await busy(button, async () => {
      await api('DELETE', `/v1/keys/${encodeURIComponent(k.id)}`);
      toast(`Key ${k.id} revoked`);
      await loadKeys();
    });
  }

  const submit = h('button', { type: 'submit', class: 'primary', test: 'key-create' }, 'Create key');
  async function createKey(e) {
    e.preventDefault();
    showError(keyError, null);
    submit.disabled = true;
    try {
      const body = { admin: adminBox.checked };
      if (label.value.trim()) body.label = label.value.trim();
      const k = await api('POST', tenantPath(name, '/keys'), { json: body });
      fill(created, keyBox(k));
      label.value = '';
      adminBox.checked = false;
      await loadKeys();
    } catch (err) {
      showError(keyError, err);
    } finally {
      submit.disabled = false;
    }
  }

  el.append(
    h('div', { class: 'page-head' }, h('div', {},
      h('div', { class: 'crumbs' }, h('a', { href: '#/admin/tenants' }, 'Tenants'), ' / '),
      h('h1', { class: 'mono' }, name))),
    error, quotaView, quotaForm,
    h('h2', {}, 'Keys'), created,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Key', 'Kind', 'Label', 'Created', 'State', '']
        .map((x) => h('th', {}, x)))), keys)),
    h('form', { class: 'card', onsubmit: createKey }, h('h2', {}, 'New key'),
      field('Label', label),
      h('label', { class: 'check' }, adminBox, ' Admin key (manages tenants and keys)'),
      keyError, h('div', { class: 'buttons' }, submit)));

  Promise.all([loadTenant(), loadKeys()]).catch((err) => showError(error, err));
  return {};
}
