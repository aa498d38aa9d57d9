/**
 * The side panel: the lease, live charts, quota bars, the reclaim notice with its countdown
 * and Keep my GPU, the move choices, what the last reclaim saved, "GPU kernels" (kernels.ts)
 * and "My jobs" (jobs.ts).
 * Plain DOM, every control a real <button> or <input> with a label, so it is reachable by
 * keyboard and named for screen readers.
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Widget } from '@lumino/widgets';

import { renderChart, series } from './chart';
import {
  actionText,
  availabilityText,
  budgetWarning,
  countdown,
  doneText,
  durationText,
  formatMiB,
  formatUnits,
  fraction,
  keepState,
  secondsUntil,
  unitsText,
  viewState,
  visible
} from './format';
import { JobsView } from './jobs';
import { KernelsView } from './kernels';
import { GPUPoolModel } from './model';
import { IState } from './types';
import { el, when } from './dom';

/** How often the panel asks for the user's jobs and GPU kernels while it shows. */
const JOBS_REFRESH_MS = 10000;

/** What a reclaim cannot save: edits that live only in a browser tab already closed. */
export const UNSAVEABLE =
  'Open documents in every open JupyterLab tab are saved first; edits in a tab you already ' +
  'closed without saving lived only in that browser and cannot be saved.';

export class GPUPoolPanel extends Widget {
  private body = el('div', 'jp-GPUPool-body');
  private live = el('p', 'jp-GPUPool-message');
  private ticker: number;
  private jobs: JobsView;
  private kernels: KernelsView;
  private jobsTimer: number;
  private chosen: string | null = null;

  constructor(private model: GPUPoolModel) {
    super();
    this.id = 'jp-gpupool-panel';
    this.addClass('jp-GPUPool-panel');
    this.title.caption = 'GPU pool: your GPU, quota and idle notices';
    this.live.setAttribute('role', 'status');
    this.live.setAttribute('aria-live', 'polite');
    const heading = el('h2', 'jp-GPUPool-heading', 'Your GPU');
    this.jobs = new JobsView((path, method, body) => model.request(path, method, body));
    this.kernels = new KernelsView(
      (path, method, body) => model.request(path, method, body),
      offer => model.state?.offers.find(o => o.name === offer)?.display_name || offer
    );
    this.node.append(heading, this.live, this.body, this.kernels.node, this.jobs.node);
    // `this` as the receiver: Widget.dispose's Signal.clearData(this) disconnects both, so a
    // disposed panel stops rendering the model (which outlives it)
    model.changed.connect(() => this.render(), this);
    model.message.connect((_, m) => {
      this.live.textContent = visible(m.text);
      this.live.classList.toggle('jp-GPUPool-error', m.error);
    }, this);
    this.ticker = window.setInterval(() => this.tick(), 1000);
    // the jobs are the pool's, not the server's shared state: asked while the panel shows
    this.jobsTimer = window.setInterval(() => {
      if (this.isVisible && !document.hidden && !this.jobs.node.hidden) {
        void this.jobs.refresh();
        void this.kernels.refresh();
      }
    }, JOBS_REFRESH_MS);
    // a kernel start waiting or ending here changes the list: shown at once, not in 10 s
    model.kernelStartsChanged.connect(() => void this.kernels.refresh(), this);
    this.render();
    void this.jobs.refresh();
    void this.kernels.refresh();
  }

  dispose(): void {
    window.clearInterval(this.ticker);
    window.clearInterval(this.jobsTimer);
    this.jobs.dispose();
    super.dispose();
  }

  /** Once a second: the countdown (the rest changes with the state). */
  private tick(): void {
    const state = this.model.state;
    const out = this.node.querySelector('.jp-GPUPool-countdown');
    if (state?.notice && out) {
      out.textContent = countdown(secondsUntil(state.notice.deadline, Date.now()));
    }
  }

  render(): void {
    const state = this.model.state;
    const view = viewState(state, this.model.restarting);
    const focused = document.activeElement?.id;
    this.body.textContent = '';
    this.body.dataset.view = view;
    // the jobs are asked through this server: not while it restarts or is away
    this.jobs.node.hidden = view === 'restarting' || this.model.serverAway;
    this.kernels.node.hidden = this.jobs.node.hidden;
    if (view === 'restarting') {
      this.body.append(
        this.section('Moving', [
          el(
            'p',
            'jp-GPUPool-wait',
            'The server is restarting on the new GPU. This page reconnects when it is ready.'
          )
        ])
      );
      return;
    }
    if (!state) {
      this.body.append(el('p', '', 'Asking the GPU pool…'));
      return;
    }
    if (this.model.serverAway) {
      this.body.append(
        el(
          'p',
          'jp-GPUPool-down',
          this.model.needsReload
            ? 'This server was restarted: reload the page to use it.'
            : 'This server does not answer right now; reconnecting…'
        )
      );
    }
    if (!state.pool.ok) {
      const p = el('p', 'jp-GPUPool-down');
      p.setAttribute('role', 'alert');
      const retry = state.pool.retry_in
        ? ` Trying again in ${Math.round(state.pool.retry_in)} s.`
        : '';
      p.textContent = visible(
        `The GPU pool is not answering: ${state.pool.error}.${retry}` +
          (state.user ? ' Showing what it last said.' : '')
      );
      this.body.append(p);
      if (!state.user) {
        return;
      }
    }
    if (state.stale_lease) {
      this.body.append(
        el(
          'p',
          'jp-GPUPool-note',
          `This server started on lease ${state.lease_id}, which has ended` +
            (state.lease ? `; it now runs on ${state.lease.id}.` : '.')
        )
      );
    }
    const gone = this.model.goneText(Date.now());
    if (gone) {
      // the reclaim is done (the pool's record of it once it has one): say so once, plainly,
      // with the way back; no countdown, no Keep
      const p = el('p', 'jp-GPUPool-reclaimed', visible(gone.text));
      p.setAttribute('role', 'alert');
      p.dataset.source = this.model.ended ? 'pool' : 'notice'; // whose words these are
      const home = el('a', 'jp-GPUPool-home', 'Hub home');
      home.href = URLExt.join(PageConfig.getOption('hubPrefix') || '/hub/', 'home');
      this.body.textContent = '';
      this.body.dataset.view = 'reclaimed';
      this.body.append(
        this.section(gone.word === 'reclaimed' ? 'Reclaimed' : 'Lease ended', [p, home])
      );
      return;
    }
    this.body.append(this.leaseSection(state));
    if (state.notice && state.lease) {
      this.body.append(this.noticeSection(state));
    }
    if (state.lease) {
      this.body.append(this.activitySection(state));
    }
    if (state.quota) {
      this.body.append(this.quotaSection(state));
    }
    this.body.append(this.moveSection(state));
    if (state.reclaims.length) {
      this.body.append(this.reclaimSection(state));
    }
    if (focused) {
      const again = document.getElementById(focused);
      again?.focus();
    }
    this.tick();
  }

  private section(title: string, children: (Node | string)[], id?: string): HTMLElement {
    const s = el('section', 'jp-GPUPool-section');
    const h = el('h3', 'jp-GPUPool-subheading', title);
    const hid = `jp-gpupool-h-${title.toLowerCase().replace(/[^a-z]+/g, '-')}`;
    h.id = hid;
    s.setAttribute('aria-labelledby', hid);
    if (id) {
      s.id = id;
    }
    s.append(h, ...children);
    return s;
  }

  private leaseSection(state: IState): HTMLElement {
    const lease = state.lease;
    if (!lease) {
      return this.section('Lease', [
        el('p', 'jp-GPUPool-device', 'CPU only'),
        el('p', '', 'This server has no GPU. Choose one below to move onto it.')
      ]);
    }
    const dl = el('dl', 'jp-GPUPool-facts');
    const add = (k: string, v: string) => dl.append(el('dt', '', k), el('dd', '', v));
    add('Offer', `${lease.offer_name} (${lease.offer})`);
    add('Device', lease.device);
    const mig = lease.devices.find(d => d.kind === 'mig');
    if (mig) {
      add('MIG profile', mig.profile || '–');
      add('MIG device', mig.uuid);
      add('Parent GPU', `${lease.model || ''} ${mig.parent || ''}`.trim());
    } else {
      add('GPU', lease.devices.map(d => d.uuid).join(', ') || '–');
    }
    add('Node', lease.node || '–');
    add('Since', when(lease.since));
    add('Cost', `${unitsText(lease.units, 'GPU unit')}${lease.borrowed ? ' (borrowed)' : ''}`);
    return this.section('Lease', [el('p', 'jp-GPUPool-device', lease.device), dl]);
  }

  private noticeSection(state: IState): HTMLElement {
    const n = state.notice!;
    const left = el('span', 'jp-GPUPool-countdown');
    left.setAttribute('aria-label', 'time left');
    left.textContent = countdown(secondsUntil(n.deadline, Date.now()));
    const head = el('p', 'jp-GPUPool-notice-head');
    head.append('This GPU will be reclaimed in ', left);
    const reason = el('p', '', n.reason);
    const action = el('p', '', `Then ${actionText(n.action)}.`);
    const keep = el(
      'button',
      'jp-Button jp-mod-styled jp-mod-accept jp-GPUPool-keep',
      'Keep my GPU'
    );
    keep.id = 'jp-gpupool-keep';
    keep.type = 'button';
    const k = keepState(state);
    const why = el('p', 'jp-GPUPool-note', k.why);
    why.id = 'jp-gpupool-keep-why';
    if (!k.enabled) {
      keep.disabled = true;
      keep.setAttribute('aria-describedby', why.id);
    }
    keep.onclick = () => void this.model.keep();
    const kept = el(
      'p',
      'jp-GPUPool-note',
      `Kept ${n.extensions} of ${n.max_extensions} times allowed.`
    );
    // what no save can reach, said before it matters (issue 31)
    const unsaveable = el('p', 'jp-GPUPool-note jp-GPUPool-unsaveable', UNSAVEABLE);
    // where keeping is not allowed there is no Keep button, only the reason why not
    const parts = k.enabled
      ? [head, reason, action, unsaveable, keep, kept]
      : [head, reason, action, unsaveable, why];
    const s = this.section(n.heading || 'Reclaim notice', parts);
    s.classList.add('jp-GPUPool-notice');
    return s;
  }

  private activitySection(state: IState): HTMLElement {
    const useLocal = state.local.available && state.utilization.local.length > 0;
    const samples = useLocal ? state.utilization.local : state.utilization.pool;
    const hasUtil = samples.some(s => s.util !== null);
    // the window ends at the newest reading (the pool's clock may differ from this server's)
    const now = Math.max(state.at, ...samples.map(s => s.ts));
    const total =
      state.lease?.memory_total_mib || Math.max(1, ...samples.map(s => s.memory_used_mib));
    const charts: HTMLElement[] = [];
    if (hasUtil) {
      const host = el('div', 'jp-GPUPool-chart-host');
      renderChart(
        host,
        series(
          samples,
          s => s.util,
          'GPU activity',
          '%',
          100,
          v => `${Math.round(v)}%`
        ),
        state.utilization.window,
        now
      );
      charts.push(el('h4', 'jp-GPUPool-chart-title', 'Activity (SM / GPM)'), host);
    } else {
      const procs = state.utilization.local.length
        ? state.utilization.local[state.utilization.local.length - 1].processes
        : null;
      charts.push(
        el(
          'p',
          'jp-GPUPool-note',
          'This device does not report its activity (MIG slices without GPM): memory and processes show whether it works.' +
            (procs !== null && procs !== undefined ? ` Processes on it now: ${procs}.` : '')
        )
      );
    }
    const mem = el('div', 'jp-GPUPool-chart-host');
    renderChart(
      mem,
      series(
        samples,
        s => s.memory_used_mib,
        'GPU memory used',
        'MiB',
        total,
        v => formatMiB(v)
      ),
      state.utilization.window,
      now
    );
    charts.push(el('h4', 'jp-GPUPool-chart-title', `Memory (of ${formatMiB(total)})`), mem);
    const source = useLocal
      ? 'Read on this server through NVML, with the pool’s samples.'
      : `From the pool’s node agent. ${state.local.reason || ''}`.trim();
    charts.push(el('p', 'jp-GPUPool-note', source));
    return this.section('Last 15 minutes', charts);
  }

  private meter(label: string, value: number, total: number | null, text: string): HTMLElement {
    const wrap = el('div', 'jp-GPUPool-meter');
    const id = `jp-gpupool-m-${label.toLowerCase().replace(/[^a-z]+/g, '-')}`;
    const name = el('span', 'jp-GPUPool-meter-label', label);
    name.id = id;
    const bar = el('div', 'jp-GPUPool-bar');
    bar.setAttribute('role', 'meter');
    bar.setAttribute('aria-labelledby', id);
    bar.setAttribute('aria-valuemin', '0');
    bar.setAttribute('aria-valuemax', String(total ?? value));
    bar.setAttribute('aria-valuenow', String(value));
    bar.setAttribute('aria-valuetext', text);
    const fill = el('div', 'jp-GPUPool-bar-fill');
    fill.style.width = `${(total ? fraction(value, total) : 0) * 100}%`;
    bar.append(fill);
    wrap.append(name, el('span', 'jp-GPUPool-meter-text', text), bar);
    return wrap;
  }

  private quotaSection(state: IState): HTMLElement {
    const q = state.quota!;
    const units = this.meter(
      'GPU units in use',
      q.held_units,
      q.limit,
      `${formatUnits(q.held_units)} in use · guarantee ${formatUnits(q.guarantee)} · limit ${q.limit === null ? 'none' : formatUnits(q.limit)}`
    );
    const parts: HTMLElement[] = [units];
    const resets = durationText((Date.parse(q.resets_at) - Date.now()) / 1000);
    parts.push(
      this.meter(
        `Unit-hours this ${q.period}`,
        q.used_unit_hours,
        q.budget,
        q.budget === null
          ? `${formatUnits(q.used_unit_hours)} used · no budget set`
          : `${formatUnits(q.used_unit_hours)} of ${formatUnits(q.budget)} · resets in ${resets} (${when(q.resets_at)})`
      )
    );
    const warning = budgetWarning(q);
    if (warning) {
      const p = el('p', 'jp-GPUPool-budget-warning', warning);
      p.setAttribute('role', 'status');
      parts.push(p);
    }
    return this.section('Quota', parts);
  }

  private moveSection(state: IState): HTMLElement {
    const children: (Node | string)[] = [];
    const p = state.pending;
    if (p) {
      const wait = el('p', 'jp-GPUPool-wait');
      wait.setAttribute('aria-live', 'polite');
      if (p.state === 'queued') {
        wait.textContent = visible(
          `Waiting for ${p.offer_name || p.offer}: ${p.position ? `position ${p.position}` : 'in line'}, ${durationText(p.eta_seconds)}. You keep your current GPU meanwhile.`
        );
      } else if (p.state === 'awaiting_approval') {
        wait.textContent = visible(`Waiting for an admin to approve ${p.offer_name || p.offer}.`);
      } else {
        wait.textContent = visible(
          `${p.offer_name || p.offer} is reserved${p.ready ? '' : ' (being prepared)'}; the server restarts on it now.`
        );
      }
      const cancel = el('button', 'jp-Button jp-mod-styled jp-mod-reject', 'Cancel the move');
      cancel.id = 'jp-gpupool-cancel';
      cancel.type = 'button';
      cancel.onclick = () => void this.model.cancelMove();
      children.push(wait, cancel);
      return this.section(
        state.lease ? 'Move to another GPU' : 'Request a GPU',
        children,
        'jp-gpupool-move'
      );
    }
    if (!state.offers.length) {
      children.push(el('p', 'jp-GPUPool-note', 'No other offer is open to you.'));
      return this.section(
        state.lease ? 'Move to another GPU' : 'Request a GPU',
        children,
        'jp-gpupool-move'
      );
    }
    const fieldset = el('fieldset', 'jp-GPUPool-choices');
    const legend = el('legend', '', state.lease ? 'Move to' : 'Request');
    fieldset.append(legend);
    for (const c of state.offers) {
      const id = `jp-gpupool-offer-${c.name}`;
      const row = el('div', 'jp-GPUPool-choice');
      const input = el('input');
      input.type = 'radio';
      input.name = 'jp-gpupool-offer';
      input.id = id;
      input.value = c.name;
      input.disabled = !c.fits;
      input.checked = this.chosen === c.name;
      input.onchange = () => {
        this.chosen = c.name;
      };
      const label = el('label');
      label.htmlFor = id;
      label.append(el('strong', '', c.display_name));
      const detail = `${unitsText(c.units)} · ${availabilityText(c)} · ${c.fits ? 'fits your quota' : `does not fit: ${c.why_not}`}`;
      label.append(el('span', 'jp-GPUPool-choice-detail', detail));
      row.append(input, label);
      fieldset.append(row);
    }
    const go = el(
      'button',
      'jp-Button jp-mod-styled jp-mod-accept',
      state.lease ? 'Move…' : 'Request…'
    );
    go.id = 'jp-gpupool-move-go';
    go.type = 'button';
    go.onclick = () => void this.confirmMove(state);
    children.push(fieldset, go);
    return this.section(
      state.lease ? 'Move to another GPU' : 'Request a GPU',
      children,
      'jp-gpupool-move'
    );
  }

  private async confirmMove(state: IState): Promise<void> {
    const choice = state.offers.find(c => c.name === this.chosen);
    if (!choice) {
      this.live.textContent = 'Choose an offer first.';
      return;
    }
    const text = el('div');
    text.append(
      el('p', '', `Your server restarts on ${choice.display_name}.`),
      el(
        'p',
        '',
        'Every open document is saved first; running kernels restart and lose their variables.'
      ),
      el(
        'p',
        '',
        choice.available > 0
          ? 'It is free now.'
          : `It is not free now: you wait in line (${availabilityText(choice)}) and keep your current GPU meanwhile; you can cancel.`
      )
    );
    const result = await showDialog({
      title: visible(
        state.lease ? `Move to ${choice.display_name}?` : `Request ${choice.display_name}?`
      ),
      body: new Widget({ node: text }),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Save and restart' })]
    });
    if (result.button.accept) {
      this.live.textContent = 'Saving and reserving…';
      await this.model.move(choice.name);
    }
  }

  private reclaimSection(state: IState): HTMLElement {
    const list = el('ul', 'jp-GPUPool-reclaims');
    for (const r of state.reclaims) {
      const li = el('li');
      const saved = r.saved.length ? `Saved: ${r.saved.join(', ')}.` : 'Nothing needed saving.';
      li.textContent = visible(
        `${when(r.at)}: ${r.offer_name || r.offer} was reclaimed (${r.reason}); ${doneText(r.action)}. ${saved}` +
          (r.outcome === 'failed' ? ` It failed: ${r.detail || ''}` : '')
      );
      list.append(li);
    }
    return this.section('Recent reclaims', [list]);
  }
}
