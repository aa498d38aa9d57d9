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

  // what the pages' own scripts (governance.js) share, loaded after this one
  window.gpupool = Object.freeze({ ApiError, request, api, el, status, visible });

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

  // -- queue and leases --------------------------------------------------------------------

  function leaseActions() {
    document.addEventListener('click', async event => {
      const b = event.target.closest('button[data-action]');
      if (!b) return;
      const lease = b.dataset.lease;
      const who = b.dataset.who;
      switch (b.dataset.action) {
        case 'reclaim': {
          const v = await confirmDialog({
            title: 'Reclaim this GPU',
            text: `${who} gets a notice (on their page and in JupyterLab); at its end the reclaimer saves their notebooks and acts.`,
            fields: [
              { name: 'grace', label: 'Notice (minutes)', type: 'number', value: 10 },
              {
                name: 'action',
                label: 'Then',
                type: 'select',
                options: [
                  ['stop', 'stop the server'],
                  ['release-gpu', 'restart it without a GPU']
                ]
              },
              { name: 'reason', label: 'Reason shown to the user', value: '' },
              {
                name: 'immediately',
                label: 'Immediately: release now, no notice, nothing saved',
                type: 'checkbox'
              }
            ],
            ok: 'Reclaim'
          });
          if (!v) return;
          const body = v.immediately
            ? { immediately: true }
            : { grace: Math.max(0, parseFloat(v.grace) || 0) * 60, action: v.action };
          if (v.reason) body.reason = v.reason;
          return act('Reclaim', () =>
            api('POST', `allocations/${encodeURIComponent(lease)}/reclaim`, body)
          );
        }
        case 'extend': {
          const v = await confirmDialog({
            title: 'Extend the notice',
            text: `Push the deadline of ${who}'s reclaim notice later.`,
            fields: [{ name: 'minutes', label: 'By (minutes)', type: 'number', value: 60 }],
            ok: 'Extend'
          });
          if (!v) return;
          return act('Extend', () =>
            api('POST', `allocations/${encodeURIComponent(lease)}/extend`, {
              seconds: (parseFloat(v.minutes) || 0) * 60
            })
          );
        }
        case 'cancel-notice': {
          const v = await confirmDialog({
            title: 'Cancel the notice',
            text: `${who}'s ${b.dataset.kind} notice is withdrawn: they keep the GPU and are told. The idle count starts again.`,
            fields: [{ name: 'reason', label: 'Reason shown to the user (optional)', value: '' }],
            ok: 'Cancel notice'
          });
          if (!v) return;
          return act('Cancel notice', () =>
            api(
              'POST',
              `allocations/${encodeURIComponent(lease)}/notice/cancel`,
              v.reason ? { reason: v.reason } : {}
            )
          );
        }
        case 'release': {
          const v = await confirmDialog({
            title: 'Release this lease',
            text: `${who}'s lease ends now (reason: admin). A running server keeps running without its GPU reserved.`,
            ok: 'Release'
          });
          if (!v) return;
          return act('Release', () =>
            api('DELETE', `allocations/${encodeURIComponent(lease)}?reason=admin`)
          );
        }
        case 'approve': {
          const path = `allocations/${encodeURIComponent(lease)}/approve`;
          const smaller = JSON.parse(b.dataset.smaller || '[]');
          const fields = [
            {
              name: 'duration',
              label: 'For (hours; at most what was asked, empty: as asked)',
              type: 'number',
              value: b.dataset.hours
            }
          ];
          if (smaller.length)
            fields.push({
              name: 'offer',
              label: 'Offer',
              type: 'select',
              options: [['', `as asked (${b.dataset.offer})`], ...smaller]
            });
          fields.push({ name: 'note', label: 'Note for the user', value: '' });
          const body = v => {
            const out = {};
            if (v.duration) out.duration = parseFloat(v.duration) * 3600;
            if (v.offer) out.offer = v.offer;
            if (v.note) out.note = v.note;
            return out;
          };
          const v = await confirmDialog({
            title: 'Approve this request',
            text: `${who}'s request joins the queue in the order it was asked (or is granted now).`,
            fields,
            ok: 'Approve',
            check: values => api('POST', path, body(values))
          });
          if (!v) return;
          return act('Approve', async () => {});
        }
        case 'deny': {
          const path = `allocations/${encodeURIComponent(lease)}/deny`;
          const v = await confirmDialog({
            title: 'Deny this request',
            text: `${who}'s request ends; they see your reason.`,
            fields: [{ name: 'reason', label: 'Reason shown to the user', value: '' }],
            ok: 'Deny',
            check: values => api('POST', path, { reason: values.reason })
          });
          if (!v) return;
          return act('Deny', async () => {});
        }
        case 'cordon':
        case 'uncordon': {
          const node = b.dataset.node;
          const v = await confirmDialog({
            title: `${b.dataset.action} ${node}`,
            text:
              b.dataset.action === 'cordon'
                ? 'No new GPU lands on this node; leases stay.'
                : 'The node takes new grants again.',
            ok: b.textContent
          });
          if (!v) return;
          if (b.dataset.action === 'cordon')
            return act(b.textContent, () =>
              api('POST', `nodes/${encodeURIComponent(node)}/cordon`, {})
            );
          try {
            const answer = await api('POST', `nodes/${encodeURIComponent(node)}/uncordon`, {});
            status(
              `Uncordon: ${node} takes new grants again; ${plural(answer.withdrawn.length, 'drain notice')} withdrawn.`
            );
            setTimeout(() => location.reload(), 600);
          } catch (e) {
            status(`Uncordon failed: ${e.message}`, true);
          }
          return;
        }
        case 'drain': {
          const node = b.dataset.node;
          const soon = new Date(Date.now() + 2 * 3600e3);
          const local = new Date(soon.getTime() - soon.getTimezoneOffset() * 60e3)
            .toISOString()
            .slice(0, 16);
          let answer;
          const v = await confirmDialog({
            title: `Drain ${node}`,
            text: 'No new GPU lands on this node. With a deadline, every lease on it gets a reclaim notice ending then; a grant not yet started is released now.',
            fields: [
              {
                name: 'deadline',
                label: 'Deadline (your time; empty: none)',
                type: 'datetime-local',
                value: local
              },
              {
                name: 'action',
                label: 'At the deadline',
                type: 'select',
                options: [
                  ['stop', 'stop the servers'],
                  ['release-gpu', 'restart them without a GPU']
                ]
              }
            ],
            ok: 'Drain',
            check: async f => {
              const body = { action: f.action };
              if (f.deadline) body.deadline = new Date(f.deadline).toISOString();
              answer = await api('POST', `nodes/${encodeURIComponent(node)}/drain`, body);
            }
          });
          if (!v) return;
          status(
            `Drain: ${node} is draining; ${plural(answer.noticed, 'lease')} got a notice, ${plural(answer.released, 'grant')} released.`
          );
          setTimeout(() => location.reload(), 600);
          return;
        }
        case 'simulated-fault': {
          // the demo's simulated GPUs only
          const lost = b.dataset.lost === 'true';
          const v = await confirmDialog({
            title: `${b.textContent} (${b.dataset.node})`,
            text: lost
              ? 'The simulated GPU falls off the bus: NVML answers GPU_IS_LOST, the pool marks it unhealthy and raises an alert.'
              : 'The simulated GPU answers NVML again.',
            ok: b.textContent
          });
          if (!v) return;
          return act(b.textContent, () =>
            api(
              'POST',
              `nodes/${encodeURIComponent(b.dataset.node)}/gpus/${encodeURIComponent(b.dataset.gpu)}/simulated-fault`,
              { lost }
            )
          );
        }
        case 'repartition':
          return repartition(b);
        case 'cancel-repartition': {
          const v = await confirmDialog({
            title: `Cancel re-partition #${b.dataset.id}`,
            ok: 'Cancel it'
          });
          if (!v) return;
          return act('Cancel', () =>
            api('DELETE', `repartitions/${encodeURIComponent(b.dataset.id)}`)
          );
        }
        case 'edit-quota':
          return editQuota(b.dataset.kind, b.dataset.name);
      }
    });
  }

  // -- MIG re-partition --------------------------------------------------------------------

  const parseLayout = text =>
    text
      .split(/[\s,]+/)
      .filter(Boolean)
      .map(item => {
        const [profile, start] = item.split('@');
        return { profile, start: start === undefined ? null : Number(start) };
      });

  function planView(plan) {
    const held = h =>
      `${h.profile ? `${h.profile}@${h.start}` : 'the whole GPU'}${h.user ? ` (${h.user})` : ''}`;
    const list = (title, items, fmt) =>
      el(
        'div',
        { class: 'plan-part' },
        el('strong', { text: `${title}: ` }),
        items.length ? items.map(fmt).join(', ') : 'nothing'
      );
    return el(
      'div',
      { class: 'plan', id: 'repartition-plan' },
      list('Goes', plan.go, held),
      list('Comes', plan.come, c => `${c.profile}@${c.start}`),
      list('Stays', plan.keep, held),
      list('In the way', plan.in_way, held),
      el('p', {
        text: plan.ready
          ? 'Nothing is in the way: it runs at once.'
          : 'It waits (the GPU takes nothing new) until the leases in the way end.'
      }),
      el('p', {
        class: 'muted',
        text:
          plan.method === 'agent'
            ? "The node's agent applies it (dynamic MIG)."
            : "The node's nvidia.com/mig.config label applies it."
      })
    );
  }

  async function repartition(b) {
    const { node, gpu, model } = b.dataset;
    const current = JSON.parse(b.dataset.layout || '[]');
    const profiles =
      JSON.parse(document.getElementById('mig-profiles')?.textContent || '{}')[model] || [];
    const hint = el('p', {
      class: 'muted',
      text: `Profiles on ${model}: ${profiles.map(p => `${p.name} (starts ${p.starts.join(',')})`).join('; ')}`
    });
    const preview = el('div', { id: 'repartition-preview', 'aria-live': 'polite' });
    const previewButton = el('button', {
      type: 'button',
      id: 'repartition-preview-button',
      text: 'Preview the plan'
    });
    const extra = el('div', {}, hint, previewButton, preview);
    const layoutOf = () =>
      parseLayout(document.querySelector('#gpupool-confirm-fields [name="layout"]').value);
    previewButton.addEventListener('click', async () => {
      try {
        const plan = await api('POST', `nodes/${encodeURIComponent(node)}/repartitions`, {
          gpu,
          layout: layoutOf(),
          dry_run: true
        });
        preview.replaceChildren(planView(plan));
      } catch (e) {
        preview.replaceChildren(
          el('p', {
            class: 'error',
            role: 'alert',
            text: e.field ? `${e.field}: ${e.message}` : e.message
          })
        );
      }
    });
    let rep;
    const v = await confirmDialog({
      title: `Re-partition GPU ${gpu}`,
      text: 'The new MIG layout, as profile@start items. Preview the plan first.',
      fields: [
        {
          name: 'layout',
          label: 'Layout',
          value: current.map(i => `${i.profile}@${i.start}`).join(', ')
        },
        {
          name: 'notice',
          label: 'Give the leases in the way a notice of (minutes; empty: wait for them)',
          type: 'number',
          value: ''
        }
      ],
      extra,
      ok: 'Re-partition',
      check: async f => {
        const body = { gpu, layout: layoutOf() };
        if (f.notice !== '') body.notice_seconds = (parseFloat(f.notice) || 0) * 60;
        rep = await api('POST', `nodes/${encodeURIComponent(node)}/repartitions`, body);
      }
    });
    if (!v) return;
    status(`Re-partition #${rep.id}: ${rep.state}.`);
    setTimeout(() => location.reload(), 600);
  }

  // -- quotas ------------------------------------------------------------------------------

  /* The edit form round-trips every field of the quota it edits: "Edit" loads the quota as the
   * API answers it (GET), the form shows the fields it has inputs for, and "Save" sends the
   * loaded quota's every field with the inputs' values over them. A field the form has no
   * input for (one added later) is sent back as it was, never dropped; only what the API
   * answers and does not take (QUOTA_READ_ONLY) stays out of the PUT. */
  const QUOTA_READ_ONLY = new Set(['name', 'kind', 'source']);
  const QUOTA_INPUTS = [
    'guarantee',
    'limit',
    'budget',
    'period',
    'exception',
    'budget_action',
    'budget_minimum'
  ];
  let quotaLoaded = null; // {kind, name, quota}: what "Edit" loaded

  function setQuotaInputs(form, quota) {
    for (const k of QUOTA_INPUTS) {
      const input = form.elements[k];
      if (!input) continue;
      const value = quota[k] === null || quota[k] === undefined ? '' : String(quota[k]);
      if (input.tagName === 'SELECT' && value && ![...input.options].some(o => o.value === value)) {
        input.append(el('option', { text: value })); // a period the form does not list: kept
      }
      input.value = value;
    }
  }

  async function editQuota(kind, name) {
    const form = document.getElementById('quota-form');
    const quota = await api(
      'GET',
      `quotas/${encodeURIComponent(kind)}/${encodeURIComponent(name)}`
    );
    form.elements.kind.value = kind;
    form.elements.name.value = name;
    setQuotaInputs(form, quota);
    quotaLoaded = { kind, name, quota };
    document.getElementById('quota-form-title').textContent = visible(`Edit the quota of ${name}`);
    form.dataset.loaded = `${kind}/${name}`; // the form is ready (tests wait on it)
    form.elements.guarantee.focus();
  }

  function quotaForm() {
    const form = document.getElementById('quota-form');
    if (!form) return;
    const effect = document.getElementById('quota-effect');
    const error = document.getElementById('quota-error');
    const body = () => {
      const num = name =>
        form.elements[name].value === '' ? null : Number(form.elements[name].value);
      const same =
        quotaLoaded &&
        quotaLoaded.kind === form.elements.kind.value &&
        quotaLoaded.name === form.elements.name.value;
      const out = {};
      if (same) {
        for (const [k, v] of Object.entries(quotaLoaded.quota))
          if (!QUOTA_READ_ONLY.has(k)) out[k] = v;
      }
      return {
        ...out,
        guarantee: num('guarantee') ?? 0,
        limit: num('limit'),
        budget: num('budget'),
        period: form.elements.period.value,
        exception: num('exception'),
        budget_action: form.elements.budget_action.value,
        budget_minimum: num('budget_minimum') ?? 0
      };
    };
    const where = () =>
      `quotas/${encodeURIComponent(form.elements.kind.value)}/${encodeURIComponent(form.elements.name.value)}`;
    const fail = e => {
      error.hidden = false;
      const field = (e.field || '').split('.').pop();
      error.textContent = visible(e.field ? `${field}: ${e.message}` : e.message);
      for (const input of form.elements) input.removeAttribute('aria-invalid');
      if (form.elements[field]) {
        form.elements[field].setAttribute('aria-invalid', 'true');
        form.elements[field].setAttribute('aria-describedby', 'quota-error');
        form.elements[field].focus();
      }
    };
    const check = () => {
      error.hidden = true;
      if (!form.elements.name.value)
        throw new ApiError(422, {
          error: { message: 'a user or group name is required', field: 'name' }
        });
    };
    document.getElementById('quota-preview').addEventListener('click', async () => {
      try {
        check();
        const e = await api('POST', `${where()}/preview`, body());
        const parts = [];
        parts.push(`${e.become_borrowed.length} lease(s) would become borrowed`);
        parts.push(`${e.become_within.length} would become within guarantee`);
        if (e.over_limit_by)
          parts.push(
            `${units(e.over_limit_by)} held over the new limit (nothing is taken away; new requests wait)`
          );
        effect.textContent = visible(
          `Effect: ${parts.join('; ')}. ${form.elements.name.value} holds ${units(e.held)} now.`
        );
      } catch (err) {
        fail(err);
      }
    });
    form.addEventListener('submit', async event => {
      event.preventDefault();
      try {
        check();
        await api('PUT', where(), body());
        status(`Saved the quota of ${form.elements.name.value}.`);
        setTimeout(() => location.reload(), 300);
      } catch (err) {
        fail(err);
      }
    });
  }

  // -- the pool map ------------------------------------------------------------------------

  const BUSY = 5; // % utilization above which a held slice reads busy

  function sliceState(gpu, node, lease, inst, util) {
    if (inst && inst.state === 'outside') return 'off';
    if (inst && inst.state !== 'present' && !lease) return 'planned';
    if (!lease)
      return gpu.cordoned || !gpu.healthy || node.cordoned || node.draining || node.unreachable
        ? 'off'
        : 'free';
    if (lease.notice) return 'reclaiming';
    if (lease.idle_s > 0 && !(util > BUSY)) return 'idle';
    return 'busy';
  }

  const clip = (text, n = 160) => (text && text.length > n ? `${text.slice(0, n)}…` : text);

  function describeSlice(s) {
    const parts = [`${s.node} · GPU ${s.gpu.index} · ${s.gpu.model}`, s.label];
    if (s.lease) {
      const l = s.lease;
      parts.push(
        `held by ${clip(l.user)}${l.server ? ` (${clip(l.server)})` : ''}`,
        `offer ${clip(s.offers[l.offer] || l.offer)}`
      );
      parts.push(
        `since ${l.since ? new Date(l.since * 1000).toISOString().replace('T', ' ').slice(0, 16) + ' UTC' : '?'}`
      );
      parts.push(l.idle_s > 0 ? `idle ${dur(l.idle_s)}` : 'not idle');
      if (l.borrowed) parts.push('borrowed');
      if (l.notice) parts.push(`${l.notice.kind} notice until ${l.notice.deadline}`);
    } else {
      parts.push(
        s.outside
          ? `held outside the pool${s.by && s.by.length ? ` by ${s.by.join(', ')}` : ''}`
          : s.state === 'planned'
            ? 'planned'
            : s.state === 'off'
              ? 'cordoned'
              : 'free'
      );
    }
    if (s.util !== null && s.util !== undefined) parts.push(`${Math.round(s.util)} % busy`);
    return parts.join(' · ');
  }

  function slicesOf(gpu, node, leases, util) {
    const out = [];
    const holder = id => (id ? leases[id] : null);
    const gpuUtil = util[gpu.uuid];
    if (gpu.mig_enabled) {
      const total = gpu.memory_slices || 8;
      let at = 0;
      for (const inst of [...gpu.instances].sort((a, b) => a.start - b.start)) {
        if (inst.start > at)
          out.push({
            key: `free${at}`,
            width: (inst.start - at) / total,
            label: `free memory slices ${at}–${inst.start - 1}`,
            free: true
          });
        const lease = holder(inst.lease);
        out.push({
          key: `${inst.profile}@${inst.start}`,
          width: inst.slices / total,
          label: `${inst.profile} at slice ${inst.start}`,
          lease,
          inst,
          util: util[`${gpu.uuid}/${inst.start}`],
          outside: inst.state === 'outside',
          by: gpu.outside_by
        });
        at = Math.max(at, inst.start + inst.slices);
      }
      if (at < total)
        out.push({
          key: `free${at}`,
          width: (total - at) / total,
          label: `free memory slices ${at}–${total - 1}`,
          free: true
        });
    } else {
      const shares = gpu.holders.filter(h => h.kind === 'shared');
      const whole = gpu.holders.find(h => h.kind !== 'shared');
      if (whole)
        out.push({
          key: 'whole',
          width: 1,
          label: 'whole GPU',
          lease: holder(whole.lease),
          util: gpuUtil
        });
      else {
        let used = 0;
        for (const h of shares) {
          out.push({
            key: `share-${h.lease}`,
            width: h.milli / 1000,
            label: `${h.milli / 10} % share`,
            lease: holder(h.lease),
            util: gpuUtil
          });
          used += h.milli;
        }
        if (used < 1000)
          out.push({
            key: 'rest',
            width: (1000 - used) / 1000,
            label: shares.length ? 'free share' : 'whole GPU, free',
            util: gpuUtil,
            free: true,
            outside: !!gpu.outside,
            by: gpu.outside_by
          });
      }
    }
    for (const s of out) {
      s.state = s.free
        ? s.outside ||
          gpu.cordoned ||
          !gpu.healthy ||
          node.cordoned ||
          node.draining ||
          node.unreachable
          ? 'off'
          : 'free'
        : sliceState(gpu, node, s.lease, s.inst, s.util);
    }
    return out;
  }

  class PoolMap {
    constructor(root) {
      this.root = root;
      this.form = document.getElementById('map-filters');
      this.summary = document.getElementById('map-summary');
      this.detail = document.getElementById('map-detail');
      this.data = null;
      this.signature = '';
      this.cells = new Map();
      this.form.addEventListener('change', () => this.render(true));
      root.addEventListener('keydown', e => this.key(e));
      root.addEventListener('focusin', e => this.show(e.target));
      root.addEventListener('mouseover', e => this.show(e.target));
    }

    async refresh() {
      const t0 = performance.now();
      this.data = await api('GET', 'pool/map');
      for (const [id, l] of Object.entries(this.data.leases)) {
        l.id = id;
        l.idle_s = l.idle_since ? Math.max(0, this.data.now - l.idle_since) : 0;
      }
      const t1 = performance.now();
      this.render(false);
      this.lastRenderMs = performance.now() - t1;
      this.lastRefreshMs = performance.now() - t0;
      if (!this.rendered) {
        this.rendered = true;
        performance.mark('gpupool:map-rendered'); // the benchmark reads it
      }
      document.body.dataset.mapRefreshed = String(Date.now());
    }

    filters() {
      const f = new FormData(this.form);
      return {
        cluster: f.get('cluster'),
        model: f.get('model'),
        offer: f.get('offer'),
        state: f.get('state')
      };
    }

    fillSelect(name, values) {
      const select = this.form.elements[name];
      const have = new Set([...select.options].map(o => o.value));
      for (const v of [...values].sort())
        if (!have.has(v))
          select.append(
            el('option', {
              value: v,
              text: clip(name === 'offer' ? this.data.offers[v] || v : v, 60)
            })
          );
    }

    render(force) {
      const d = this.data;
      if (!d) return;
      const f = this.filters();
      const models = new Set(),
        clusters = new Set();
      for (const c of d.clusters) {
        clusters.add(c.name);
        for (const n of c.nodes) for (const g of n.gpus) models.add(g.model);
      }
      this.fillSelect('cluster', clusters);
      this.fillSelect('model', models);
      this.fillSelect('offer', Object.keys(d.offers));
      const keep = s =>
        (!f.offer || (s.lease && s.lease.offer === f.offer)) &&
        (!f.state ||
          (f.state === 'held'
            ? !!s.lease
            : f.state === 'cordoned'
              ? s.state === 'off'
              : s.state === f.state || (f.state === 'idle' && s.state === 'idle')));
      // the structure: which GPUs and slices are drawn; unchanged, the cells are updated in place
      const shown = [];
      const sig = [];
      for (const c of d.clusters) {
        if (f.cluster && c.name !== f.cluster) continue;
        for (const n of c.nodes) {
          for (const g of n.gpus) {
            if (f.model && g.model !== f.model) continue;
            const slices = slicesOf(g, n, d.leases, d.util);
            if ((f.offer || f.state) && !slices.some(keep)) continue;
            shown.push({ cluster: c, node: n, gpu: g, slices });
            sig.push(g.uuid, ...slices.map(s => s.key));
          }
        }
      }
      const signature = sig.join('|') + JSON.stringify(f);
      if (force || signature !== this.signature) this.build(shown, keep);
      else this.update(shown, keep);
      this.signature = signature;
      const counts = { free: 0, busy: 0, idle: 0, reclaiming: 0, planned: 0, off: 0 };
      let gpus = 0;
      for (const s of shown) {
        gpus += 1;
        for (const x of s.slices) counts[x.state] += 1;
      }
      this.summary.textContent = `${gpus} GPUs shown · ${counts.busy} slices busy, ${counts.idle} idle, ${counts.reclaiming} under notice, ${counts.free} free, ${counts.planned} planned, ${counts.off} cordoned · ${d.queue_length} waiting`;
    }

    build(shown, keep) {
      const frag = document.createDocumentFragment();
      this.cells = new Map();
      let cluster = null,
        node = null,
        nodeList = null,
        clusterList = null;
      let first = true;
      for (const { cluster: c, node: n, gpu: g, slices } of shown) {
        if (c !== cluster) {
          cluster = c;
          clusterList = el('ul', { role: 'group' });
          frag.append(
            el(
              'section',
              {
                class: 'cluster',
                role: 'treeitem',
                'aria-expanded': 'true',
                'aria-label': `cluster ${c.name}`
              },
              el('h3', { text: `Cluster ${c.name}` }),
              clusterList
            )
          );
        }
        if (n !== node) {
          node = n;
          nodeList = el('ul', { role: 'group', class: 'gpulist' });
          const flags = [
            n.cordoned && 'cordoned',
            n.draining && 'draining',
            n.unreachable && 'unreachable'
          ]
            .filter(Boolean)
            .join(', ');
          clusterList.append(
            el(
              'li',
              {
                class: 'node',
                role: 'treeitem',
                'aria-expanded': 'true',
                'aria-label': `node ${n.name}`
              },
              el('h4', { text: n.name + (flags ? ` (${flags})` : '') }),
              nodeList
            )
          );
        }
        const row = el('div', { class: 'slices' });
        for (const s of slices) {
          const cell = el('span', {
            class: `slice ${s.state}${keep(s) ? '' : ' dim'}`,
            role: 'treeitem',
            tabindex: first ? '0' : '-1',
            'data-gpu': g.uuid,
            'data-slice': s.key
          });
          first = false;
          cell.style.flexGrow = String(s.width);
          cell.textContent = s.inst ? s.inst.profile : '';
          if (s.inst) cell.classList.add('labelled'); // wide enough for its whole profile name
          s.node = n.name;
          s.gpu = g;
          s.offers = this.data.offers;
          cell.setAttribute('aria-label', visible(describeSlice(s)));
          this.cells.set(`${g.uuid}/${s.key}`, { cell, s });
          row.append(cell);
        }
        const label = el('span', {
          class: 'gpu-label',
          text: `GPU ${g.index} · ${g.model}${g.mig_enabled ? ' · MIG' : ''}${g.repartition ? ` · re-partition ${g.repartition.state}` : ''}`
        });
        nodeList.append(el('li', { class: 'gpu', role: 'none' }, label, row));
      }
      this.root.replaceChildren(frag);
    }

    update(shown, keep) {
      for (const { node: n, gpu: g, slices } of shown) {
        for (const s of slices) {
          const entry = this.cells.get(`${g.uuid}/${s.key}`);
          if (!entry) continue;
          s.node = n.name;
          s.gpu = g;
          s.offers = this.data.offers;
          const cls = `slice ${s.state}${keep(s) ? '' : ' dim'}`;
          if (entry.cell.className !== cls) entry.cell.className = cls;
          const label = visible(describeSlice(s));
          if (entry.cell.getAttribute('aria-label') !== label)
            entry.cell.setAttribute('aria-label', label);
          entry.s = s;
        }
      }
    }

    show(target) {
      const cell = target.closest && target.closest('.slice[role=treeitem]');
      if (!cell) return;
      this.detail.hidden = false;
      this.detail.textContent = cell.getAttribute('aria-label');
    }

    key(e) {
      const cells = [...this.root.querySelectorAll('.slice[role=treeitem]')];
      const i = cells.indexOf(document.activeElement);
      if (i < 0) return;
      let j = i;
      const gpuOf = c => c.dataset.gpu;
      if (e.key === 'ArrowRight') j = Math.min(cells.length - 1, i + 1);
      else if (e.key === 'ArrowLeft') j = Math.max(0, i - 1);
      else if (e.key === 'ArrowDown') {
        while (j < cells.length - 1 && gpuOf(cells[j]) === gpuOf(cells[i])) j += 1;
      } else if (e.key === 'ArrowUp') {
        while (j > 0 && gpuOf(cells[j]) === gpuOf(cells[i])) j -= 1;
        while (j > 0 && gpuOf(cells[j - 1]) === gpuOf(cells[j])) j -= 1;
      } else if (e.key === 'Home') j = 0;
      else if (e.key === 'End') j = cells.length - 1;
      else return;
      e.preventDefault();
      cells[i].tabIndex = -1;
      cells[j].tabIndex = 0;
      cells[j].focus();
    }
  }

  // -- charts ------------------------------------------------------------------------------

  function heatColor(v) {
    if (v === null || v === undefined) return '#eee';
    const t = Math.max(0, Math.min(1, v / 100));
    return `hsl(${210 - 210 * t}, 70%, ${92 - 45 * t}%)`;
  }

  async function poolCharts() {
    if (!window.Chart) return;
    const h = await api('GET', 'pool/history?hours=24&step=900');
    const labels = h.times.map(t => new Date(t * 1000).toISOString().slice(11, 16));
    const free = h.used.map(u => Math.max(0, h.capacity - u));
    new Chart(document.getElementById('units'), {
      type: 'line',
      data: {
        labels,
        datasets: [
          {
            label: 'used',
            data: h.used,
            borderColor: '#1a7f37',
            backgroundColor: '#1a7f3733',
            fill: true,
            pointRadius: 0
          },
          { label: 'free', data: free, borderColor: '#0b5cad', pointRadius: 0 },
          { label: 'queued', data: h.queued, borderColor: '#b42318', pointRadius: 0 }
        ]
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { y: { beginAtZero: true, title: { display: true, text: 'GPU units' } } }
      }
    });
    const gpus = Object.keys(h.heatmap).sort();
    const cells = [];
    gpus.forEach(g => h.heatmap[g].forEach((v, i) => cells.push({ x: i, y: g, v })));
    const canvas = document.getElementById('heatmap');
    canvas.parentNode.style.height = `${Math.min(600, 60 + 14 * Math.max(1, gpus.length))}px`;
    new Chart(canvas, {
      type: 'matrix',
      data: {
        datasets: [
          {
            label: 'utilization %',
            data: cells,
            backgroundColor: c => heatColor(c.raw && c.raw.v),
            width: ({ chart }) => (chart.chartArea || {}).width / Math.max(1, h.times.length) - 1,
            height: ({ chart }) => (chart.chartArea || {}).height / Math.max(1, gpus.length) - 1
          }
        ]
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        plugins: {
          legend: { display: false },
          tooltip: {
            callbacks: {
              title: i => i[0].raw.y,
              label: i => `${labels[i.raw.x]}: ${i.raw.v ?? 'no data'} %`
            }
          }
        },
        scales: {
          x: {
            type: 'linear',
            min: -0.5,
            max: h.times.length - 0.5,
            ticks: { stepSize: 8, callback: v => labels[v] || '' },
            grid: { display: false }
          },
          y: {
            type: 'category',
            labels: gpus,
            offset: true,
            ticks: { display: gpus.length <= 40 },
            grid: { display: false }
          }
        }
      }
    });
  }

  function userCharts() {
    if (!window.Chart) return;
    for (const canvas of document.querySelectorAll('canvas.sparkline')) {
      const values = JSON.parse(canvas.dataset.values || '[]');
      new Chart(canvas, {
        type: 'line',
        data: {
          labels: values.map((_, i) => i),
          datasets: [
            {
              data: values,
              borderColor: '#0b5cad',
              borderWidth: 1.5,
              pointRadius: 0,
              spanGaps: true
            }
          ]
        },
        options: {
          animation: false,
          responsive: false,
          plugins: { legend: { display: false }, tooltip: { enabled: false } },
          scales: { x: { display: false }, y: { display: false, min: 0, max: 100 } }
        }
      });
    }
    const history = document.getElementById('gpupool-history');
    if (history) {
      const days = JSON.parse(history.dataset.history || '[]');
      new Chart(history, {
        type: 'bar',
        data: {
          labels: days.map(d => d.day.slice(5)),
          datasets: [
            { label: 'held GPU-hours', data: days.map(d => d.held), backgroundColor: '#9ec5ee' },
            { label: 'busy GPU-hours', data: days.map(d => d.busy), backgroundColor: '#1a7f37' }
          ]
        },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          scales: { y: { beginAtZero: true } }
        }
      });
    }
  }

  // -- start -------------------------------------------------------------------------------

  document.addEventListener('DOMContentLoaded', () => {
    document.querySelectorAll('table.sortable').forEach(sortable);
    leaseActions();
    quotaForm();
    const page = document.body.dataset.page;
    if (page === 'admin_map') {
      const map = new PoolMap(document.getElementById('pool-map'));
      window.gpupoolMap = map; // the benchmark and the tests read its timings
      const tick = async () => {
        try {
          if (map.form.elements.live.checked || !map.data) await map.refresh();
        } catch (e) {
          status(`Refresh failed: ${e.message}`, true);
        }
        setTimeout(tick, Number(document.body.dataset.refreshMs || 5000));
      };
      tick();
      poolCharts().catch(e => status(`Charts: ${e.message}`, true));
    }
    if (page === 'user') userCharts();
  });
})();
