// #/sandboxes: the live list. Rows are kept by id and updated in place on each poll, so a
// list of hundreds neither flickers nor loses the filter or the focus.

import { h, select, setText, fill } from '../dom.js';
import { api, sbx, session } from '../api.js';
import { poll, report, badge, toast } from '../ui.js';
import { ago, span, mib } from '../format.js';
import { actionButtons, lifecycle, sandboxHref } from './actions.js';
import { newSandboxDialog } from './newsandbox.js';
import { sparkline } from './spark.js';

const LIST_MS = 3000;
const METRICS_MS = 15000;
const METRICS_ROWS = 50; // sparklines only for the first visible rows
const METRICS_PARALLEL = 4;
const METRICS_WINDOW_MS = 5 * 60 * 1000;
const STATES = ['running', 'paused', 'suspended', 'creating', 'failed', 'terminated'];

/** Runs fn over items, at most `n` at a time. */
async function eachLimit(items, n, fn) {
  let next = 0;
  const worker = async () => { while (next < items.length) await fn(items[next++]); };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
}

export function mount(el, _params, app) {
  const rows = new Map(); // id → {tr, cells, actions, sb, search, busy}
  let metrics = null;
  let loaded = false;

  const filterText = h('input', { type: 'search', test: 'filter-text', class: 'filter',
    placeholder: 'Filter: id, template, key=value', oninput: applyFilter, spellcheck: 'false' });
  const filterState = select({ test: 'filter-state', onchange: () => { applyFilter(); lister.now(); } },
    [['', 'All but terminated'], ...STATES], '');
  const count = h('span', { class: 'muted' });
  const tbody = h('tbody', { onclick: onClick });
  const table = h('table', { class: 'list sandboxes' },
    h('thead', {}, h('tr', {},
      ['Id', 'State', 'Template', 'Size', 'Age', 'Node', 'Last activity', 'CPU', '']
        .map((t) => h('th', { class: t === 'Node' ? 'col-node' : undefined }, t)))),
    tbody);
  const empty = h('p', { class: 'empty', hidden: true });

  el.append(
    h('div', { class: 'page-head' },
      h('h1', {}, 'Sandboxes'),
      h('button', { type: 'button', class: 'primary', test: 'new-sandbox',
        onclick: () => newSandboxDialog(app) }, 'New sandbox')),
    h('div', { class: 'toolbar' }, filterText, filterState, count),
    h('div', { class: 'table-wrap' }, table), empty);

  function makeRow(id) {
    const cells = {};
    const td = (name, cls) => (cells[name] = h('td', { class: cls }));
    const actions = actionButtons();
    const tr = h('tr', { test: 'sandbox-row', 'data-id': id },
      h('td', {}, h('a', { href: sandboxHref(id), class: 'mono' }, id)),
      td('state'), td('template'), td('size', 'num'), td('age', 'num'), td('node', 'col-node'),
      td('activity', 'num'), td('cpu', 'spark-cell'), h('td', { class: 'col-actions' }, actions.el));
    return { tr, cells, actions, sb: null, search: '', busy: false };
  }

  function updateRow(row, sb) {
    const { cells, tr } = row;
    row.sb = sb;
    if (tr.dataset.state !== sb.state) {
      tr.dataset.state = sb.state;
      fill(cells.state, badge(sb.state));
      if (sb.state !== 'running') cells.cpu.replaceChildren();
    }
    cells.state.title = sb.failure || '';
    setText(cells.template, `${sb.template}:${sb.template_version}`);
    setText(cells.size, `${sb.vcpus} vCPU · ${mib(sb.memory_mib)}`);
    setText(cells.age, span(Date.now() - sb.created_unix_ms));
    setText(cells.node, sb.node || '');
    setText(cells.activity, ago(sb.last_activity_unix_ms));
    row.actions.sync(sb.state, row.busy);
    const meta = Object.entries(sb.metadata || {}).map(([k, v]) => `${k}=${v}`);
    row.search = [sb.id, `${sb.template}:${sb.template_version}`, ...meta].join('\n').toLowerCase();
  }

  function applyFilter() {
    const terms = filterText.value.toLowerCase().split(/\s+/).filter(Boolean);
    const st = filterState.value;
    let shown = 0;
    for (const row of rows.values()) {
      const visible = (!st || row.sb.state === st) && terms.every((t) => row.search.includes(t));
      if (row.tr.hidden === visible) row.tr.hidden = !visible;
      if (visible) shown++;
    }
    setText(count, rows.size ? `${shown} of ${rows.size}` : '');
    empty.hidden = !loaded || shown > 0;
    setText(empty, rows.size ? 'No sandbox matches the filter.' :
      'No sandboxes here. "New sandbox" makes one.');
  }

  // Terminated sandboxes are listed only when asked for by state.
  const stateQuery = () => (filterState.value === 'terminated' ? 'terminated' : undefined);

  async function refresh() {
    const state = stateQuery();
    let answer;
    try {
      answer = await api('GET', '/v1/sandboxes', { query: { state } });
    } catch (err) {
      setText(count, `cannot list: ${err.message}`);
      return;
    }
    if (state !== stateQuery()) return; // the filter changed meanwhile; the next poll has it
    const list = answer.sandboxes || [];
    const seen = new Set(list.map((sb) => sb.id));
    for (const [id, row] of rows) if (!seen.has(id)) { row.tr.remove(); rows.delete(id); }
    // Put rows in the API's order (newest first), moving only those out of place.
    let i = 0;
    for (const sb of list) {
      let row = rows.get(sb.id);
      if (!row) rows.set(sb.id, (row = makeRow(sb.id)));
      updateRow(row, sb);
      const at = tbody.children[i];
      if (at !== row.tr) tbody.insertBefore(row.tr, at || null);
      i++;
    }
    table.classList.toggle('show-node', session.admin && list.some((sb) => sb.node));
    loaded = true;
    applyFilter();
    if (!metrics) metrics = poll(refreshMetrics, METRICS_MS);
  }

  async function refreshMetrics() {
    const wanted = [];
    let visible = 0;
    for (const tr of tbody.children) {
      if (tr.hidden) continue;
      if (++visible > METRICS_ROWS) break;
      const row = rows.get(tr.dataset.id);
      if (row && row.sb.state === 'running') wanted.push(row);
    }
    const start = Date.now() - METRICS_WINDOW_MS;
    await eachLimit(wanted, METRICS_PARALLEL, async (row) => {
      try {
        const { samples } = await api('GET', sbx(row.sb.id, '/metrics'), { query: { start } });
        if (row.sb.state !== 'running' || !samples || !samples.length) return;
        const cpu = samples.map((x) => x.cpu_used_pct);
        const last = cpu[cpu.length - 1];
        fill(row.cells.cpu, h('span', { class: 'spark-wrap' },
          sparkline(cpu.slice(-40), { title: `CPU over the last ${span(Date.now() - start)}` }),
          h('span', { class: 'muted small' }, `${last.toFixed(0)}%`)));
      } catch { /* a sparkline is optional: leave it as it was */ }
    });
  }

  async function onClick(e) {
    const button = e.target.closest('button[data-action]');
    if (!button) return;
    const row = rows.get(button.closest('tr').dataset.id);
    if (!row || row.busy) return;
    const { id, state } = row.sb;
    const action = button.dataset.action;
    row.busy = true;
    row.actions.sync(state, true);
    try {
      const sb = await lifecycle(id, action, state);
      if (sb && rows.get(id) === row) {
        updateRow(row, sb);
        applyFilter();
        toast(`${id}: ${sb.state}`);
      }
    } catch (err) {
      report(err);
    } finally {
      row.busy = false;
      if (row.sb) row.actions.sync(row.sb.state);
      lister.now();
    }
  }

  const lister = poll(refresh, LIST_MS);
  filterText.focus();
  return {
    destroy() {
      lister.stop();
      metrics?.stop();
    },
  };
}
