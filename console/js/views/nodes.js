// #/admin/nodes: a cluster's nodes (GET /v1/nodes) and draining one. `space up` is no
// cluster: the API answers 404 not_a_cluster, shown as such.

import { h, fill } from '../dom.js';
import { api } from '../api.js';
import { poll, badge, errorLine, showError, confirmDialog, toast, busy, emptyNote } from '../ui.js';
import { mib, time, ago } from '../format.js';

export function mount(el) {
  const tbody = h('tbody');
  const error = errorLine('nodes-error');
  const note = h('p', { class: 'muted small' });
  const table = h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
    h('thead', {}, h('tr', {}, ['Node', 'Address', 'State', 'Live', 'CPUs', 'Memory free / total',
      'Sandboxes', 'Accelerator', 'Joined', 'Lease', ''].map((x) => h('th', {}, x)))), tbody));
  el.append(h('div', { class: 'page-head' }, h('h1', {}, 'Nodes')), error, note, table);

  const row = (n) => h('tr', { test: 'node-row', 'data-id': n.id, 'data-state': n.state },
    h('td', { class: 'mono' }, n.id),
    h('td', { class: 'mono' }, n.address),
    h('td', {}, badge(n.state)),
    h('td', {}, n.live ? 'yes' : h('span', { class: 'bad' }, 'no')),
    h('td', { class: 'num' }, n.cpus),
    h('td', { class: 'num' }, `${mib(n.memory_free_mib)} / ${mib(n.memory_total_mib)}`),
    h('td', { class: 'num' }, n.sandboxes),
    h('td', {}, n.accelerator, n.qemu ? h('div', { class: 'muted small' }, n.qemu) : null),
    h('td', { class: 'num nowrap' }, time(n.joined_unix_ms)),
    h('td', { class: 'num nowrap' }, n.lease_expires_ms > Date.now()
      ? `${Math.round((n.lease_expires_ms - Date.now()) / 1000)}s left` : ago(n.lease_expires_ms)),
    h('td', { class: 'col-actions' }, n.state === 'active' ? h('button', { type: 'button',
      class: 'small', test: 'node-drain', onclick: (e) => drain(n, e.currentTarget) }, 'Drain') : null));

  async function drain(n, button) {
    const yes = await confirmDialog(`Drain ${n.id}? No new sandbox is placed there, and its ` +
      `${n.sandboxes} sandboxes move to other nodes (suspended, then restored there).`,
    { ok: 'Drain', danger: true, title: 'Drain node' });
    if (!yes) return;
    await busy(button, async () => {
      await api('POST', `/v1/nodes/${encodeURIComponent(n.id)}/drain`);
      toast(`${n.id} is draining`);
      poller.now();
    });
  }

  const poller = poll(async () => {
    try {
      const res = await api('GET', '/v1/nodes');
      showError(error, null);
      note.textContent = `Lease ${res.lease_ms} ms, grace ${res.grace_ms} ms.`;
      fill(tbody, res.nodes.length ? res.nodes.map(row)
        : h('tr', {}, h('td', { colspan: 11 }, emptyNote('No nodes have joined.'))));
    } catch (err) {
      if (err.code === 'not_a_cluster') {
        table.hidden = true;
        note.textContent = 'This deployment is a single machine (space up), not a cluster: ' +
          'it has no nodes to list.';
        poller.stop();
      } else showError(error, err);
    }
  }, 5000);
  return { destroy() { poller.stop(); } };
}
