// Snapshots tab: a timeline, newest first; take one, roll back to one, fork.

import { h, fill, select } from '../dom.js';
import { api, sbx } from '../api.js';
import { busy, confirmDialog, errorLine, showError, toast, emptyNote } from '../ui.js';
import { bytes, time, ago } from '../format.js';
import { sandboxHref } from './actions.js';

const REASON = {
  request: 'taken on request', suspend: 'suspend', fork: 'fork',
  pre_rollback: 'before a rollback', rolling: 'rolling',
};

export function mount(el, ctx) {
  const { id } = ctx;
  let seq = 0;
  const kind = select({ test: 'snapshot-kind', title: 'What the snapshot holds' },
    [['disk', 'Disk'], ['full', 'Disk and memory']], 'disk');
  const take = h('button', { type: 'button', class: 'primary', test: 'snapshot-take',
    onclick: () => busy(take, async () => {
      const snap = await api('POST', sbx(id, '/snapshots'), { json: { kind: kind.value } });
      toast(`Snapshot ${snap.id} taken`);
      await load();
    }) }, 'Take snapshot');
  const error = errorLine('snapshots-error');
  const list = h('ol', { class: 'timeline', test: 'snapshot-list' });

  el.append(
    h('div', { class: 'toolbar' }, kind, take, h('span', { class: 'grow' }),
      h('button', { type: 'button', onclick: () => load() }, 'Refresh')),
    h('p', { class: 'muted small' }, 'Roll back returns the sandbox to a snapshot. Fork makes ' +
      'a new sandbox from this one as it is now (the API forks the current state, not an ' +
      'older snapshot).'),
    error, list);

  function entry(snap) {
    const facts = [
      `${snap.kind === 'full' ? 'disk and memory' : 'disk'} · ${REASON[snap.reason] || snap.reason}`,
      snap.size_bytes ? bytes(snap.size_bytes) : null,
      snap.paused_for_us ? `paused ${(snap.paused_for_us / 1000).toFixed(1)} ms` : null,
      snap.local ? 'on the node' : null,
      snap.remote ? `in the object store (${bytes(snap.remote.stored_bytes)})` : null,
    ].filter(Boolean).join(' · ');
    const rollback = h('button', { type: 'button', class: 'small', test: 'snapshot-rollback',
      onclick: () => rollbackTo(snap, rollback) }, 'Roll back');
    const fork = h('button', { type: 'button', class: 'small', test: 'snapshot-fork',
      title: 'Fork the sandbox as it is now', onclick: () => forkNow(fork) }, 'Fork');
    return h('li', { test: 'snapshot-row', 'data-id': snap.id, 'data-reason': snap.reason },
      h('div', { class: 'when' }, time(snap.created_unix_ms),
        h('span', { class: 'muted' }, ` (${ago(snap.created_unix_ms)})`)),
      h('div', { class: 'mono' }, snap.id),
      h('div', { class: 'muted small' }, facts),
      h('div', { class: 'actions' }, rollback, fork));
  }

  async function load() {
    const mine = ++seq;
    try {
      const { snapshots } = await api('GET', sbx(id, '/snapshots'));
      if (mine !== seq) return;
      showError(error, null);
      const newest = (snapshots || []).slice().reverse(); // the API lists oldest first
      fill(list, newest.length ? newest.map(entry) : emptyNote('No snapshots yet.'));
      list.setAttribute('data-loaded', String(mine));
    } catch (err) {
      if (mine === seq) showError(error, err);
    }
  }

  async function rollbackTo(snap, button) {
    const yes = await confirmDialog(`Roll ${id} back to snapshot ${snap.id} ` +
      `(${time(snap.created_unix_ms)})? What changed since then is lost unless a snapshot holds it.`,
    { ok: 'Roll back', danger: true, title: 'Roll back' });
    if (!yes) return;
    await busy(button, async () => {
      const sb = await api('POST', sbx(id, '/rollback'), { json: { snapshot: snap.id } });
      ctx.set(sb);
      toast(`Rolled back to ${snap.id}`);
      await load();
    });
  }

  async function forkNow(button) {
    await busy(button, async () => {
      const child = await api('POST', sbx(id, '/fork'));
      toast(`Forked into ${child.id}`);
      ctx.app.navigate(sandboxHref(child.id));
    });
  }

  load();
  const off = ctx.onChange(() => load()); // a suspend or rollback adds snapshots
  return { destroy() { seq++; off(); } };
}
