/* The admin panel's actions: the queue's and leases' buttons (release, reclaim, notices,
 * approvals), MIG re-partitions and the quota form. Each change is confirmed in a dialog and
 * sent as a REST API call with the hub's XSRF token (gpupool.js's ``api``).
 */
'use strict';

(function () {
  const { ApiError, act, api, confirmDialog, el, plural, units, visible, status } = window.gpupool;

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

  document.addEventListener('DOMContentLoaded', () => {
    leaseActions();
    quotaForm();
  });
})();
