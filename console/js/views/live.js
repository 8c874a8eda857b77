// Live tab: the sandbox browser's display through noVNC's RFB client, straight on the
// websockify WebSocket. The guest's own vnc.html is never loaded: only our own pieces make
// the socket's URL, and the live token in its path stands for the key (no subprotocol).

import { h } from '../dom.js';
import { api, sbx, wsUrl } from '../api.js';
import { promptDialog } from '../ui.js';
import { known } from './actions.js';

const RFB_MODULE = '/console/vendor/novnc/core/rfb.js';
const LIVE_PATH = /^\/v1\/sandboxes\/[^/]+\/browser\/live\/([A-Za-z0-9._~%-]+)\//;

/** The websockify path for a live_url the API gave, or null when it has an unknown shape. */
export function livePath(id, liveUrl) {
  let path;
  try { path = new URL(liveUrl, location.origin).pathname; } catch { return null; }
  const m = LIVE_PATH.exec(path);
  if (!m) return null;
  let token;
  try { token = decodeURIComponent(m[1]); } catch { return null; }
  return sbx(id, `/browser/live/${encodeURIComponent(token)}/websockify`);
}

export function mount(el, ctx) {
  const status = h('span', { class: 'muted', test: 'live-status' }, 'Waiting for the sandbox…');
  const start = h('button', { type: 'button', hidden: true, test: 'live-connect',
    onclick: () => connect() }, 'Start');
  const takeover = h('input', { type: 'checkbox', test: 'live-takeover', disabled: true,
    onchange: () => {
      if (!rfb) return;
      rfb.viewOnly = !takeover.checked;
      if (takeover.checked) rfb.focus();
      status.textContent = takeover.checked ? 'Connected: your keyboard and mouse reach the browser'
        : 'Connected, view only';
    } });
  const screen = h('div', { class: 'live-screen', test: 'live-screen' });
  const note = h('p', { class: 'muted small', hidden: true, test: 'live-note' });
  el.append(
    h('div', { class: 'toolbar' }, status, start, h('span', { class: 'grow' }),
      h('label', { class: 'check', title: 'Send your keyboard and mouse to the sandbox' },
        takeover, ' Take over')),
    note, screen);

  let rfb = null;
  let disposed = false;
  let tried = false; // the browser was started (or asked for) once

  const explain = (text) => { note.textContent = text; note.hidden = false; };
  const offer = (text, label) => {
    status.textContent = text;
    start.textContent = label;
    start.hidden = ['terminated', 'failed'].includes(ctx.sandbox?.state);
    takeover.disabled = true;
  };

  function drop() {
    if (!rfb) return;
    const old = rfb;
    rfb = null;
    try { old.disconnect(); } catch { /* already closed */ }
  }

  async function connect() {
    tried = true;
    start.hidden = true;
    note.hidden = true;
    drop();
    status.textContent = 'Starting the browser…';
    let session;
    try {
      // Starts the sandbox's Chromium (headful where the template has a display).
      session = await api('POST', sbx(ctx.id, '/browser'));
    } catch (err) {
      explain(`No live view: ${err.message}`);
      offer('Cannot start the browser', 'Try again');
      return;
    }
    if (disposed) return;
    if (!session.live_url) {
      explain('This sandbox\'s browser runs headless: its template has no display (no X ' +
        'server). A template with a desktop (such as "desktop") has a live view.');
      offer('No display', 'Try again');
      return;
    }
    const path = livePath(ctx.id, session.live_url);
    if (!path) { offer('The API answered a live URL of an unknown shape', 'Try again'); return; }
    let RFB;
    try {
      ({ default: RFB } = await import(RFB_MODULE));
    } catch (err) {
      offer(`The VNC client did not load (${err.message}); this build may lack the ` +
        'vendored libraries.', 'Try again');
      return;
    }
    if (disposed) return;
    status.textContent = 'Connecting…';
    screen.replaceChildren();
    let client;
    try {
      client = new RFB(screen, wsUrl(path));
    } catch (err) {
      offer(`Cannot connect: ${err.message}`, 'Try again');
      return;
    }
    rfb = client;
    client.scaleViewport = true;
    client.viewOnly = !takeover.checked;
    client.addEventListener('connect', () => {
      if (rfb !== client) return;
      takeover.disabled = false;
      status.textContent = client.viewOnly ? 'Connected, view only'
        : 'Connected: your keyboard and mouse reach the browser';
    });
    client.addEventListener('disconnect', (e) => {
      if (rfb !== client) return;
      rfb = null;
      offer(e.detail && e.detail.clean ? 'Disconnected' : 'The connection was lost', 'Reconnect');
    });
    client.addEventListener('securityfailure', (e) => {
      explain(`VNC security failure: ${(e.detail && e.detail.reason) || 'refused'}`);
    });
    client.addEventListener('credentialsrequired', async () => {
      const password = await promptDialog('VNC password', 'Password', { ok: 'Connect' });
      if (password && rfb === client) client.sendCredentials({ password });
      else drop();
    });
  }

  // Resumed from the header meanwhile: start then.
  const offChange = ctx.onChange((sb) => {
    if (disposed) return;
    if (!tried && sb.state === 'running') connect();
    if (sb.state === 'terminated' || sb.state === 'failed') {
      drop();
      start.hidden = true;
      takeover.disabled = true;
      status.textContent = `The sandbox is ${sb.state}: no live view.`;
    }
  });
  known(ctx).then((sb) => {
    if (disposed || tried) return;
    if (sb.state === 'running') connect();
    else if (sb.state === 'paused' || sb.state === 'suspended') {
      offer(`The sandbox is ${sb.state}; starting the browser wakes it.`, 'Start');
    } else status.textContent = `The sandbox is ${sb.state}: no live view.`;
  });

  return { destroy() { disposed = true; offChange(); drop(); } };
}
