// What the sandbox views share: lifecycle buttons (pause, resume, suspend, kill), the route
// of a sandbox's page, and waiting for the page header to know the sandbox.

import { h } from '../dom.js';
import { api, sbx } from '../api.js';
import { confirmDialog } from '../ui.js';

/** The console route of a sandbox's page (and tab). */
export const sandboxHref = (id, tab) =>
  `#/sandboxes/${encodeURIComponent(id)}${tab ? `/${tab}` : ''}`;

/** Resolves the sandbox once the page header has loaded it (tabs mount before that). */
export function known(ctx) {
  if (ctx.sandbox) return Promise.resolve(ctx.sandbox);
  return new Promise((resolve) => {
    const off = ctx.onChange((sb) => { off(); resolve(sb); });
  });
}

export const ACTIONS = ['pause', 'resume', 'suspend', 'kill'];

// The states each action is legal in (the node's rules; anything else is 409 illegal_state).
const LEGAL = {
  pause: ['running'],
  resume: ['paused', 'suspended'],
  suspend: ['running', 'paused'],
  kill: ['running', 'paused', 'suspended', 'failed'],
};
const LABEL = { pause: 'Pause', resume: 'Resume', suspend: 'Suspend', kill: 'Kill' };
const TITLE = {
  pause: 'Freeze the VM in memory',
  resume: 'Run again (a suspended sandbox is restored from its snapshot)',
  suspend: 'Snapshot the VM and stop it, keeping its disk',
  kill: 'Stop the VM for good',
};

export const legal = (action, state) => LEGAL[action].includes(state);

/**
 * Runs an action on a sandbox; kill asks first. Resolves the Sandbox the API answers, or
 * null when the user said no. "Resume" of a suspended sandbox is a restore.
 */
export async function lifecycle(id, action, state) {
  if (action === 'kill') {
    const yes = await confirmDialog(
      `Kill ${id}? Its VM stops for good; the record and its snapshots stay.`,
      { ok: 'Kill', danger: true, title: 'Kill the sandbox' });
    if (!yes) return null;
    return api('DELETE', sbx(id));
  }
  const verb = action === 'resume' && state === 'suspended' ? 'restore' : action;
  return api('POST', sbx(id, `/${verb}`));
}

/**
 * The four buttons. With `onAction(action)` each calls it; without, a parent listens
 * (the list delegates clicks: each button has data-action). sync(state) enables the legal ones.
 */
export function actionButtons(onAction) {
  const buttons = ACTIONS.map((a) => h('button', {
    type: 'button', class: a === 'kill' ? 'small danger' : 'small', test: `action-${a}`,
    'data-action': a, title: TITLE[a], disabled: true,
    onclick: onAction ? () => onAction(a) : undefined,
  }, LABEL[a]));
  return {
    el: h('span', { class: 'actions' }, buttons),
    sync(state, busy = false) {
      for (const b of buttons) {
        const off = busy || !legal(b.dataset.action, state);
        if (b.disabled !== off) b.disabled = off;
      }
    },
  };
}
