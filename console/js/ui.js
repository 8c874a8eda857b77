// Shared widgets: toasts, dialogs, polling, copy buttons, state badges.

import { h } from './dom.js';

let toasts = null;

/** A short message in the corner; errors stay longer. Click to dismiss. */
export function toast(message, kind = 'info') {
  if (!toasts || !toasts.isConnected) {
    toasts = h('div', { class: 'toasts', role: 'status', 'aria-live': 'polite' });
    document.body.appendChild(toasts);
  }
  const el = h('div', { class: `toast toast-${kind}`, test: `toast-${kind}`,
    onclick: () => el.remove() }, message);
  toasts.appendChild(el);
  setTimeout(() => el.remove(), kind === 'error' ? 10000 : 4000);
}

/** Shows an error (the API's message) as a toast. */
export function report(err) {
  if (!err || err.name === 'AbortError') return;
  if (err.status === 401) return; // main.js already went to the login view
  console.warn(err);
  toast(err.message || String(err), 'error');
}

/** An inline error line, empty until set. */
export function errorLine(test) {
  return h('p', { class: 'error', hidden: true, role: 'alert', test });
}
export function showError(line, err) {
  line.textContent = err ? (err.message || String(err)) : '';
  line.hidden = !err;
}

/** Runs fn with the button disabled meanwhile; errors go to a toast. */
export async function busy(button, fn) {
  if (button) button.disabled = true;
  try {
    return await fn();
  } catch (err) {
    report(err);
    return undefined;
  } finally {
    if (button) button.disabled = false;
  }
}

/**
 * A modal dialog. `submit` (optional, async) runs on OK: what it returns resolves the
 * dialog, what it throws is shown in the dialog, which stays open. Cancel resolves null.
 */
export function dialog(title, content,
  { ok = 'OK', danger = false, submit, wide = false, okTest = 'confirm-yes' } = {}) {
  return new Promise((resolve) => {
    let result = null;
    const error = errorLine('dialog-error');
    const okButton = h('button', { type: 'submit', class: danger ? 'danger' : 'primary',
      test: okTest }, ok);
    const dlg = h('dialog', { class: wide ? 'modal wide' : 'modal' },
      h('form', { onsubmit: async (e) => {
        e.preventDefault();
        okButton.disabled = true;
        showError(error, null);
        try {
          result = submit ? await submit() : true;
          dlg.close();
        } catch (err) {
          showError(error, err);
        } finally {
          okButton.disabled = false;
        }
      } },
      h('h2', {}, title), content, error,
      h('div', { class: 'buttons' },
        h('button', { type: 'button', test: 'confirm-no', onclick: () => dlg.close() }, 'Cancel'),
        okButton)));
    // Escape while OK runs would hide a request that still goes on: wait for it.
    dlg.addEventListener('cancel', (e) => { if (okButton.disabled) e.preventDefault(); });
    dlg.addEventListener('close', () => { dlg.remove(); resolve(result); });
    document.body.appendChild(dlg);
    dlg.showModal();
    const first = dlg.querySelector('input, select, textarea');
    (first || okButton).focus();
  });
}

/** Yes/no; resolves true or null. */
export function confirmDialog(text, { ok = 'OK', danger = false, title = 'Are you sure?' } = {}) {
  return dialog(title, h('p', {}, text), { ok, danger });
}

/** One text field; resolves the trimmed text or null. check(value) may throw to refuse. */
export function promptDialog(title, label, { value = '', placeholder = '', ok = 'OK', check } = {}) {
  const input = h('input', { type: 'text', value, placeholder, test: 'prompt-input',
    autocomplete: 'off', spellcheck: 'false' });
  return dialog(title, h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input), {
    ok,
    submit: async () => {
      const v = input.value.trim();
      if (!v) throw new Error(`${label} is required`);
      if (check) await check(v);
      return v;
    },
  });
}

/**
 * Calls fn now and then every `ms` after it settles (never two at once), skipping beats
 * while the tab is hidden. Errors are left to fn. Returns {stop(), now()}.
 */
export function poll(fn, ms) {
  let timer = null;
  let stopped = false;
  let running = false;
  let again = false; // now() was asked for during a run: run once more right after it
  const tick = async () => {
    timer = null;
    if (stopped) return;
    if (!document.hidden) {
      running = true;
      try { await fn(); } catch (err) { console.warn(err); }
      running = false;
    }
    if (!stopped) timer = setTimeout(tick, again ? 0 : ms);
    again = false;
  };
  tick();
  return {
    stop() { stopped = true; clearTimeout(timer); },
    now() {
      if (stopped) return;
      if (running) { again = true; return; }
      clearTimeout(timer);
      tick();
    },
  };
}

/** A button that copies `text` to the clipboard. */
export function copyButton(text, label = 'Copy') {
  const btn = h('button', { type: 'button', test: 'copy', onclick: async () => {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // No clipboard API (a plain-http origin): copy from a selected, hidden field.
      const tmp = h('textarea', { readOnly: true, class: 'offscreen' }, text);
      document.body.appendChild(tmp);
      tmp.select();
      document.execCommand('copy');
      tmp.remove();
    }
    btn.textContent = 'Copied';
    setTimeout(() => { btn.textContent = label; }, 1500);
  } }, label);
  return btn;
}

/** A coloured state word: running, paused, failed, ... */
export function badge(state) {
  return h('span', { class: `badge badge-${String(state).replace(/[^a-z_-]/g, '')}` }, state);
}

/** A "nothing here" line. */
export const emptyNote = (text) => h('p', { class: 'empty' }, text);
