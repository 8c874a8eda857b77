// #/login: an API key, checked with GET /v1/sandboxes before it is kept.

import { h, field } from '../dom.js';
import { api, setKey, plausibleKey } from '../api.js';
import { errorLine, showError } from '../ui.js';

export function mount(el, _params, app) {
  const key = h('input', { type: 'password', test: 'login-key', autocomplete: 'off',
    spellcheck: 'false', placeholder: 'space_k…', required: true });
  const error = errorLine('login-error');
  const submit = h('button', { type: 'submit', class: 'primary', test: 'login-submit' }, 'Log in');

  async function login(e) {
    e.preventDefault();
    const k = key.value.trim();
    showError(error, null);
    if (!plausibleKey(k)) {
      showError(error, new Error('An API key is one word of printable characters (space_…).'));
      return;
    }
    submit.disabled = true;
    try {
      // The key is kept only once the API took it; a 401 here is shown, not redirected.
      const list = await api('GET', '/v1/sandboxes', { key: k, checkAuth: false });
      setKey(k);
      await app.afterLogin(list);
    } catch (err) {
      showError(error, err);
    } finally {
      submit.disabled = false;
    }
  }

  el.appendChild(h('div', { class: 'login' },
    h('form', { class: 'card', onsubmit: login },
      h('h1', {}, 'space'),
      h('p', { class: 'muted' }, 'Log in with an API key. It stays in this tab only, and is ' +
        'forgotten when the tab closes or you log out.'),
      field('API key', key), error, h('div', { class: 'buttons' }, submit))));
  key.focus();
  return {};
}
