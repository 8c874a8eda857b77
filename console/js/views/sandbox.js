// #/sandboxes/{id}/{tab}: the header (state, actions) and the tabs. Switching tabs keeps the
// header; each tab is mounted fresh and destroyed when left (closing its socket or poll).

import { h, fill, field } from '../dom.js';
import { api, sbx } from '../api.js';
import { poll, report, badge, toast, dialog, busy } from '../ui.js';
import { mib, time, ago } from '../format.js';
import { actionButtons, lifecycle, legal, sandboxHref } from './actions.js';
import * as terminal from './terminal.js';
import * as files from './files.js';
import * as snapshots from './snapshots.js';
import * as egress from './egress.js';
import * as audit from './audit.js';
import * as logs from './logs.js';
import * as live from './live.js';

const TABS = [
  ['terminal', 'Terminal', terminal.mount],
  ['files', 'Files', files.mount],
  ['snapshots', 'Snapshots', snapshots.mount],
  ['network', 'Network', egress.mount],
  ['audit', 'Audit', audit.mountSandbox],
  ['logs', 'Logs', logs.mount],
  ['live', 'Live', live.mount],
];
const NAME_RE = /^[a-z0-9][a-z0-9-]{0,39}$/;
const clip = (text, n) => (text.length > n ? `${text.slice(0, n)}…` : text);

export function mount(el, params, app) {
  const id = params.id;
  if (!/^[A-Za-z0-9._-]{1,64}$/.test(id || '')) {
    el.append(h('h1', {}, 'Not a sandbox id'), h('a', { href: '#/sandboxes' }, 'Back to the list'));
    return {};
  }
  let sb = null;
  let tab = null; // {name, view}
  const listeners = new Set();

  const state = h('span', { class: 'head-state', test: 'sandbox-state' });
  const facts = h('div', { class: 'facts' });
  const actions = actionButtons(onAction);
  const forkButton = h('button', { type: 'button', class: 'small', test: 'action-fork',
    disabled: true, onclick: (e) => fork(e.currentTarget) }, 'Fork');
  const saveButton = h('button', { type: 'button', class: 'small', test: 'action-save-template',
    disabled: true, onclick: saveAsTemplate }, 'Save as template');
  const tabLinks = TABS.map(([name, label]) =>
    h('a', { href: sandboxHref(id, name), test: `tab-${name}`, role: 'tab', 'data-tab': name }, label));
  const body = h('div', { class: 'tab-body' });

  el.append(
    h('div', { class: 'page-head' },
      h('div', {},
        h('div', { class: 'crumbs' }, h('a', { href: '#/sandboxes' }, 'Sandboxes'), ' / '),
        h('h1', { class: 'mono' }, id, ' ', state)),
      h('div', { class: 'head-actions' }, actions.el, forkButton, saveButton)),
    facts,
    h('nav', { class: 'tabs', role: 'tablist' }, tabLinks),
    body);

  /** What tabs get: the id, the sandbox as last seen, and a way to hear of changes. */
  const ctx = {
    id,
    app,
    get sandbox() { return sb; },
    set: (next) => show(next),
    onChange(fn) { listeners.add(fn); return () => listeners.delete(fn); },
  };

  function show(next) {
    const changed = !sb || sb.state !== next.state;
    sb = next;
    fill(state, badge(sb.state));
    actions.sync(sb.state);
    forkButton.disabled = !legal('suspend', sb.state); // fork: running or paused
    saveButton.disabled = !legal('suspend', sb.state);
    const parent = sb.forked_from;
    fill(facts,
      fact('template', `${sb.template}:${sb.template_version}`),
      fact('size', `${sb.vcpus} vCPU · ${mib(sb.memory_mib)} · disk ${mib(sb.disk_mib)}`),
      fact('created', time(sb.created_unix_ms)),
      fact('state since', ago(sb.state_since_unix_ms)),
      fact('last activity', ago(sb.last_activity_unix_ms)),
      sb.node ? fact('node', sb.node) : null,
      parent ? h('span', { class: 'fact' }, h('span', { class: 'muted' }, 'forked from '),
        h('a', { href: sandboxHref(parent.sandbox), class: 'mono' }, parent.sandbox)) : null,
      Object.keys(sb.metadata || {}).length ? fact('metadata', clip(
        Object.entries(sb.metadata).map(([k, v]) => `${k}=${v}`).join(' '), 300)) : null,
      sb.failure ? h('span', { class: 'fact error-text' }, `failure: ${sb.failure}`) : null);
    if (changed) for (const fn of listeners) fn(sb);
  }

  const fact = (label, value) =>
    h('span', { class: 'fact' }, h('span', { class: 'muted' }, `${label} `), value);

  const header = poll(async () => {
    try {
      show(await api('GET', sbx(id)));
    } catch (err) {
      if (err.status === 404 || err.code === 'invalid_id') {
        fill(facts, h('p', { class: 'error', test: 'sandbox-missing' },
          `Sandbox not found: ${err.message}`));
        header.stop();
      }
    }
  }, 3000);

  async function onAction(action) {
    if (!sb) return;
    actions.sync(sb.state, true);
    try {
      const next = await lifecycle(id, action, sb.state);
      if (next) { show(next); toast(`${id}: ${next.state}`); }
    } catch (err) {
      report(err);
    } finally {
      if (sb) actions.sync(sb.state);
      header.now();
    }
  }

  async function fork(button) {
    await busy(button, async () => {
      const child = await api('POST', sbx(id, '/fork'));
      toast(`Forked into ${child.id}`);
      app.navigate(sandboxHref(child.id));
    });
  }

  async function saveAsTemplate() {
    const name = h('input', { type: 'text', test: 'template-name', placeholder: 'my-template',
      autocomplete: 'off', spellcheck: 'false' });
    const version = h('input', { type: 'text', placeholder: 'next', autocomplete: 'off' });
    const memory = h('input', { type: 'checkbox', checked: true });
    await dialog('Save as template', h('div', { class: 'form-grid' },
      field('Name', name, 'Lowercase letters, digits and -'),
      field('Version', version),
      h('label', { class: 'check' }, memory,
        ' With memory: new sandboxes start with this one\'s processes')), {
      ok: 'Save',
      submit: async () => {
        const n = name.value.trim();
        if (!NAME_RE.test(n)) throw new Error('A name is 1 to 40 of a-z, 0-9 and -, not starting with -');
        const req = { name: n, memory: memory.checked };
        if (version.value.trim()) req.version = version.value.trim();
        const t = await api('POST', sbx(id, '/template'), { json: req });
        toast(`Saved as template ${t.name}:${t.version}`);
        return t;
      },
    });
  }

  function openTab(name) {
    const entry = TABS.find(([n]) => n === name) || TABS[0];
    if (tab && tab.name === entry[0]) return;
    tab?.view.destroy?.();
    for (const a of tabLinks) {
      const on = a.dataset.tab === entry[0];
      a.classList.toggle('active', on);
      a.setAttribute('aria-selected', String(on));
    }
    const pane = h('div', { class: `tab-pane tab-${entry[0]}` });
    fill(body, pane);
    let view = {};
    try { view = entry[2](pane, ctx) || {}; } catch (err) { report(err); }
    tab = { name: entry[0], view };
  }

  openTab(params.tab);
  return {
    update(next) {
      if (next.id !== id) return false;
      openTab(next.tab);
      return true;
    },
    destroy() {
      header.stop();
      tab?.view.destroy?.();
      listeners.clear();
    },
  };
}
