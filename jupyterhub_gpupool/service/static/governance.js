/* The admin panel's governance pages: the usage and capacity charts (drawn from the rows the
 * page was rendered with, the API's figures), the CSV download and the what-if replay (REST API
 * calls carrying the hub's XSRF token). Plain browser JavaScript, no build step, loaded from
 * static/ on these pages only (the CSP allows no inline script). Every value from the pool is
 * set with textContent or drawn on a canvas, never parsed as HTML.
 */
'use strict';

(function () {
  // the API call (with the hub's XSRF token), elements and the status line: gpupool.js's
  const { request: call, el, status, visible } = window.gpupool;

  /** A name as a chart label: at most ``n`` characters (a 10 kB name stays one line). */
  const clip = (s, n = 40) => {
    s = s === '' ? '(none)' : visible(s); // chart labels too: canvas text obeys bidi controls
    return s.length > n ? `${s.slice(0, n - 1)}…` : s;
  };
  const data = (id, key) => {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.dataset[key] || 'null') : null;
  };
  const COLORS = [
    '#0b5cad',
    '#1a7f37',
    '#b42318',
    '#9a6700',
    '#6f42c1',
    '#0a7d8c',
    '#bf3989',
    '#57606a'
  ];
  const BASE = { animation: false, responsive: true, maintainAspectRatio: false };

  // -- usage and cost --------------------------------------------------------------------

  function usageCharts() {
    const rows = data('usage-data', 'usage') || [];
    const box = document.getElementById('usage-data');
    if (!window.Chart || !rows.length) return;
    const by = box.dataset.by;
    const labels = rows.map(r => clip(r[by]));
    new Chart(document.getElementById('usage-hours'), {
      type: 'bar',
      data: {
        labels,
        datasets: [
          {
            label: 'held unit-hours',
            data: rows.map(r => r.held_unit_hours),
            backgroundColor: '#9ec5ee'
          },
          {
            label: 'busy unit-hours',
            data: rows.map(r => r.busy_unit_hours),
            backgroundColor: '#1a7f37'
          }
        ]
      },
      options: {
        ...BASE,
        scales: { y: { beginAtZero: true, title: { display: true, text: 'GPU unit-hours' } } }
      }
    });
    new Chart(document.getElementById('usage-cost'), {
      type: 'bar',
      data: {
        labels,
        datasets: [
          {
            label: `cost (${box.dataset.currency})`,
            data: rows.map(r => Number(r.cost)),
            backgroundColor: '#0b5cad'
          }
        ]
      },
      options: {
        ...BASE,
        scales: { y: { beginAtZero: true, title: { display: true, text: box.dataset.currency } } }
      }
    });
  }

  /** The CSV is the API's (GET usage?format=csv): fetched with the XSRF token, then saved. */
  function csvDownload() {
    const link = document.getElementById('usage-csv');
    if (!link) return;
    link.addEventListener('click', async event => {
      event.preventDefault();
      try {
        const path = link.getAttribute('href').slice(link.getAttribute('href').indexOf('usage?'));
        const r = await call('GET', path, undefined, 'text/csv');
        const url = URL.createObjectURL(await r.blob());
        const save = el('a', { href: url, download: link.getAttribute('download') });
        document.body.append(save);
        save.click();
        save.remove();
        setTimeout(() => URL.revokeObjectURL(url), 60_000);
        status('');
      } catch (e) {
        status(`CSV download failed: ${e.field ? `${e.field}: ` : ''}${e.message}`, true);
      }
    });
  }

  // -- capacity ----------------------------------------------------------------------------

  function capacityCharts() {
    const rows = data('capacity-data', 'capacity') || [];
    if (!window.Chart || !rows.length) return;
    const days = [...new Set(rows.map(r => r.day))].sort();
    const offers = [...new Set(rows.map(r => r.offer))].sort();
    const at = new Map(rows.map(r => [`${r.offer}|${r.day}`, r]));
    const series = (offer, key) => days.map(d => (at.get(`${offer}|${d}`) || {})[key] ?? null);
    const color = i => COLORS[i % COLORS.length];
    const x = { ticks: { maxRotation: 0, autoSkip: true } };
    const labels = days.map(d => d.slice(5));
    new Chart(document.getElementById('capacity-demand'), {
      type: 'bar',
      data: {
        labels,
        datasets: offers.map((o, i) => ({
          label: clip(o),
          data: series(o, 'demand_unit_hours'),
          backgroundColor: color(i)
        }))
      },
      options: {
        ...BASE,
        plugins: { title: { display: true, text: 'Demand (unit-hours held + waited)' } },
        scales: { x: { ...x, stacked: true }, y: { stacked: true, beginAtZero: true } }
      }
    });
    const waits = [];
    offers.forEach((o, i) => {
      waits.push({
        label: `${clip(o)} p50`,
        data: series(o, 'wait_p50_min'),
        borderColor: color(i),
        backgroundColor: color(i),
        spanGaps: true
      });
      waits.push({
        label: `${clip(o)} p95`,
        data: series(o, 'wait_p95_min'),
        borderColor: color(i),
        backgroundColor: color(i),
        borderDash: [6, 4],
        spanGaps: true
      });
    });
    new Chart(document.getElementById('capacity-waits'), {
      type: 'line',
      data: { labels, datasets: waits },
      options: {
        ...BASE,
        plugins: { title: { display: true, text: 'Queue wait (minutes)' } },
        scales: { x, y: { beginAtZero: true } }
      }
    });
    new Chart(document.getElementById('capacity-idle'), {
      type: 'line',
      data: {
        labels,
        datasets: offers.map((o, i) => ({
          label: clip(o),
          data: series(o, 'idle_share').map(v => (v === null ? null : Math.round(v * 1000) / 10)),
          borderColor: color(i),
          backgroundColor: color(i),
          spanGaps: true
        }))
      },
      options: {
        ...BASE,
        plugins: { title: { display: true, text: 'Idle share of held time (%)' } },
        scales: { x, y: { min: 0, max: 100 } }
      }
    });
    const sum = key => days.map(d => rows.filter(r => r.day === d).reduce((a, r) => a + r[key], 0));
    new Chart(document.getElementById('capacity-queued'), {
      type: 'bar',
      data: {
        labels,
        datasets: [
          { label: 'waited for quota', data: sum('queued_for_quota'), backgroundColor: '#9a6700' },
          {
            label: 'waited for capacity',
            data: sum('queued_for_capacity'),
            backgroundColor: '#b42318'
          }
        ]
      },
      options: {
        ...BASE,
        plugins: { title: { display: true, text: 'Requests that waited' } },
        scales: {
          x: { ...x, stacked: true },
          y: { stacked: true, beginAtZero: true, ticks: { precision: 0 } }
        }
      }
    });
  }

  // -- what-if -----------------------------------------------------------------------------

  class FormError extends Error {
    constructor(field, message) {
      super(message);
      this.field = field;
    }
  }

  /** The form as the API's body; a line the API could not even receive is a FormError. */
  function whatIfBody(form) {
    const raw = form.elements.days.value.trim();
    const body = {
      [form.elements.unit.value === 'hours' ? 'hours' : 'days']:
        raw === '' || Number.isNaN(Number(raw)) ? raw : Number(raw)
    };
    const add = {};
    for (const row of form.querySelectorAll('.add-row')) {
      const model = row.querySelector('[name="add-model"]').value.trim();
      if (!model) continue;
      const countRaw = row.querySelector('[name="add-count"]').value.trim();
      const count = Number(countRaw);
      add[model] =
        Number.isInteger(count) && Number.isInteger(add[model] ?? 0)
          ? (add[model] || 0) + count
          : countRaw;
    }
    if (Object.keys(add).length) body.add = add;
    const remove = [...form.querySelectorAll('[name="remove"]:checked')].map(c => c.value);
    if (remove.length) body.remove = remove;
    const layouts = {};
    for (const line of form.elements.mig_layout.value
      .split('\n')
      .map(l => l.trim())
      .filter(Boolean)) {
      const at = line.indexOf('=');
      if (at <= 0 || at === line.length - 1)
        throw new FormError(
          'mig_layout',
          `wants NODE=PROFILE,… or NODE=dynamic, got ${JSON.stringify(line)}`
        );
      const layout = line.slice(at + 1).trim();
      layouts[line.slice(0, at).trim()] =
        layout === 'dynamic'
          ? 'dynamic'
          : layout
              .split(',')
              .map(p => p.trim())
              .filter(Boolean);
    }
    if (Object.keys(layouts).length) body.mig_layout = layouts;
    const policy = form.elements.reclaim.value.trim();
    if (policy) {
      try {
        body.reclaim = JSON.parse(policy);
      } catch (e) {
        throw new FormError('reclaim', `not JSON (${e.message})`);
      }
    }
    const until = form.elements.until.value;
    if (until) body.until = new Date(until).toISOString();
    return body;
  }

  /** The control (or fieldset) a field of the API's error is about: ``reclaim.default.x``
   * and ``add`` name a control of the form by their first part. */
  function fieldOf(form, field) {
    const first = String(field || '').split(/[.[]/)[0];
    const name = first === 'hours' ? 'days' : first; // one input holds days or hours
    if (!name) return null;
    return {
      name,
      control:
        form.elements[name] && !(form.elements[name] instanceof RadioNodeList)
          ? form.elements[name]
          : document.getElementById(`whatif-${name}`),
      line: document.getElementById(`whatif-error-${name}`)
    };
  }

  function clearErrors(form) {
    for (const p of form.querySelectorAll('.field-error')) {
      p.hidden = true;
      p.textContent = '';
    }
    for (const c of form.querySelectorAll('[aria-invalid="true"]'))
      c.removeAttribute('aria-invalid');
    const general = document.getElementById('whatif-error');
    general.hidden = true;
    general.textContent = '';
  }

  function showError(form, e) {
    const where = e.field ? fieldOf(form, e.field) : null;
    const text = e.field ? `${e.field}: ${e.message}` : e.message;
    if (where && where.line) {
      where.line.hidden = false;
      where.line.textContent = visible(text);
      if (where.control) {
        where.control.setAttribute('aria-invalid', 'true');
        where.control.focus?.();
      }
      return;
    }
    const general = document.getElementById('whatif-error');
    general.hidden = false;
    general.textContent = visible(text);
  }

  const minutes = v => (v === null || v === undefined ? '–' : String(v));
  const pct = v => `${Math.round((v || 0) * 100)} %`;
  let waitChart = null;

  function showResult(result) {
    const names = data('whatif-data', 'offers') || {};
    const name = o => (o === '*' ? 'all offers' : names[o] || o);
    document.getElementById('whatif-title').textContent = visible(
      `Over ${result.days === null ? `${result.hours} hour${result.hours === 1 ? '' : 's'}` : `${result.days} day${result.days === 1 ? '' : 's'}`} (${result.from.slice(0, 16).replace('T', ' ')} to ${result.to.slice(0, 16).replace('T', ' ')} UTC): ${result.change}`
    );
    const body = document.querySelector('#whatif-table tbody');
    const offers = Object.keys(result.offers).sort(
      (a, b) => (a === '*') - (b === '*') || a.localeCompare(b)
    );
    body.replaceChildren(
      ...offers.map(o => {
        const a = result.offers[o].recorded || {};
        const b = result.offers[o].what_if || {};
        const cell = (text, cls) => el('td', { class: cls, text });
        const changed = (x, y) => (x !== y ? 'changed' : '');
        return el(
          'tr',
          { 'data-offer': o, class: o === '*' ? 'all' : '' },
          el('td', { class: 'name', dir: 'auto', text: clip(name(o), 80) }),
          cell(String(a.requests ?? b.requests ?? 0)),
          cell(minutes(a.wait_p50_min), 'p50 recorded'),
          cell(minutes(b.wait_p50_min), `p50 what-if ${changed(a.wait_p50_min, b.wait_p50_min)}`),
          cell(minutes(a.wait_p95_min), 'p95 recorded'),
          cell(minutes(b.wait_p95_min), `p95 what-if ${changed(a.wait_p95_min, b.wait_p95_min)}`),
          cell(String(a.unserved ?? 0), 'unserved recorded'),
          cell(String(b.unserved ?? 0), `unserved what-if ${changed(a.unserved, b.unserved)}`),
          cell(String(a.held_unit_hours ?? 0), 'held recorded'),
          cell(String(b.held_unit_hours ?? 0), 'held what-if'),
          cell(pct(a.idle_share), 'idle recorded'),
          cell(pct(b.idle_share), `idle what-if ${changed(a.idle_share, b.idle_share)}`)
        );
      })
    );
    document.getElementById('whatif-result').hidden = false;
    if (!window.Chart) return;
    if (waitChart) waitChart.destroy();
    const keys = offers.filter(o => o !== '*');
    const get = (side, key) => keys.map(o => (result.offers[o][side] || {})[key] ?? null);
    waitChart = new Chart(document.getElementById('whatif-waits'), {
      type: 'bar',
      data: {
        labels: keys.map(o => clip(name(o))),
        datasets: [
          {
            label: 'p50 recorded',
            data: get('recorded', 'wait_p50_min'),
            backgroundColor: '#9ec5ee'
          },
          {
            label: 'p50 what-if',
            data: get('what_if', 'wait_p50_min'),
            backgroundColor: '#0b5cad'
          },
          {
            label: 'p95 recorded',
            data: get('recorded', 'wait_p95_min'),
            backgroundColor: '#f2b8b5'
          },
          { label: 'p95 what-if', data: get('what_if', 'wait_p95_min'), backgroundColor: '#b42318' }
        ]
      },
      options: {
        ...BASE,
        plugins: { title: { display: true, text: 'Queue wait (minutes)' } },
        scales: { y: { beginAtZero: true } }
      }
    });
  }

  function whatIfForm() {
    const form = document.getElementById('whatif-form');
    if (!form) return;
    document.getElementById('whatif-add-row').addEventListener('click', () => {
      const rows = form.querySelector('.add-rows');
      const row = rows.querySelector('.add-row').cloneNode(true);
      row.querySelector('[name="add-model"]').value = '';
      row.querySelector('[name="add-count"]').value = '1';
      rows.append(row);
      row.querySelector('[name="add-model"]').focus();
    });
    form.addEventListener('submit', async event => {
      event.preventDefault();
      clearErrors(form);
      const button = document.getElementById('whatif-run');
      button.disabled = true;
      status('Replaying the recorded requests…');
      try {
        const body = whatIfBody(form);
        const r = await call('POST', 'capacity/what-if', body);
        showResult(await r.json());
        status('');
        document.body.dataset.whatifRuns = String(
          Number(document.body.dataset.whatifRuns || 0) + 1
        );
      } catch (e) {
        status('');
        showError(form, e);
      } finally {
        button.disabled = false;
      }
    });
  }

  document.addEventListener('DOMContentLoaded', () => {
    const page = document.body.dataset.page;
    try {
      if (page === 'admin_usage') {
        usageCharts();
        csvDownload();
      } else if (page === 'admin_capacity') capacityCharts();
      else if (page === 'admin_whatif') whatIfForm();
    } catch (e) {
      status(`Charts: ${e.message}`, true);
    }
  });
})();
