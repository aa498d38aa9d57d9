/* The admin panel's pool map: every node, GPU and slice drawn from ``pool/map`` as text and
 * attributes (never markup), refreshed live, with keyboard navigation between slices.
 */
'use strict';

(function () {
  const { api, dur, el, visible, status } = window.gpupool;

  // -- the pool map ------------------------------------------------------------------------

  const BUSY = 5; // % utilization above which a held slice reads busy

  function sliceState(gpu, node, lease, inst, util) {
    if (inst && inst.state === 'outside') return 'off';
    if (inst && inst.state !== 'present' && !lease) return 'planned';
    if (!lease)
      return gpu.cordoned || !gpu.healthy || node.cordoned || node.draining || node.unreachable
        ? 'off'
        : 'free';
    if (lease.notice || lease.preempting) return 'reclaiming'; // a job's notice is one too
    if (lease.idle_s > 0 && !(util > BUSY)) return 'idle';
    return 'busy';
  }

  const clip = (text, n = 160) => (text && text.length > n ? `${text.slice(0, n)}…` : text);

  /** Who holds a lease, as the map says it: a job by its name and class ("job resnet
   * (training) of alice"), a GPU kernel by its kernel ("GPU kernel 4efa711c of alice"), a
   * server by its user and server, with its class. */
  const holderText = l => {
    if (l.job) {
      return `job ${clip(l.job)} (${l.class}) of ${clip(l.user)}`;
    }
    if (l.server && l.server.startsWith('kernel:')) {
      return `GPU kernel ${l.server.slice(7, 15)} of ${clip(l.user)}`;
    }
    return `${clip(l.user)}${l.server ? ` (${clip(l.server)})` : ''}, ${l.class || 'interactive'}`;
  };

  /** The class a slice's cell shows (job leases only: a server is the usual holder). */
  const workloadClass = s => (s.lease && s.lease.job ? `wl-${s.lease.class}` : '');

  /** An ISO time as people read it on this page (to the second: a grace is minutes). */
  const utcText = iso =>
    iso ? `${new Date(iso).toISOString().replace('T', ' ').slice(0, 19)} UTC` : '?';

  /** A job's preemption notice (a waiter's, the headroom's refill): its runner kills it at
   * the deadline, when its class's grace ends. No lease notice: the lease's ``notice`` is
   * null unless the job follows one (then that one is said). */
  const preemptingText = p =>
    `preemption notice: killed at ${utcText(p.deadline)}${p.reason ? ` (${clip(p.reason)})` : ''}`;

  function describeSlice(s) {
    const parts = [`${s.node} · GPU ${s.gpu.index} · ${s.gpu.model}`, s.label];
    if (s.held) parts.push(`node ${s.held}`); // heard on every slice, not only in the heading
    if (s.lease) {
      const l = s.lease;
      parts.push(`held by ${holderText(l)}`, `offer ${clip(s.offers[l.offer] || l.offer)}`);
      parts.push(
        `since ${l.since ? new Date(l.since * 1000).toISOString().replace('T', ' ').slice(0, 16) + ' UTC' : '?'}`
      );
      parts.push(l.idle_s > 0 ? `idle ${dur(l.idle_s)}` : 'not idle');
      if (l.borrowed) parts.push('borrowed');
      if (l.notice) parts.push(`${l.notice.kind} notice until ${utcText(l.notice.deadline)}`);
      else if (l.preempting) parts.push(preemptingText(l.preempting));
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

  const units = x => String(Number(x.toFixed(2)));

  // the headroom (borrowing.keep_free): per model the free units counted against what is kept,
  // what the refill still misses, and which node is held for which long waiter (by its user
  // and offer as the queue names them, so the admin finds the request there)
  const heldFor = (x, offers) => `held for ${clip(x.user)}'s ${clip(offers[x.offer] || x.offer)}`;

  function headroomText(h, now, offers) {
    if (!h) return '';
    const parts = [`Headroom: ${h.keep_free}`];
    for (const m of h.models) {
      if (!m.keep_free) continue;
      let text = `${m.model} ${units(m.free_units)} free of ${m.keep_free} kept`;
      if (m.short_units > 0) text += `, ${units(m.short_units)} missing (refill notices out)`;
      parts.push(text);
    }
    for (const x of h.held) {
      const waited = Math.max(0, now - Date.parse(x.waiting_since) / 1000);
      let text = `node ${x.node} ${heldFor(x, offers)} (waiting ${dur(waited)})`;
      if (x.out_of_count) text += ', its free GPUs out of the count';
      parts.push(text);
    }
    if (!h.held.length) parts.push('no node held');
    return visible(parts.join(' · '));
  }

  // node name → what it is held for (shown by the node's name, in its label and its slices')
  const heldBy = (h, offers) => new Map((h ? h.held : []).map(x => [x.node, heldFor(x, offers)]));

  class PoolMap {
    constructor(root) {
      this.root = root;
      this.form = document.getElementById('map-filters');
      this.summary = document.getElementById('map-summary');
      this.detail = document.getElementById('map-detail');
      this.headroom = document.getElementById('map-headroom');
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
      const held = heldBy(d.headroom, d.offers);
      const sig = [...held.entries()].flat();
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
      if (force || signature !== this.signature) this.build(shown, keep, held);
      else this.update(shown, keep, held);
      this.signature = signature;
      const counts = { free: 0, busy: 0, idle: 0, reclaiming: 0, planned: 0, off: 0 };
      let gpus = 0;
      for (const s of shown) {
        gpus += 1;
        for (const x of s.slices) counts[x.state] += 1;
      }
      const room = headroomText(d.headroom, d.now, d.offers);
      // set only when it changed: a live region re-announces every text it is given
      if (this.headroom && this.headroom.textContent !== room) this.headroom.textContent = room;
      this.summary.textContent = `${gpus} GPUs shown · ${counts.busy} slices busy, ${counts.idle} idle, ${counts.reclaiming} under notice, ${counts.free} free, ${counts.planned} planned, ${counts.off} cordoned · ${d.queue_length} waiting`;
    }

    build(shown, keep, held) {
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
            n.unreachable && 'unreachable',
            held.get(n.name)
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
                'aria-label': `node ${n.name}${flags ? `, ${flags}` : ''}`
              },
              el('h4', { text: n.name + (flags ? ` (${flags})` : '') }),
              nodeList
            )
          );
        }
        const row = el('div', { class: 'slices' });
        for (const s of slices) {
          const cell = el('span', {
            class: `slice ${s.state}${keep(s) ? '' : ' dim'} ${workloadClass(s)}`.trim(),
            role: 'treeitem',
            tabindex: first ? '0' : '-1',
            'data-gpu': g.uuid,
            'data-slice': s.key
          });
          first = false;
          cell.style.flexGrow = String(s.width);
          // a MIG instance shows its profile; a whole GPU or share held by a job, the job
          cell.textContent = s.inst
            ? s.inst.profile
            : s.lease && s.lease.job
              ? `${clip(s.lease.job, 40)} · ${s.lease.class}`
              : '';
          if (s.inst) cell.classList.add('labelled'); // wide enough for its whole profile name
          s.node = n.name;
          s.held = held.get(n.name);
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

    update(shown, keep, held) {
      for (const { node: n, gpu: g, slices } of shown) {
        for (const s of slices) {
          const entry = this.cells.get(`${g.uuid}/${s.key}`);
          if (!entry) continue;
          s.node = n.name;
          s.held = held.get(n.name);
          s.gpu = g;
          s.offers = this.data.offers;
          const cls = `slice ${s.state}${keep(s) ? '' : ' dim'} ${workloadClass(s)}`.trim();
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

  document.addEventListener('DOMContentLoaded', () => {
    if (document.body.dataset.page !== 'admin_map') return;
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
  });
})();
