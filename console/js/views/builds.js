// #/builds (the list) and #/builds/{id} (one build: its state, and its log as it grows).

import { h, fill, setText } from '../dom.js';
import { api, session } from '../api.js';
import { poll, badge, errorLine, showError, emptyNote } from '../ui.js';
import { time, span } from '../format.js';

const ACTIVE = new Set(['running', 'waiting']);
const buildPath = (id, rest = '') => `/v1/builds/${encodeURIComponent(id)}${rest}`;
const buildHref = (id) => `#/builds/${encodeURIComponent(id)}`;
const took = (b) => (b.finished_unix_ms ? span(b.finished_unix_ms - b.created_unix_ms) : '');

export function mountList(el) {
  const tbody = h('tbody');
  const error = errorLine('builds-error');
  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Builds'),
      h('a', { href: '#/templates', class: 'button' }, 'Build a template')),
    error,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Build', 'Template', 'State', session.admin ? 'Tenant' : null,
        'Started', 'Took', 'Error'].filter(Boolean).map((x) => h('th', {}, x)))), tbody)));

  const row = (b) => h('tr', { test: 'build-row', 'data-id': b.id, 'data-state': b.state },
    h('td', { class: 'mono' }, h('a', { href: buildHref(b.id) }, b.id)),
    h('td', { class: 'mono' }, `${b.name}:${b.version}`),
    h('td', {}, badge(b.state)),
    session.admin ? h('td', {}, b.tenant) : null,
    h('td', { class: 'num nowrap' }, time(b.created_unix_ms)),
    h('td', { class: 'num' }, took(b)),
    h('td', { class: 'detail' }, b.error || ''));

  let last = '';
  const poller = poll(async () => {
    try {
      const { builds } = await api('GET', '/v1/builds');
      showError(error, null);
      const key = JSON.stringify(builds); // repaint only when something changed
      if (key === last) return;
      last = key;
      fill(tbody, builds.length ? builds.map(row)
        : h('tr', {}, h('td', { colspan: 7 }, emptyNote('No builds yet.'))));
    } catch (err) {
      showError(error, err);
    }
  }, 3000);
  return { destroy() { poller.stop(); } };
}

export function mountOne(el, params) {
  const { id } = params;
  const state = h('span', { test: 'build-state', class: 'build-state' }, '…');
  const facts = h('div', { class: 'facts' });
  const error = errorLine('build-error');
  const failure = h('p', { class: 'error', hidden: true, test: 'build-failure' });
  const pre = h('pre', { class: 'log', test: 'build-log', tabindex: 0 });
  const logText = document.createTextNode('');
  pre.appendChild(logText);
  const abort = new AbortController();
  let stopped = false;

  el.append(
    h('div', { class: 'page-head' }, h('div', {},
      h('div', { class: 'crumbs' }, h('a', { href: '#/builds' }, 'Builds'), ' / '),
      h('h1', { class: 'mono' }, id, ' ', state))),
    facts, failure, error, pre);

  const fact = (label, ...value) =>
    h('span', { class: 'fact' }, h('span', { class: 'muted' }, `${label} `), ...value);

  function show(b) {
    state.dataset.state = b.state;
    setText(state, b.state);
    state.className = `build-state badge badge-${String(b.state).replace(/[^a-z_-]/g, '')}`;
    fill(facts,
      fact('template', `${b.name}:${b.version}`),
      fact('source', b.source),
      fact('started', time(b.created_unix_ms)),
      b.finished_unix_ms ? fact('took', took(b)) : null,
      b.state === 'succeeded' ? h('a', { href: '#/templates', class: 'fact' }, 'See the templates') : null);
    failure.textContent = b.error || '';
    failure.hidden = !b.error;
  }

  async function refresh() {
    const b = await api('GET', buildPath(id), { signal: abort.signal });
    show(b);
    return b;
  }

  function append(text) {
    if (!text) return;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
    logText.appendData(text);
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  // Reads the log from byte `offset`: with follow=true the server streams it until the build
  // ends; after a broken stream the next read goes on from where this one stopped.
  async function follow() {
    const decoder = new TextDecoder();
    let offset = 0;
    const read = async (live) => {
      const res = await api('GET', buildPath(id, '/log'), { raw: true, signal: abort.signal,
        query: { from: offset, follow: live ? 'true' : undefined } });
      const reader = res.body.getReader();
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        offset += value.byteLength;
        append(decoder.decode(value, { stream: true }));
      }
    };
    while (!stopped) {
      try {
        const b = await refresh();
        await read(ACTIVE.has(b.state));
        if (!ACTIVE.has(b.state)) break;
        const after = await refresh();
        if (!ACTIVE.has(after.state)) { await read(false); break; } // the last lines
        showError(error, null);
      } catch (err) {
        if (stopped || err.name === 'AbortError') return;
        showError(error, err);
        if (err.status === 404 || err.status === 400) return;
      }
      await new Promise((r) => setTimeout(r, 1000));
    }
    append(decoder.decode());
  }

  follow();
  return {
    destroy() {
      stopped = true;
      abort.abort();
    },
  };
}
