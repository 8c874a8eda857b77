// Terminal tab: xterm.js over the PTY WebSocket (GET /v1/sandboxes/{id}/pty).
// Protocol: our first message is text {"rows","cols"}; then binary frames both ways are
// terminal bytes; we send {"type":"resize",...} as text; the server sends {"type":"exit",...}.

import { h } from '../dom.js';
import { openSocket, sbx } from '../api.js';
import { known } from './actions.js';
import { mirrorStyles } from './styles.js';

const VENDOR = '/console/vendor/xterm/';
const FONT = 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace';

function loadCss() {
  if (document.querySelector('link[data-xterm-css]')) return;
  document.head.appendChild(h('link', { rel: 'stylesheet', href: `${VENDOR}xterm.css`,
    'data-xterm-css': '' }));
}

export function mount(el, ctx) {
  const status = h('span', { class: 'muted', test: 'terminal-status' }, 'Loading the terminal…');
  const connectButton = h('button', { type: 'button', hidden: true, test: 'terminal-reconnect',
    onclick: () => connect() }, 'Reconnect');
  const screen = h('div', { class: 'terminal', test: 'terminal' });
  el.append(h('div', { class: 'toolbar' }, status, connectButton), screen);

  const encoder = new TextEncoder();
  let term = null;
  let fit = null;
  let ws = null;
  let resizer = null;
  let unmirror = () => {};
  let tried = false; // a session was opened (or asked for) once
  let offChange = () => {};
  let disposed = false;

  const setStatus = (text) => { status.textContent = text; };
  const send = (bytes) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(bytes); };
  const sendJson = (obj) => send(JSON.stringify(obj));

  function refit() {
    if (disposed || !fit || !screen.clientWidth) return;
    try { fit.fit(); } catch { /* not laid out yet */ }
  }

  function offer(text, label) {
    setStatus(text);
    connectButton.textContent = label;
    connectButton.hidden = ['terminated', 'failed'].includes(ctx.sandbox?.state);
  }

  function connect() {
    tried = true;
    connectButton.hidden = true;
    if (ws) { const old = ws; ws = null; old.close(); }
    setStatus('Connecting…');
    let socket;
    try {
      socket = openSocket(sbx(ctx.id, '/pty'));
    } catch (err) {
      offer(`Cannot connect: ${err.message}`, 'Reconnect');
      return;
    }
    ws = socket;
    let exit = null;
    let error = null;
    socket.addEventListener('open', () => {
      if (ws !== socket) return;
      sendJson({ rows: term.rows, cols: term.cols });
      setStatus('Connected');
      term.focus();
    });
    socket.addEventListener('message', (e) => {
      if (ws !== socket) return;
      if (typeof e.data !== 'string') { term.write(new Uint8Array(e.data)); return; }
      let msg;
      try { msg = JSON.parse(e.data); } catch { return; }
      if (msg.type === 'exit') exit = msg;
      else if (msg.type === 'error') error = msg;
    });
    socket.addEventListener('close', (e) => {
      if (ws !== socket) return;
      ws = null;
      let why;
      if (exit) {
        why = `session ended (exit ${exit.exit_code ?? '-'}${exit.signal ? `, signal ${exit.signal}` : ''})`;
      } else if (error) {
        why = `session ended: ${error.message || error.code}`;
      } else if (e.code === 1000) {
        why = 'session ended';
      } else {
        why = `session ended: the connection closed (${e.code}${e.reason ? ` ${e.reason}` : ''})`;
      }
      term.write('\r\n\x1b[2m[' + why + ']\x1b[0m\r\n');
      offer(why, 'Reconnect');
    });
  }

  async function start() {
    loadCss();
    const [{ Terminal }, { FitAddon }] = await Promise.all([
      import(`${VENDOR}xterm.mjs`), import(`${VENDOR}addon-fit.mjs`)]);
    if (disposed) return;
    term = new Terminal({ cursorBlink: true, fontSize: 13, fontFamily: FONT, scrollback: 5000 });
    fit = new FitAddon();
    term.loadAddon(fit);
    term.open(screen);
    unmirror = mirrorStyles(screen);
    refit();
    if (window.spaceConsole) window.spaceConsole.terminal = term;
    term.onData((data) => send(encoder.encode(data)));
    // onBinary carries bytes as a string of code points 0-255 (some mouse reports).
    term.onBinary((data) => send(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff)));
    term.onResize(({ rows, cols }) => sendJson({ type: 'resize', rows, cols }));
    resizer = new ResizeObserver(() => requestAnimationFrame(refit));
    resizer.observe(screen);

    const sb = await known(ctx);
    if (disposed) return;
    // Opening a terminal wakes a paused or suspended sandbox, so that waits for a click.
    if (sb.state === 'running' || sb.state === 'creating') connect();
    else if (sb.state === 'paused' || sb.state === 'suspended') {
      offer(`The sandbox is ${sb.state}; connecting wakes it.`, 'Connect');
    } else setStatus(`The sandbox is ${sb.state}: it has no terminal.`);
    // Resumed from the header meanwhile: connect then.
    offChange = ctx.onChange((next) => {
      if (!tried && next.state === 'running') connect();
      if (next.state === 'terminated' || next.state === 'failed') {
        connectButton.hidden = true;
        setStatus(`The sandbox is ${next.state}: it has no terminal.`);
      }
    });
  }

  start().catch((err) => {
    // A binary built without the vendored libraries serves no xterm.js.
    setStatus(`The terminal library did not load (${err.message}); this build may lack ` +
      'the vendored libraries.');
  });

  return {
    destroy() {
      disposed = true;
      offChange();
      if (ws) { const old = ws; ws = null; old.close(); }
      resizer?.disconnect();
      unmirror();
      if (window.spaceConsole && window.spaceConsole.terminal === term) {
        delete window.spaceConsole.terminal;
      }
      term?.dispose();
    },
  };
}
