// Boot and hash router. A view is mount(el, params, app) → {destroy?(), update?(params)}:
// destroy stops its polls and sockets, update(params) → true keeps it for a new route of the
// same kind (the sandbox page switching tabs).

import { h, fill } from './dom.js';
import { api, getKey, clearKey, session, onUnauthorized, keyIdOf } from './api.js';
import { report, toast } from './ui.js';
import * as login from './views/login.js';
import * as sandboxes from './views/sandboxes.js';
import * as sandbox from './views/sandbox.js';
import * as templates from './views/templates.js';
import * as builds from './views/builds.js';
import * as admin from './views/admin.js';
import * as nodes from './views/nodes.js';
import * as audit from './views/audit.js';

const ROUTES = [
  { name: 'login', re: /^\/login$/, mount: login.mount, nav: null, open: true },
  { name: 'sandboxes', re: /^\/sandboxes$/, mount: sandboxes.mount, nav: 'sandboxes' },
  { name: 'sandbox', re: /^\/sandboxes\/([^/]+)(?:\/([a-z]+))?$/, keys: ['id', 'tab'],
    mount: sandbox.mount, nav: 'sandboxes' },
  { name: 'templates', re: /^\/templates$/, mount: templates.mount, nav: 'templates' },
  { name: 'builds', re: /^\/builds$/, mount: builds.mountList, nav: 'builds' },
  { name: 'build', re: /^\/builds\/([^/]+)$/, keys: ['id'], mount: builds.mountOne, nav: 'builds' },
  { name: 'tenants', re: /^\/admin\/tenants$/, mount: admin.mountTenants, nav: 'tenants', admin: true },
  { name: 'tenant', re: /^\/admin\/tenants\/([^/]+)$/, keys: ['name'], mount: admin.mountTenant,
    nav: 'tenants', admin: true },
  { name: 'nodes', re: /^\/admin\/nodes$/, mount: nodes.mount, nav: 'nodes', admin: true },
  { name: 'audit', re: /^\/admin\/audit$/, mount: audit.mountAdmin, nav: 'audit', admin: true },
];

const DEFAULT = '#/sandboxes';
let current = null; // {route, view}
let afterLoginHash = DEFAULT;
const main = h('main', { class: 'main', id: 'view' });
const identity = h('div', { class: 'identity', test: 'identity' });
// In the nav only for admin keys (GET /v1/tenants answers them).
const adminLinks = h('div', { class: 'nav-admin' },
  h('a', { href: '#/admin/tenants', test: 'nav-admin', class: 'section' }, 'Admin'),
  h('a', { href: '#/admin/tenants', class: 'sub', 'data-nav': 'tenants' }, 'Tenants & keys'),
  h('a', { href: '#/admin/nodes', class: 'sub', 'data-nav': 'nodes' }, 'Nodes'),
  h('a', { href: '#/admin/audit', class: 'sub', 'data-nav': 'audit' }, 'Audit log'));
const nav = h('nav', { class: 'side', 'aria-label': 'Main' },
  h('a', { href: '#/sandboxes', class: 'brand' }, 'space'),
  h('a', { href: '#/sandboxes', test: 'nav-sandboxes', 'data-nav': 'sandboxes' }, 'Sandboxes'),
  h('a', { href: '#/templates', test: 'nav-templates', 'data-nav': 'templates' }, 'Templates'),
  h('a', { href: '#/builds', test: 'nav-builds', 'data-nav': 'builds' }, 'Builds'),
  h('div', { class: 'grow' }),
  identity,
  h('button', { type: 'button', class: 'logout', test: 'logout', onclick: logout }, 'Log out'));

/** What views may ask of the shell. */
const app = {
  navigate(hash) { if (location.hash === hash) render(); else location.hash = hash; },
  async afterLogin(sandboxList) {
    await identify(sandboxList);
    const next = afterLoginHash.startsWith('#/login') ? DEFAULT : afterLoginHash;
    afterLoginHash = DEFAULT;
    app.navigate(next);
  },
};

/** Learns whether the key is an admin's (GET /v1/tenants answers 403 to tenant keys). */
async function identify(sandboxList) {
  session.keyId = keyIdOf(getKey());
  try {
    await api('GET', '/v1/tenants');
    session.admin = true;
  } catch (err) {
    if (err.status !== 403) throw err;
    session.admin = false;
  }
  session.tenant = sandboxList?.sandboxes?.[0]?.tenant || '';
  if (!session.tenant && !session.admin) {
    // A tenant key sees only its tenant's events, so any event names the tenant.
    const { events } = await api('GET', '/v1/audit', { query: { limit: 1 } }).catch(() => ({}));
    session.tenant = events?.[0]?.tenant || '';
  }
  updateNav();
}

function updateNav(route) {
  if (session.admin && !adminLinks.isConnected) nav.querySelector('.grow').before(adminLinks);
  if (!session.admin) adminLinks.remove();
  const who = session.admin ? 'admin key' : 'key';
  fill(identity, h('div', {}, `${who} ${session.keyId || ''}`.trim()),
    session.tenant ? h('div', { class: 'muted' }, `tenant ${session.tenant}`) : null);
  if (route) {
    for (const a of nav.querySelectorAll('a[data-nav]')) {
      a.classList.toggle('active', a.dataset.nav === route.nav);
    }
  }
  document.body.classList.toggle('logged-out', !getKey() || route?.name === 'login');
}

function logout() {
  current?.view.destroy?.();
  current = null;
  clearKey();
  app.navigate('#/login');
}

function match(path) {
  for (const route of ROUTES) {
    const m = route.re.exec(path);
    if (!m) continue;
    const params = {};
    (route.keys || []).forEach((k, i) => {
      const raw = m[i + 1];
      try { params[k] = raw === undefined ? undefined : decodeURIComponent(raw); } catch { params[k] = ''; }
    });
    return { route, params };
  }
  return null;
}

function notFound(el, text) {
  fill(el, h('h1', {}, 'Not here'), h('p', {}, text), h('a', { href: DEFAULT }, 'Back to the sandboxes'));
  return {};
}

function render() {
  const path = location.hash.replace(/^#/, '') || '/';
  if (path === '/' || path === '') { location.replace(DEFAULT); return; }
  const found = match(path);
  if (found && !found.route.open && !getKey()) {
    afterLoginHash = location.hash;
    location.replace('#/login');
    return;
  }
  if (found && current && current.route === found.route && current.view.update?.(found.params)) {
    return;
  }
  current?.view.destroy?.();
  const el = h('div', { class: 'view' });
  fill(main, el);
  let view;
  try {
    if (!found) view = notFound(el, 'There is no such page in the console.');
    else if (found.route.admin && !session.admin) view = notFound(el, 'This page needs an admin key.');
    else view = found.route.mount(el, found.params, app) || {};
  } catch (err) {
    report(err);
    view = {};
  }
  current = { route: found?.route, view };
  updateNav(found?.route);
  if (!window.spaceConsole) window.spaceConsole = { ready: true };
}

async function boot() {
  onUnauthorized(() => {
    clearKey();
    if (!location.hash.startsWith('#/login')) {
      toast('The API refused the key: log in again', 'error');
      afterLoginHash = location.hash;
      location.hash = '#/login';
    }
  });
  // A failure nobody caught still reaches the user, as a toast.
  window.addEventListener('unhandledrejection', (e) => { e.preventDefault(); report(e.reason); });
  document.body.appendChild(h('div', { class: 'app' }, nav, main));
  if (getKey()) {
    try { await identify(); } catch (err) { report(err); }
  }
  window.addEventListener('hashchange', render);
  render();
}

boot();
