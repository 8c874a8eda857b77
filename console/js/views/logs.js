// Logs tab: the end of the serial console (GET /v1/sandboxes/{id}/logs), as text only.

import { h, select } from '../dom.js';
import { api, sbx } from '../api.js';
import { errorLine, showError, poll } from '../ui.js';

const FOLLOW_MS = 2000;

export function mount(el, ctx) {
  const tail = select({ test: 'logs-tail', onchange: () => load() },
    [['65536', 'last 64 KiB'], ['262144', 'last 256 KiB'], ['1048576', 'last 1 MiB']], '65536');
  const follow = h('input', { type: 'checkbox', test: 'logs-follow', onchange: toggleFollow });
  const pre = h('pre', { class: 'log', test: 'logs-pre', tabindex: 0 });
  const error = errorLine('logs-error');
  let follower = null;
  let seq = 0;

  el.append(h('div', { class: 'toolbar' },
    h('button', { type: 'button', test: 'logs-refresh', onclick: () => load() }, 'Refresh'),
    h('label', { class: 'check' }, follow, ' Follow'), tail),
  error, pre);

  async function load() {
    const mine = ++seq;
    try {
      const text = await api('GET', sbx(ctx.id, '/logs'), { query: { tail_bytes: tail.value },
        headers: { Accept: 'text/plain' } });
      if (mine !== seq) return;
      showError(error, null);
      // Stay at the bottom when the reader was there; keep their place otherwise.
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
      if (pre.textContent !== text) pre.textContent = String(text);
      if (atEnd || follower) pre.scrollTop = pre.scrollHeight;
    } catch (err) {
      if (mine === seq) showError(error, err);
    }
  }

  function toggleFollow() {
    follower?.stop();
    follower = follow.checked ? poll(load, FOLLOW_MS) : null;
  }

  load();
  return { destroy() { seq++; follower?.stop(); } };
}
