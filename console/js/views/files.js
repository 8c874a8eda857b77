// Files tab: browse, download, delete, make folders, and upload (file picker or drag and drop,
// with a progress bar per file). Names come from the guest: they only ever become text.

import { h, fill } from '../dom.js';
import { api, sbx, upload, download } from '../api.js';
import { report, errorLine, showError, confirmDialog, promptDialog, toast, busy } from '../ui.js';
import { bytes, mode, time } from '../format.js';
import { known } from './actions.js';

const HOME = '/home/user';
const MAX_ROWS = 5000;

export const join = (dir, name) => (dir === '/' ? `/${name}` : `${dir}/${name}`);
export const parent = (path) => path.slice(0, path.lastIndexOf('/')) || '/';
const checkName = (name) => {
  if (name.includes('/') || name === '.' || name === '..') throw new Error('A name without "/"');
};

export function mount(el, ctx) {
  const { id } = ctx;
  let cwd = HOME;
  let seq = 0; // the newest listing wins
  let started = false;

  const crumbs = h('div', { class: 'path mono', test: 'file-path' });
  const picker = h('input', { type: 'file', multiple: true, test: 'file-input', class: 'offscreen',
    onchange: () => { const list = [...picker.files]; picker.value = ''; uploadAll(list); } });
  const error = errorLine('files-error');
  const tbody = h('tbody');
  const note = h('p', { class: 'muted small' });
  const uploads = h('div', { class: 'uploads' });
  const drop = h('div', { class: 'drop', test: 'file-drop', ondragover: onDragOver,
    ondragleave: () => drop.classList.remove('over'), ondrop: onDrop },
    h('table', { class: 'list files' },
      h('thead', {}, h('tr', {}, ['Name', 'Size', 'Mode', 'Modified', ''].map((t) => h('th', {}, t)))),
      tbody),
    h('p', { class: 'drop-hint muted' }, 'Drop files here to upload them into this folder.'));
  const up = h('button', { type: 'button', onclick: () => load(parent(cwd)) }, 'Up');

  el.append(
    h('div', { class: 'toolbar' }, up, crumbs, h('span', { class: 'grow' }),
      h('button', { type: 'button', onclick: () => load(cwd) }, 'Refresh'),
      h('button', { type: 'button', test: 'file-mkdir', onclick: mkdir }, 'New folder'),
      h('label', { class: 'button primary' }, 'Upload…', picker)),
    error, uploads, drop, note);

  function renderCrumbs() {
    // Text reads as the path itself: "/" then "home" "/" "user" ...
    const parts = cwd.split('/').filter(Boolean);
    const links = [h('button', { type: 'button', class: 'crumb', onclick: () => load('/') }, '/')];
    parts.forEach((p, i) => {
      const target = `/${parts.slice(0, i + 1).join('/')}`;
      if (i > 0) links.push(h('span', { class: 'sep' }, '/'));
      links.push(h('button', { type: 'button', class: 'crumb', onclick: () => load(target) }, p));
    });
    fill(crumbs, links);
    crumbs.dataset.path = cwd;
    up.disabled = cwd === '/';
  }

  function row(entry) {
    const { name, stat } = entry;
    const path = join(cwd, name);
    const isDir = stat.file_type === 'dir';
    const label = isDir
      ? h('button', { type: 'button', class: 'link', onclick: () => load(path) }, `${name}/`)
      : h('span', {}, name);
    return h('tr', { test: 'file-row', 'data-name': name, 'data-type': stat.file_type },
      h('td', { class: 'name' }, label,
        stat.symlink_target ? h('span', { class: 'muted' }, ` → ${stat.symlink_target}`) : null),
      h('td', { class: 'num' }, isDir ? '' : bytes(stat.size)),
      h('td', { class: 'mono' }, mode(stat.file_type, stat.mode)),
      h('td', { class: 'num' }, time(Math.floor(stat.mtime_unix_ns / 1e6))),
      h('td', { class: 'col-actions' },
        isDir ? null : h('button', { type: 'button', class: 'small', test: 'file-download',
          onclick: (e) => busy(e.currentTarget, () => download(sbx(id, '/files'), { path }, name)) },
        'Download'),
        h('button', { type: 'button', class: 'small danger', test: 'file-delete',
          onclick: () => remove(path, isDir) }, 'Delete')));
  }

  async function load(path) {
    const mine = ++seq;
    cwd = path;
    renderCrumbs();
    showError(error, null);
    try {
      const { entries } = await api('GET', sbx(id, '/files/list'), { query: { path } });
      if (mine !== seq) return;
      const sorted = (entries || []).slice().sort((a, b) =>
        (b.stat.file_type === 'dir') - (a.stat.file_type === 'dir') || a.name.localeCompare(b.name));
      fill(tbody, sorted.slice(0, MAX_ROWS).map(row));
      note.textContent = sorted.length > MAX_ROWS
        ? `Showing ${MAX_ROWS} of ${sorted.length} entries.` : `${sorted.length} entries`;
    } catch (err) {
      if (mine !== seq) return;
      tbody.replaceChildren();
      note.textContent = err.code === 'file_not_found'
        ? 'This folder does not exist (yet): an upload here makes it.' : '';
      showError(error, err);
    }
  }

  async function remove(path, isDir) {
    const yes = await confirmDialog(`Delete ${path}${isDir ? ' and everything in it' : ''}?`,
      { ok: 'Delete', danger: true, title: 'Delete' });
    if (!yes) return;
    try {
      await api('DELETE', sbx(id, '/files'), { query: { path, recursive: isDir ? 'true' : undefined } });
      toast(`Deleted ${path}`);
    } catch (err) { report(err); }
    load(cwd);
  }

  async function mkdir() {
    const dir = cwd;
    const name = await promptDialog('New folder', 'Name', {
      ok: 'Create',
      check: async (n) => { // runs in the dialog, which shows what the API refuses
        checkName(n);
        await api('POST', sbx(id, '/files/mkdir'), { json: { path: join(dir, n), parents: false } });
      },
    });
    if (name) load(cwd);
  }

  async function uploadAll(files) {
    if (!files.length) return;
    const dir = cwd;
    const items = files.map((file) => {
      const bar = h('progress', { max: 1, value: 0, test: 'file-progress', 'data-name': file.name });
      const status = h('span', { class: 'muted' }, `waiting · ${bytes(file.size)}`);
      const line = h('div', { class: 'upload' }, h('span', { class: 'mono' }, file.name), bar, status);
      uploads.appendChild(line);
      return { file, bar, status, line };
    });
    for (const it of items) { // one at a time: the guest writes each file whole
      it.status.textContent = `uploading · ${bytes(it.file.size)}`;
      try {
        await upload(id, join(dir, it.file.name), it.file, (f) => { it.bar.value = f; });
        it.bar.value = 1;
        it.status.textContent = 'done';
        setTimeout(() => it.line.remove(), 4000);
        if (cwd === dir) load(cwd);
      } catch (err) {
        it.line.classList.add('failed');
        it.status.textContent = err.message;
        it.line.appendChild(h('button', { type: 'button', class: 'small',
          onclick: () => it.line.remove() }, 'Dismiss'));
      }
    }
  }

  function onDragOver(e) {
    if (!e.dataTransfer || ![...e.dataTransfer.types].includes('Files')) return;
    e.preventDefault();
    e.dataTransfer.dropEffect = 'copy';
    drop.classList.add('over');
  }

  function onDrop(e) {
    e.preventDefault();
    drop.classList.remove('over');
    const dt = e.dataTransfer;
    if (!dt) return;
    let files = [];
    let dirs = 0;
    for (const item of dt.items || []) {
      if (item.kind !== 'file') continue;
      if (item.webkitGetAsEntry?.()?.isDirectory) { dirs++; continue; }
      const f = item.getAsFile();
      if (f) files.push(f);
    }
    if (!files.length && !dirs) files = [...(dt.files || [])];
    if (dirs) toast('Folders are not uploaded: drop the files in them.', 'error');
    uploadAll(files);
  }

  // A file dropped beside the zone would make the browser open it in place of the console.
  const guard = (e) => { if (!drop.contains(e.target)) e.preventDefault(); };
  window.addEventListener('dragover', guard);
  window.addEventListener('drop', guard);

  renderCrumbs();
  // Listing a paused or suspended sandbox wakes it, so that waits for a click (or a resume).
  const begin = () => { if (!started) { started = true; load(cwd); } };
  const offChange = ctx.onChange((sb) => { if (sb.state === 'running') begin(); });
  known(ctx).then((sb) => {
    if (started) return;
    if (sb.state === 'paused' || sb.state === 'suspended') {
      fill(tbody, h('tr', {}, h('td', { colspan: 5 }, `The sandbox is ${sb.state}; listing wakes it. `,
        h('button', { type: 'button', onclick: begin }, 'List files'))));
    } else begin();
  });

  return {
    destroy() {
      seq++;
      started = true;
      offChange();
      window.removeEventListener('dragover', guard);
      window.removeEventListener('drop', guard);
    },
  };
}
