/* The GPU pool's pages: the admin panel's map, charts, sortable tables and confirmed actions,
 * and the user page's charts. Plain browser JavaScript, no build step, loaded from static/
 * (the Content-Security-Policy allows no inline script). Every value from the pool is set with
 * textContent or an attribute, never parsed as HTML; every change is a REST API call carrying
 * the hub's XSRF token, as JupyterHub's own admin page sends it.
 */
'use strict';

(function () {
  const meta = name => document.querySelector(`meta[name="${name}"]`)?.content || '';
  const API = meta('gpupool-api');
  const XSRF = meta('gpupool-xsrf');

  // -- the API ---------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, body) {
      const err = (body && body.error) || {};
      super(err.message || `HTTP ${status}`);
      this.status = status;
      this.code = err.code;
      this.field = err.field;
    }
  }

  /** One API call with the hub's XSRF token: the response, or an ApiError (status, code,
   * field) from the error body. */
  async function request(method, path, body, accept = 'application/json') {
    const init = {
      method,
      credentials: 'same-origin',
      headers: { 'X-XSRFToken': XSRF, Accept: accept }
    };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const r = await fetch(API + path, init);
    if (!r.ok) {
      // an error body that is not JSON (a proxy's page) still gives the status
      const data = await r.json().catch(() => null);
      throw new ApiError(r.status, data);
    }
    return r;
  }

  /** ``request``'s JSON body (null for an empty one). */
  async function api(method, path, body) {
    const r = await request(method, path, body);
    try {
      return await r.json();
    } catch {
      return null;
    }
  }

  /** The one display rule for text from users, agents and admins (as the pages' templates
   * apply it, pages/base.py ``shown``): every bidirectional control (U+202A–U+202E,
   * U+2066–U+2069) is shown as a visible [U+202E] instead of being obeyed. */
  const BIDI = /[\u202a-\u202e\u2066-\u2069]/g;
  const visible = text =>
    String(text ?? '').replace(
      BIDI,
      c => `[U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}]`
    );
  /** Attributes people read (screen readers, tooltips): shown, like text. */
  const READ = new Set(['aria-label', 'title', 'alt', 'placeholder']);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = visible(v);
      else node.setAttribute(k, v === true ? '' : READ.has(k) ? visible(v) : String(v));
    }
    for (const c of children) node.append(typeof c === 'string' ? visible(c) : c);
    return node;
  }

  function status(text, bad) {
    const line = document.getElementById('gpupool-status');
    if (!line) return;
    line.hidden = !text;
    line.textContent = visible(text || '');
    line.classList.toggle('error', !!bad);
  }

  // "1 lease", "2 leases", "0 grants"
  const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

  const units = u => {
    if (u === null || u === undefined) return 'none';
    const v = Math.round(u * 1000) / 1000;
    return `${v} GPU${v === 1 ? '' : 's'}`;
  };
  const dur = s => {
    s = Math.round(s || 0);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400)
      return `${Math.floor(s / 3600)} h ${String(Math.floor((s % 3600) / 60)).padStart(2, '0')} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  };

  // -- the confirmation dialog -------------------------------------------------------------

  /** Ask before acting: resolves to the fields' values, or null when cancelled. ``check``
   * (optional) may run the action and throw an ApiError, shown in the dialog (field named). */
  function confirmDialog({ title, text, fields = [], ok = 'Confirm', extra, check }) {
    const dialog = document.getElementById('gpupool-confirm');
    const box = document.getElementById('gpupool-confirm-fields');
    const error = document.getElementById('gpupool-confirm-error');
    document.getElementById('gpupool-confirm-title').textContent = visible(title);
    document.getElementById('gpupool-confirm-text').textContent = visible(text || '');
    document.getElementById('gpupool-confirm-ok').textContent = visible(ok);
    error.hidden = true;
    box.replaceChildren();
    for (const f of fields) {
      let input;
      if (f.type === 'select') {
        input = el('select', { name: f.name });
        for (const [value, label] of f.options) input.append(el('option', { value, text: label }));
        input.value = f.value || f.options[0][0];
      } else if (f.type === 'checkbox') {
        input = el('input', { type: 'checkbox', name: f.name, checked: !!f.value });
      } else {
        input = el('input', {
          type: f.type || 'text',
          name: f.name,
          value: f.value ?? '',
          step: 'any',
          dir: 'auto'
        });
      }
      box.append(
        el('label', { class: f.type === 'checkbox' ? 'check' : '' }, f.label + ' ', input)
      );
    }
    if (extra) box.append(extra);
    return new Promise(resolve => {
      const form = dialog.querySelector('form');
      const values = () => {
        const out = {};
        for (const input of box.querySelectorAll('input, select')) {
          out[input.name] = input.type === 'checkbox' ? input.checked : input.value;
        }
        return out;
      };
      const onSubmit = async event => {
        if (event.submitter && event.submitter.value !== 'ok') return;
        if (!check) return;
        event.preventDefault();
        try {
          await check(values());
          dialog.close('ok');
        } catch (e) {
          error.hidden = false;
          error.textContent = visible(e.field ? `${e.field}: ${e.message}` : e.message);
          const bad = e.field && box.querySelector(`[name="${CSS.escape(e.field)}"]`);
          if (bad) {
            bad.setAttribute('aria-invalid', 'true');
            bad.focus();
          }
        }
      };
      form.addEventListener('submit', onSubmit);
      dialog.addEventListener(
        'close',
        () => {
          form.removeEventListener('submit', onSubmit);
          resolve(dialog.returnValue === 'ok' ? values() : null);
        },
        { once: true }
      );
      dialog.returnValue = '';
      dialog.showModal();
    });
  }

  async function act(what, fn) {
    try {
      await fn();
      status(`${what}: done.`);
      setTimeout(() => location.reload(), 300);
    } catch (e) {
      status(`${what} failed: ${e.message}`, true);
    }
  }

  // -- sortable tables ---------------------------------------------------------------------

  function sortable(table) {
    const heads = [...table.querySelectorAll('th[data-sort]')];
    heads.forEach((th, col) => {
      th.tabIndex = 0;
      const index = [...th.parentNode.children].indexOf(th);
      const sort = () => {
        const down = th.getAttribute('aria-sort') !== 'descending';
        heads.forEach(h => h.removeAttribute('aria-sort'));
        th.setAttribute('aria-sort', down ? 'descending' : 'ascending');
        const body = table.tBodies[0];
        const key = row => {
          const cell = row.children[index];
          const v = cell.dataset.value ?? cell.textContent.trim();
          return th.dataset.sort === 'num' ? parseFloat(v) || 0 : v.toLowerCase();
        };
        const rows = [...body.rows].sort((a, b) => {
          const x = key(a),
            y = key(b);
          return (x < y ? -1 : x > y ? 1 : 0) * (down ? -1 : 1);
        });
        body.append(...rows);
      };
      th.addEventListener('click', sort);
      th.addEventListener('keydown', e => {
        if (e.key === 'Enter' || e.key === ' ') {
          e.preventDefault();
          sort();
        }
      });
      void col;
    });
  }

  // what the panel's other scripts (panel-*.js) and the pages' own (governance.js) share,
  // loaded after this one
  window.gpupool = Object.freeze({
    ApiError,
    request,
    api,
    el,
    status,
    visible,
    plural,
    units,
    dur,
    confirmDialog,
    act
  });

  document.addEventListener('DOMContentLoaded', () => {
    document.querySelectorAll('table.sortable').forEach(sortable);
  });
})();
