// #/templates: the templates the key sees, and a form to build one (POST /v1/templates).

import { h, fill, field } from '../dom.js';
import { api, session } from '../api.js';
import { report, errorLine, showError, confirmDialog, toast, busy, emptyNote } from '../ui.js';
import { mib, time } from '../format.js';

const NAME_RE = /^[a-z0-9][a-z0-9-]{0,39}$/;
const SOURCES = [
  ['dockerfile', 'Dockerfile'],
  ['from_image', 'Image from a registry'],
  ['image', 'Stock image'],
];

function buildForm(app) {
  const text = (test, placeholder, extra = {}) => h('input', { type: 'text', test, placeholder,
    autocomplete: 'off', spellcheck: 'false', ...extra });
  const name = text('build-name', 'my-template', { required: true });
  const version = text('build-version', 'next');
  const dockerfile = h('textarea', { test: 'build-dockerfile', rows: 10, class: 'mono',
    spellcheck: 'false', placeholder: 'FROM python:3.12-slim\nRUN pip install requests' });
  const reference = text('build-image', 'registry.example.com/team/python:3.12');
  const username = text('build-username', 'optional');
  const password = h('input', { type: 'password', test: 'build-password', placeholder: 'optional',
    autocomplete: 'off' });
  const stock = text('build-stock', 'minimal');
  const start = text('build-start', 'python3 -m http.server 8000 (optional)');
  const readyPort = h('input', { type: 'number', min: 1, max: 65535, test: 'build-ready-port',
    placeholder: 'optional' });
  const vcpus = h('input', { type: 'number', min: 1, placeholder: 'default' });
  const memory = h('input', { type: 'number', min: 64, step: 64, placeholder: 'default' });
  const error = errorLine('build-error');
  const submit = h('button', { type: 'submit', class: 'primary', test: 'build-submit' }, 'Build');

  const groups = {
    dockerfile: h('div', {}, field('Dockerfile', dockerfile)),
    from_image: h('div', { class: 'form-grid' }, field('Image reference', reference),
      field('Registry user', username), field('Registry password', password)),
    image: h('div', {}, field('Stock image', stock, 'One of the server\'s root images')),
  };
  let source = 'dockerfile';
  const radios = SOURCES.map(([value, label]) => h('label', { class: 'check' },
    h('input', { type: 'radio', name: 'build-source', value, checked: value === source,
      test: `build-source-${value}`, onchange: () => pick(value) }), ` ${label}`));
  function pick(value) {
    source = value;
    for (const [k, g] of Object.entries(groups)) g.hidden = k !== value;
  }
  pick(source);

  const optInt = (input, label) => {
    const v = input.value.trim();
    if (!v) return undefined;
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${label} must be a whole number`);
    return n;
  };

  function request() {
    const n = name.value.trim();
    if (!NAME_RE.test(n)) throw new Error('A name is 1 to 40 of a-z, 0-9 and -, not starting with -');
    const req = { name: n };
    if (version.value.trim()) req.version = version.value.trim();
    if (source === 'dockerfile') {
      if (!dockerfile.value.trim()) throw new Error('Write a Dockerfile');
      req.dockerfile = dockerfile.value;
    } else if (source === 'from_image') {
      if (!reference.value.trim()) throw new Error('Give an image reference');
      req.from_image = { reference: reference.value.trim() };
      if (username.value) req.from_image.username = username.value;
      if (password.value) req.from_image.password = password.value;
    } else {
      if (!stock.value.trim()) throw new Error('Name a stock image');
      req.image = stock.value.trim();
    }
    if (start.value.trim()) req.start = start.value.trim();
    const port = optInt(readyPort, 'Ready port');
    if (port) req.ready_port = port;
    const v = optInt(vcpus, 'vCPUs');
    if (v) req.vcpus = v;
    const m = optInt(memory, 'Memory');
    if (m) req.memory_mib = m;
    return req;
  }

  return h('form', { class: 'card build-form', onsubmit: async (e) => {
    e.preventDefault();
    showError(error, null);
    submit.disabled = true;
    try {
      const build = await api('POST', '/v1/templates', { json: request() });
      toast(`Build ${build.id} started`);
      app.navigate(`#/builds/${encodeURIComponent(build.id)}`);
    } catch (err) {
      showError(error, err);
    } finally {
      submit.disabled = false;
    }
  } },
  h('h2', {}, 'Build a template'),
  h('div', { class: 'form-grid' }, field('Name', name), field('Version', version)),
  h('div', { class: 'radios' }, radios),
  groups.dockerfile, groups.from_image, groups.image,
  h('div', { class: 'form-grid' }, field('Start command', start, 'Runs before the snapshot'),
    field('Ready port', readyPort), field('vCPUs', vcpus), field('Memory, MiB', memory)),
  error, h('div', { class: 'buttons' }, submit));
}

export function mount(el, _params, app) {
  const tbody = h('tbody');
  const error = errorLine('templates-error');

  async function load() {
    try {
      const { templates } = await api('GET', '/v1/templates');
      showError(error, null);
      const list = (templates || []).slice().sort((a, b) =>
        a.name.localeCompare(b.name) || b.created_unix_ms - a.created_unix_ms);
      fill(tbody, list.length ? list.map(row)
        : h('tr', {}, h('td', { colspan: 8 }, emptyNote('No templates.'))));
    } catch (err) {
      showError(error, err);
    }
  }

  const row = (t) => {
    // A tenant key sees public templates and its own: it may delete those it owns.
    const canDelete = session.admin || Boolean(t.owner);
    return h('tr', { test: 'template-row', 'data-name': t.name, 'data-version': t.version },
      h('td', { class: 'mono' }, t.name),
      h('td', { class: 'mono' }, t.version),
      h('td', {}, t.owner ? t.owner : h('span', { class: 'muted' }, 'public')),
      h('td', { class: 'num' }, `${t.vcpus} vCPU · ${mib(t.memory_mib)}`),
      h('td', { class: 'num' }, mib(t.image_mib)),
      h('td', { class: 'detail' }, t.source || '',
        t.start && t.start.command ? h('div', { class: 'muted small' }, `start: ${t.start.command}`) : null),
      h('td', { class: 'num nowrap' }, time(t.created_unix_ms)),
      h('td', { class: 'col-actions' }, canDelete ? h('button', { type: 'button',
        class: 'small danger', onclick: (e) => remove(t, e.currentTarget) }, 'Delete') : null));
  };

  async function remove(t, button) {
    const yes = await confirmDialog(`Delete template ${t.name}:${t.version}? Sandboxes that ` +
      'still run from it make the API refuse.', { ok: 'Delete', danger: true, title: 'Delete template' });
    if (!yes) return;
    await busy(button, async () => {
      await api('DELETE', `/v1/templates/${encodeURIComponent(t.name)}/${encodeURIComponent(t.version)}`);
      toast(`Deleted ${t.name}:${t.version}`);
      await load();
    });
  }

  el.append(
    h('div', { class: 'page-head' }, h('h1', {}, 'Templates'),
      h('a', { href: '#/builds', class: 'button' }, 'Builds')),
    error,
    h('div', { class: 'table-wrap' }, h('table', { class: 'list' },
      h('thead', {}, h('tr', {}, ['Name', 'Version', 'Owner', 'Size', 'Image', 'Source', 'Created', '']
        .map((x) => h('th', {}, x)))), tbody)),
    buildForm(app));
  load().catch(report);
  return {};
}
