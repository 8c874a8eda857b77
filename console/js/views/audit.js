// The audit log (GET /v1/audit), newest first: a sandbox's tab and the admin page with filters.
// The API pages by `limit` alone (at most 1000), so "More" asks for a longer list.

import { h, fill, field } from '../dom.js';
import { api } from '../api.js';
import { errorLine, showError, emptyNote } from '../ui.js';
import { time } from '../format.js';
import { sandboxHref } from './actions.js';

const PAGE = 100;
const MAX = 1000;
const OPERATIONS = ['sandbox.create', 'sandbox.fork', 'sandbox.pause', 'sandbox.resume',
  'sandbox.suspend', 'sandbox.restore', 'sandbox.kill', 'sandbox.wake', 'sandbox.expire',
  'snapshot.create', 'snapshot.rollback', 'egress.update', 'egress.allow', 'egress.deny',
  'credential.use', 'credential.fill', 'credential.exfiltration', 'port.expose',
  'port.unexpose', 'secret.set', 'secret.delete', 'template.build', 'template.delete',
  'tenant.create', 'key.create', 'key.revoke', 'auth', 'node.join', 'node.lost', 'sandbox.move'];

/**
 * A self-loading audit table. query() gives the filters; columns: which optional columns to
 * show (tenant, sandbox, key). Returns {el, reload()}.
 */
function auditList(query, columns) {
  let limit = PAGE;
  let seq = 0;
  const tbody = h('tbody');
  const error = errorLine('audit-error');
  const more = h('button', { type: 'button', hidden: true, test: 'audit-more',
    onclick: () => { limit = Math.min(MAX, limit + PAGE); load(); } }, 'More');
  const note = h('span', { class: 'muted small' });
  const heads = ['Time', columns.tenant && 'Tenant', columns.sandbox && 'Sandbox',
    'Operation', 'Result', columns.key && 'Key', 'Detail'].filter(Boolean);
  const el = h('div', {}, error,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list audit' },
      h('thead', {}, h('tr', {}, heads.map((t) => h('th', {}, t)))), tbody)),
    h('div', { class: 'toolbar' }, more, note));

  const row = (ev) => h('tr', { test: 'audit-row', 'data-id': ev.id },
    h('td', { class: 'num nowrap' }, time(ev.at_unix_ms)),
    columns.tenant ? h('td', {}, ev.tenant || '') : null,
    columns.sandbox ? h('td', { class: 'mono' }, ev.sandbox
      ? h('a', { href: sandboxHref(ev.sandbox) }, ev.sandbox) : '') : null,
    h('td', { class: 'mono' }, ev.operation),
    h('td', {}, h('span', { class: ev.result === 'ok' ? 'ok' : 'bad' }, ev.result)),
    columns.key ? h('td', { class: 'mono' }, ev.key_id || '') : null,
    h('td', { class: 'detail' }, ev.detail ?? ''));

  async function load() {
    const mine = ++seq;
    showError(error, null);
    try {
      const { events } = await api('GET', '/v1/audit', { query: { ...query(), limit } });
      if (mine !== seq) return;
      const list = events || [];
      fill(tbody, list.length ? list.map(row)
        : h('tr', {}, h('td', { colspan: heads.length }, emptyNote('No events.'))));
      more.hidden = list.length < limit || limit >= MAX;
      note.textContent = list.length ? `${list.length} events, newest first` : '';
    } catch (err) {
      if (mine === seq) showError(error, err);
    }
  }

  return { el, reload() { limit = PAGE; return load(); }, refresh: load };
}

/** Sandbox tab: GET /v1/audit?sandbox={id}. */
export function mountSandbox(el, ctx) {
  const list = auditList(() => ({ sandbox: ctx.id }), { key: true });
  el.append(h('div', { class: 'toolbar' }, h('span', { class: 'grow' }),
    h('button', { type: 'button', onclick: () => list.refresh() }, 'Refresh')), list.el);
  list.reload();
  return {};
}

/** #/admin/audit: every tenant's events, with the filters the API has. */
export function mountAdmin(el) {
  const input = (test, placeholder, extra = {}) => h('input', { type: 'text', test, placeholder,
    autocomplete: 'off', spellcheck: 'false', ...extra });
  const tenant = input('audit-tenant', 'any tenant');
  const sandbox = input('audit-sandbox', 'sbx-…');
  const operation = input('audit-operation', 'any operation', { list: 'audit-ops' });
  const since = h('input', { type: 'datetime-local', test: 'audit-since' });
  const ops = h('datalist', { id: 'audit-ops' }, OPERATIONS.map((o) => h('option', { value: o })));
  const list = auditList(() => {
    const t = since.value ? new Date(since.value).getTime() : undefined;
    return { tenant: tenant.value.trim(), sandbox: sandbox.value.trim(),
      operation: operation.value.trim(), since_unix_ms: Number.isFinite(t) ? t : undefined };
  }, { tenant: true, sandbox: true, key: true });

  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Audit log')),
    h('form', { class: 'filters', onsubmit: (e) => { e.preventDefault(); list.reload(); } },
      field('Tenant', tenant), field('Sandbox', sandbox), field('Operation', operation),
      field('Since', since), ops,
      h('div', { class: 'buttons' }, h('button', { type: 'submit', class: 'primary' }, 'Apply'))),
    list.el);
  list.reload();
  return {};
}
