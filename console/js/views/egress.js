// Network tab: the sandbox's egress policy (GET/PUT /v1/sandboxes/{id}/egress): the default,
// allow and deny rules, and header rules. Saved whole; the API answers the canonical form.

import { h, fill, select } from '../dom.js';
import { api, sbx } from '../api.js';
import { busy, errorLine, showError, toast } from '../ui.js';

const RULE_HINT = 'host, host:port, *.suffix, * or an IP';

/** An editable list of rows; make(value) builds a row's inputs, read(row) gets its value. */
function editableList(test, make, read, addLabel) {
  const rows = h('div', { class: 'rows' });
  const add = (value) => {
    const inputs = make(value);
    const row = h('div', { class: 'edit-row', test }, inputs,
      h('button', { type: 'button', class: 'small', title: 'Remove',
        onclick: () => row.remove() }, 'Remove'));
    row.inputs = inputs;
    rows.appendChild(row);
    return row;
  };
  const el = h('div', { class: 'edit-list' }, rows,
    h('button', { type: 'button', class: 'small', test: `${test}-add`,
      onclick: () => add().inputs[0].focus() }, addLabel));
  return {
    el,
    set(values) { rows.replaceChildren(); (values || []).forEach(add); },
    get() { return [...rows.children].map((r) => read(r.inputs)).filter(Boolean); },
  };
}

const ruleInput = (value = '') => [h('input', { type: 'text', value, placeholder: RULE_HINT,
  spellcheck: 'false', autocomplete: 'off', class: 'mono' })];
const readRule = ([input]) => input.value.trim() || null;

export function mount(el, ctx) {
  const { id } = ctx;
  const def = select({ test: 'egress-default' },
    [['allow', 'allow: everything not denied'], ['deny', 'deny: only what is allowed']], 'allow');
  const allow = editableList('egress-allow', ruleInput, readRule, 'Add allow rule');
  const deny = editableList('egress-deny', ruleInput, readRule, 'Add deny rule');
  const headers = editableList('egress-header', (r = {}) => [
    h('input', { type: 'text', value: r.host || '', placeholder: 'host rule', class: 'mono',
      spellcheck: 'false', autocomplete: 'off' }),
    h('input', { type: 'text', value: r.name || '', placeholder: 'Header-Name', class: 'mono',
      spellcheck: 'false', autocomplete: 'off' }),
    h('input', { type: 'text', value: r.value || '', placeholder: 'value, e.g. Bearer ${secret:NAME}',
      class: 'mono wide', spellcheck: 'false', autocomplete: 'off' }),
  ], ([host, name, value]) => (host.value.trim() || name.value.trim() || value.value
    ? { host: host.value.trim(), name: name.value.trim(), value: value.value } : null), 'Add header rule');
  const error = errorLine('egress-error');
  const save = h('button', { type: 'button', class: 'primary', test: 'egress-save',
    onclick: () => busy(save, store) }, 'Save');
  const form = h('div', { class: 'egress', hidden: true },
    h('p', { class: 'muted small' }, 'Deny rules win, then allow rules, then the default. ' +
      'Private addresses need an allow rule naming the host exactly. New connections use a ' +
      'saved policy at once; open ones are not cut.'),
    h('label', { class: 'field inline' }, h('span', { class: 'field-label' }, 'Default'), def),
    h('div', { class: 'columns' },
      h('section', {}, h('h3', {}, 'Allow'), allow.el),
      h('section', {}, h('h3', {}, 'Deny'), deny.el)),
    h('section', {}, h('h3', {}, 'Headers'),
      h('p', { class: 'muted small' }, 'The gateway sets these headers on requests to hosts ' +
        'the rule matches; ${secret:NAME} stands for a vault secret bound to those hosts.'),
      headers.el),
    error,
    h('div', { class: 'buttons' },
      h('button', { type: 'button', onclick: () => load() }, 'Revert'), save));
  const loading = h('p', { class: 'muted' }, 'Loading the policy…');
  el.append(loading, form);

  function show(policy) {
    def.value = policy.default === 'deny' ? 'deny' : 'allow';
    allow.set(policy.allow);
    deny.set(policy.deny);
    headers.set(policy.headers);
    form.hidden = false;
    loading.hidden = true;
  }

  async function load() {
    showError(error, null);
    try {
      show(await api('GET', sbx(id, '/egress')));
    } catch (err) {
      fill(loading, h('span', { class: 'error' }, err.message));
      showError(error, err);
    }
  }

  async function store() {
    showError(error, null);
    const policy = { default: def.value, allow: allow.get(), deny: deny.get(), headers: headers.get() };
    try {
      show(await api('PUT', sbx(id, '/egress'), { json: policy }));
      toast('Egress policy saved');
    } catch (err) {
      showError(error, err); // the API says which rule it refused
      throw err;
    }
  }

  load();
  return {};
}
