// The only way this console builds DOM: elements are created one by one, text goes in as
// text nodes, and attributes pass a whitelist. Nothing here parses markup, so a guest's file
// name or log line can never become an element or a script.

const PROPS = new Set(['value', 'checked', 'disabled', 'selected', 'hidden', 'multiple',
  'readOnly', 'required', 'open', 'indeterminate']);
const ATTRS = new Set(['id', 'class', 'type', 'name', 'placeholder', 'title', 'for',
  'download', 'min', 'max', 'step', 'rows', 'cols', 'colspan', 'autocomplete', 'spellcheck',
  'role', 'tabindex', 'accept', 'maxlength', 'pattern', 'size', 'rel', 'wrap', 'inputmode',
  'list', 'autofocus']);
const SVG_ATTRS = new Set(['class', 'viewBox', 'width', 'height', 'points', 'd', 'fill',
  'stroke', 'stroke-width', 'stroke-linejoin', 'preserveAspectRatio', 'x', 'y', 'x1', 'y1',
  'x2', 'y2', 'role', 'aria-hidden', 'aria-label']);
const SVG_NS = 'http://www.w3.org/2000/svg';

// href may only be one of our own routes, one of our own static files, or a Blob we made.
function safeHref(v) {
  const s = String(v);
  if (s.startsWith('#/') || s.startsWith('/console/') || s.startsWith('blob:')) return s;
  throw new Error(`refused href ${JSON.stringify(s.slice(0, 40))}`);
}

function setAttr(el, key, v, allowed) {
  if (v === undefined || v === null || v === false) return;
  if (key.startsWith('on') && key.length > 2) {
    if (typeof v !== 'function') throw new Error(`${key} needs a function`);
    el.addEventListener(key.slice(2).toLowerCase(), v);
  } else if (key === 'href') {
    el.setAttribute('href', safeHref(v));
  } else if (key === 'test') {
    el.setAttribute('data-test', String(v)); // shorthand for the test hooks
  } else if (PROPS.has(key) && allowed === ATTRS) {
    el[key] = v;
  } else if (allowed.has(key) || key.startsWith('data-') || key.startsWith('aria-')) {
    el.setAttribute(key, v === true ? '' : String(v));
  } else {
    throw new Error(`attribute ${key} is not allowed`);
  }
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false || c === true) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

/** h('button', {class: 'x', onclick: fn, test: 'hook'}, 'text', child, [more]) */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) setAttr(el, k, v, ATTRS);
  append(el, children);
  return el;
}

/** The same for SVG elements (the sparklines). */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) setAttr(el, k, v, SVG_ATTRS);
  append(el, children);
  return el;
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Sets text only when it changed (keeps big tables from repainting on every poll). */
export function setText(el, text) {
  const t = String(text ?? '');
  if (el.textContent !== t) el.textContent = t;
}

/** A <select> whose options are [value, label] pairs (or plain strings). */
export function select(attrs, options, current) {
  const el = h('select', attrs);
  for (const o of options) {
    const [value, label] = Array.isArray(o) ? o : [o, o];
    el.appendChild(h('option', { value, selected: value === current }, label));
  }
  return el;
}

/** A labelled form field: <label>text <input …></label>. */
export function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input,
    hint ? h('span', { class: 'hint' }, hint) : null);
}
