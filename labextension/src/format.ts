/**
 * The UI's logic with no DOM: units, memory, countdowns, what the status bar says, which
 * state the panel is in, and the reconnect backoff. Jest tests every function here.
 */
import { IChoice, ILease, ILeaseEnd, IQuota, IState, ISample } from './types';

/** GPU units: `1`, `0.5`, `0.14` (two significant digits below 1). */
export function formatUnits(units: number | null | undefined): string {
  if (units === null || units === undefined || !isFinite(units)) {
    return '–';
  }
  if (units === 0) {
    return '0';
  }
  if (Math.abs(units) >= 10) {
    return units.toFixed(0);
  }
  if (Math.abs(units) >= 1) {
    return String(Math.round(units * 100) / 100);
  }
  return String(Number(units.toPrecision(2)));
}

/** MiB as people read it: `512 MiB`, `9.8 GiB`, `80 GiB`. */
export function formatMiB(mib: number | null | undefined): string {
  if (mib === null || mib === undefined || !isFinite(mib)) {
    return '–';
  }
  if (mib < 1024) {
    return `${Math.round(mib)} MiB`;
  }
  const gib = mib / 1024;
  return `${gib >= 10 ? Math.round(gib) : Math.round(gib * 10) / 10} GiB`;
}

/** Seconds as a countdown: `4:05`, `1:02:03`, `0:00` for the past. */
export function countdown(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${sec}` : `${m}:${sec}`;
}

/** Seconds until an ISO deadline, from `now` (ms since the epoch). */
export function secondsUntil(deadline: string, now: number): number {
  const t = Date.parse(deadline);
  return isNaN(t) ? 0 : (t - now) / 1000;
}

/** A duration in words for waits and resets: `now`, `about 3 min`, `about 2 h`, `2 days`. */
export function durationText(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return 'unknown';
  }
  if (seconds < 30) {
    return 'now';
  }
  if (seconds < 3600) {
    return `about ${Math.max(1, Math.round(seconds / 60))} min`;
  }
  if (seconds < 2 * 86400) {
    return `about ${Math.round(seconds / 3600)} h`;
  }
  return `${Math.round(seconds / 86400)} days`;
}

/** What a resize choice says about getting it: free now, or the queue. */
export function availabilityText(choice: IChoice): string {
  if (choice.available > 0 && choice.queue_length === 0) {
    return `${choice.available} free now`;
  }
  const ahead = choice.queue_length;
  return `none free: ${ahead} waiting, ${durationText(choice.eta_seconds)}`;
}

/** The most recent sample (or null). */
export function latest(samples: ISample[]): ISample | null {
  return samples.length ? samples[samples.length - 1] : null;
}

/** The panel's states, in the order they take precedence. */
export type ViewState =
  'loading' | 'no-pool' | 'pool-down' | 'moving' | 'restarting' | 'notice' | 'gpu' | 'cpu';

/** Which state the panel is in (`restarting`: the tab saw the server go away mid-move). */
export function viewState(state: IState | null, restarting = false): ViewState {
  if (restarting) {
    return 'restarting';
  }
  if (!state) {
    return 'loading';
  }
  if (!state.pool.ok && state.pool.code === 'down' && state.user === null) {
    return state.pool.fetched_at === null && state.pool.retry_in === null ? 'no-pool' : 'pool-down';
  }
  if (!state.pool.ok) {
    return 'pool-down';
  }
  if (state.pending) {
    return 'moving';
  }
  if (state.lease && state.notice) {
    return 'notice';
  }
  return state.lease ? 'gpu' : 'cpu';
}

export interface IStatusText {
  device: string;
  util: string;
  memory: string;
  /** `amber` under a reclaim notice, `down` when the pool does not answer */
  tone: 'normal' | 'amber' | 'down';
  /** the whole line for screen readers and the tooltip */
  label: string;
}

/** What the status bar shows besides the state: the lease to show (during a move, the one
 * the server still runs on until the new one is live) and, once the server is gone, how its
 * lease ended (`word` in the bar, `text` for the tooltip and screen readers). */
export interface IStatusExtra {
  lease?: ILease | null;
  ended?: { word: string; text: string } | null;
}

/** The status-bar item: device, utilization %, memory used/total. */
export function statusText(
  state: IState | null,
  now: number,
  extra: IStatusExtra = {}
): IStatusText {
  if (extra.ended) {
    // the server is gone: no stale device, no countdown at 0:00
    return {
      device: extra.ended.word,
      util: '',
      memory: '',
      tone: 'down',
      label: extra.ended.text
    };
  }
  if (!state) {
    return { device: 'GPU', util: '', memory: '', tone: 'normal', label: 'GPU pool: loading' };
  }
  const lease = extra.lease !== undefined ? extra.lease : state.lease;
  const device = lease ? lease.device : 'CPU only';
  const local = latest(state.utilization.local);
  const pool = latest(state.utilization.pool);
  const sample = local && local.util !== null ? local : pool || local;
  const util = lease && sample && sample.util !== null ? `${Math.round(sample.util)}%` : '';
  const used = sample ? sample.memory_used_mib : null;
  const memory =
    lease && used !== null && lease.memory_total_mib
      ? `${formatMiB(used)} / ${formatMiB(lease.memory_total_mib)}`
      : '';
  let tone: IStatusText['tone'] = 'normal';
  const parts = [`GPU: ${device}`];
  if (util) {
    parts.push(`utilization ${util}`);
  }
  if (memory) {
    parts.push(`memory ${memory}`);
  }
  if (!state.pool.ok) {
    tone = 'down';
    parts.push('the GPU pool is not answering');
  } else if (state.notice) {
    tone = 'amber';
    const left = countdown(secondsUntil(state.notice.deadline, now));
    parts.push(`will be reclaimed in ${left}`);
  }
  return { device, util, memory, tone, label: parts.join(', ') };
}

/** What the notice's action means for the user. */
export function actionText(action: string): string {
  if (action === 'stop') {
    return 'your server will be stopped (open documents are saved first)';
  }
  if (action === 'release-gpu') {
    return 'your server will restart without a GPU (open documents are saved first)';
  }
  if (action.startsWith('shrink:')) {
    return `your server will restart on ${action.slice(7)} (open documents are saved first)`;
  }
  return action;
}

/** What a reclaim that happened did (the panel's "Recent reclaims"). */
export function doneText(action: string): string {
  if (action === 'stop') {
    return 'the server was stopped';
  }
  if (action === 'release-gpu') {
    return 'the server restarted without a GPU';
  }
  if (action.startsWith('shrink:')) {
    return `the server restarted on ${action.slice(7)}`;
  }
  return action;
}

/** The Keep my GPU button: enabled, and if not, why. */
export function keepState(state: IState): { enabled: boolean; why: string } {
  const n = state.notice;
  if (!n) {
    return { enabled: false, why: 'no notice' };
  }
  if (n.keep !== undefined) {
    // the pool's own words for this kind of notice
    return {
      enabled: n.keep && !n.acting,
      why: n.keep ? '' : n.why_not_kept || 'It cannot be kept.'
    };
  }
  if (n.acting) {
    return { enabled: false, why: 'the reclaim has started' };
  }
  if (!n.extendable) {
    if (n.extensions >= n.max_extensions && n.max_extensions > 0) {
      return { enabled: false, why: `kept ${n.extensions} times already, the most allowed` };
    }
    return { enabled: false, why: 'this GPU is needed by someone within their guarantee' };
  }
  return { enabled: true, why: '' };
}

/** The fraction (0..1, capped) of a bar; 0 for a missing or zero total. */
export function fraction(value: number, total: number | null | undefined): number {
  if (!total || total <= 0 || !isFinite(total)) {
    return 0;
  }
  return Math.max(0, Math.min(1, value / total));
}

/**
 * Reconnect backoff: the first retry after `base` ms, doubling to `max`; `reset()` after a
 * success. Deterministic (no jitter) so tests can say what it does.
 */
export class Backoff {
  private n = 0;
  constructor(
    readonly base = 1000,
    readonly max = 60000
  ) {}
  next(): number {
    const delay = Math.min(this.max, this.base * 2 ** this.n);
    this.n += 1;
    return delay;
  }
  reset(): void {
    this.n = 0;
  }
  get attempts(): number {
    return this.n;
  }
}

/** A move this tab asked for: from which lease (null: CPU only) to which offer; recorded
 * before the request, since the server may restart before its answer arrives. */
export interface IMove {
  from: string | null;
  offer: string;
  /** the lease moved from, as the status bar showed it (kept across the reload) */
  lease?: ILease | null;
}

/** After a move was asked for: is the server back, on a new lease of the asked offer? */
export function moveFinished(state: IState, move: IMove): boolean {
  return (
    !!state.lease &&
    state.lease.id !== move.from &&
    state.lease.offer === move.offer &&
    !state.pending
  );
}

/** A move that ended without the target: refused, withdrawn, cancelled or never came (a
 * request was waiting, and now none is and the server is still where it was). */
export function moveFailed(previous: IState | null, now: IState, move: IMove): boolean {
  const still = (now.lease?.id ?? null) === move.from;
  if (!now.pool.ok || now.pending || !still) {
    return false;
  }
  return previous === null || !!previous.pending;
}

/** Bidirectional controls: embeddings and overrides (U+202A–U+202E), isolates (U+2066–U+2069). */
const BIDI = /[\u202a-\u202e\u2066-\u2069]/g;

/**
 * The one display rule for text from users, agents and admins (the pool's pages apply the
 * same): every bidirectional control is shown as a visible [U+202E] instead of being obeyed,
 * so a name or a reason cannot reverse what the panel says.
 */
export function visible(text: string | null | undefined): string {
  return String(text ?? '').replace(
    BIDI,
    c => `[U+${c.codePointAt(0)!.toString(16).toUpperCase().padStart(4, '0')}]`
  );
}

/** `1 unit`, `0.5 units`, `2 GPU units` (`word` after the number, plural unless exactly 1). */
export function unitsText(units: number | null | undefined, word = 'unit'): string {
  return `${formatUnits(units)} ${word}${units === 1 ? '' : 's'}`;
}

/** A time of day as the panel says it: `14:02` (the browser's time zone). */
export function clock(at: Date): string {
  return `${String(at.getHours()).padStart(2, '0')}:${String(at.getMinutes()).padStart(2, '0')}`;
}

/**
 * After the pool acted on this server's notice (the server is gone, the notice was being
 * carried out or its deadline passed): the one message the panel shows instead of a countdown
 * at 0:00 and a Keep button. `null` while nothing says the reclaim happened.
 */
export function reclaimedText(
  state: IState | null,
  serverAway: boolean,
  now: number
): string | null {
  const n = state?.notice;
  if (!state || !n || !serverAway) {
    return null;
  }
  if (!n.acting && secondsUntil(n.deadline, now) > 0) {
    return null;
  }
  const hhmm = clock(new Date(Math.min(now, Date.parse(n.deadline) || now)));
  // the save-all the reclaimer asked for (a save from before the notice is not it)
  const save = state.last_save;
  const issued = n.issued ? Date.parse(n.issued) : NaN;
  const ours = save && (isNaN(issued) || save.at * 1000 >= issued);
  const saved =
    ours && save.saved.length ? `saved: ${save.saved.join(', ')}` : 'nothing needed saving';
  return `Your GPU was reclaimed at ${hhmm} because ${n.reason}; ${doneText(n.action)}; ${saved}. Start again from Hub home.`;
}

/**
 * The budget warning the panel shows from 80 % of the period's unit-hour budget (the user page
 * says the same): how much is used, and at 100 % what happens next for this quota's
 * `budget_action`. `null` below 80 % or without a budget.
 */
export function budgetWarning(q: IQuota | null | undefined): string | null {
  if (!q || !q.budget || q.used_unit_hours < 0.8 * q.budget) {
    return null;
  }
  if (q.used_unit_hours < q.budget) {
    const share = Math.round((100 * q.used_unit_hours) / q.budget);
    return `You have used ${share} % of your GPU-hour budget of this ${q.period}.`;
  }
  const next = {
    stop: 'your running GPU servers get a notice and are stopped at its end (your work is saved first).',
    notify: 'you may go on; your administrators are told.',
    refuse: `no new GPU is granted until the next ${q.period}; what runs goes on.`
  }[q.budget_action ?? 'refuse'];
  return `Your GPU-hour budget of this ${q.period} is spent: ${next}`;
}

/** Why a lease ended, for release reasons other than a reclaim (the pool's codes). */
const ENDINGS: Record<string, string> = {
  stopped: 'the server was stopped',
  resized: 'the server moved to another GPU',
  orphaned: 'the server was gone',
  admin: 'an administrator released it',
  lapsed: 'its approved time ended',
  expired: 'it was never used'
};

/**
 * How this server's lease ended, from the pool's own record (its `ended/<lease>` page), once
 * the server is gone: the reclaim's time, reason, what it did and the files it saved, or the
 * release reason. `null` while the lease has not ended (a restart, a move under way).
 */
export function endedText(end: ILeaseEnd | null): { word: string; text: string } | null {
  if (!end || !end.ended) {
    return null;
  }
  const at = end.at ? Date.parse(end.at) : NaN;
  const when = isNaN(at) ? '' : ` at ${clock(new Date(at))}`;
  if (end.reclaimed) {
    const saved = end.saved.length ? `saved: ${end.saved.join(', ')}` : 'nothing needed saving';
    const why = end.reason ? ` because ${end.reason}` : '';
    return {
      word: 'reclaimed',
      text: `Your GPU was reclaimed${when}${why}; ${doneText(end.action || 'stop')}; ${saved}. Start again from Hub home.`
    };
  }
  const reason = end.release_reason || '';
  return {
    word: 'ended',
    text: `Your GPU lease (${end.offer_name || end.offer}) ended${when}: ${ENDINGS[reason] || reason || 'released'}. Start again from Hub home.`
  };
}

/** The MIME type of an ipywidgets view in a notebook output. */
export const WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json';

/**
 * The outputs (their indices) that show a widget whose model died with the old kernel: a
 * widget view whose model is not in the notebook's saved widget state. After a move the
 * kernel is new, so JupyterLab would show "Error displaying widget: model not found" there.
 */
export function staleWidgetOutputs(
  outputs: { data?: Record<string, unknown> | null }[],
  savedModels: Set<string>
): number[] {
  const out: number[] = [];
  outputs.forEach((o, i) => {
    const view = o.data?.[WIDGET_VIEW] as { model_id?: string } | undefined;
    if (view && !(view.model_id && savedModels.has(view.model_id))) {
      out.push(i);
    }
  });
  return out;
}

/** What a stale widget output says instead (as plain text, the notebook stays valid). */
export const STALE_WIDGET_TEXT =
  'This widget belonged to the kernel before the move to another GPU; run the cell again to show it.';
