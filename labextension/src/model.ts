/**
 * One tab's view of the server's shared state: an EventSource on `gpupool/events` (the
 * server asks the pool once per interval for every tab), `save` requests answered by saving
 * the documents open in this tab, and the actions (Keep my GPU, move, cancel).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { askLeaseEnd } from './ended';
import {
  Backoff,
  IMove,
  IStatusExtra,
  endedText,
  moveFailed,
  moveFinished,
  reclaimedText
} from './format';
import { MOVED_KEY } from './stale';
import { IKernelStarts, ILease, ILeaseEnd, IKernelStart, ISaveResult, IState } from './types';

/** Saves what this tab has open; returns what it saved, left alone, or failed to save. */
export type Saver = () => Promise<{
  saved: string[];
  unchanged: string[];
  failed: { path: string; error: string }[];
}>;

const MOVE_KEY = 'jupyterlab-gpupool:move-target';
/** During a move the page looks for the new server this often (not the reconnect back-off:
 * the page follows the new server within this of its being ready). */
export const MOVE_PROBE_MS = 500;
/** How long a gone server's lease end is asked again while the pool has not recorded the
 * reclaim that its notice announced (the reclaimer reports it after the stop). */
const END_PATIENCE_MS = 120000;

export class GPUPoolModel {
  readonly clientId = `lab-${Math.random().toString(36).slice(2, 12)}`;
  private _state: IState | null = null;
  private _source: EventSource | null = null;
  private _changed = new Signal<this, IState | null>(this);
  private _message = new Signal<this, { text: string; error: boolean }>(this);
  private _backoff = new Backoff(1000, 30000);
  private _timer: number | null = null;
  private _watchdog: number | null = null;
  private _lastEvent = 0;
  /** the move this tab asked for (kept in sessionStorage: the page may reload, and the
   * server restart, before the answer arrives), and whether the server went away since */
  private _move: IMove | null = null;
  private _asking = false;
  restarting = false;
  /** the server (not the pool) cannot be reached */
  serverAway = false;
  /** the server restarted under this page (not by a move of this tab): reload to use it */
  needsReload = false;
  /** how this server's lease ended, from the pool, once the server is gone */
  ended: ILeaseEnd | null = null;
  private _gone = new Signal<this, void>(this);
  private _kernelStarts: IKernelStarts = { waiting: [], notices: [] };
  private _kernelStartsChanged = new Signal<this, IKernelStarts>(this);
  private _lastLease: ILease | null = null;
  private _askedAt = 0;
  private _follow: number | null = null;
  private _firstAsk = 0;

  constructor(
    private settings: ServerConnection.ISettings,
    private saver: Saver
  ) {
    try {
      const kept = window.sessionStorage.getItem(MOVE_KEY);
      this._move = kept ? (JSON.parse(kept) as IMove) : null;
    } catch {
      this._move = null;
    }
  }

  get moving(): IMove | null {
    return this._move;
  }
  set moving(move: IMove | null) {
    this._move = move;
    try {
      if (move) {
        window.sessionStorage.setItem(MOVE_KEY, JSON.stringify(move));
      } else {
        window.sessionStorage.removeItem(MOVE_KEY);
      }
    } catch {
      // storage refused (private mode): the move still completes, the page may not reload
    }
  }

  get state(): IState | null {
    return this._state;
  }
  get changed(): ISignal<this, IState | null> {
    return this._changed;
  }
  /** once, when the server is gone and the lab knows how its lease ended (open the panel) */
  get gone(): ISignal<this, void> {
    return this._gone;
  }

  /** The lease the status bar shows: during a move the old one until the new one is live
   * (the pool has already released it while the server restarts: no "CPU only" flash). */
  get shownLease(): ILease | null {
    const lease = this._state?.lease ?? null;
    return !lease && this.moving ? (this._lastLease ?? this.moving.lease ?? null) : lease;
  }

  /** What the panel and the status bar say once the server is gone after its lease ended:
   * the pool's record, else (until the pool has it) what this page knew of the notice. */
  goneText(now: number): { word: string; text: string } | null {
    if (!this.serverAway || this.moving) {
      return null;
    }
    const ended = endedText(this.ended);
    if (ended) {
      return ended;
    }
    const text = reclaimedText(this._state, this.serverAway, now);
    return text ? { word: 'reclaimed', text } : null;
  }

  statusExtra(now: number): IStatusExtra {
    return { lease: this.shownLease, ended: this.goneText(now) };
  }

  /**
   * While a move's target is reserved (or asked for), look at the server every MOVE_PROBE_MS:
   * a proxy may keep the old server's event stream open after the server is gone (its
   * silence would be noticed only after 25 s), and the page should follow the new server as
   * soon as it answers. A move waiting in line is followed by the event stream alone.
   */
  private follow(): void {
    if (this._follow !== null) {
      return;
    }
    this._follow = window.setInterval(() => void this.probe(), MOVE_PROBE_MS);
  }

  private async probe(): Promise<void> {
    const move = this.moving;
    const waiting = this._state?.pending && this._state.pending.state !== 'granted';
    if (!move || this.serverAway || waiting) {
      if (!move || this.serverAway) {
        window.clearInterval(this._follow!);
        this._follow = null; // the reconnect loop (at MOVE_PROBE_MS during a move) goes on
      }
      return;
    }
    try {
      this.setState(await this.request<IState>('state', 'GET'));
    } catch {
      // gone (the restart stopped it) or a new server that does not know this page's login:
      // the reconnect loop tells which, every MOVE_PROBE_MS
      if (this._source && this.moving) {
        this.lost(this._source);
      }
    }
  }

  /** Ask the pool (its page, see ended.ts) how the lease ended; at most every 5 s. */
  private async askEnd(): Promise<void> {
    const state = this._state;
    const lease = state?.lease?.id ?? state?.lease_id ?? null;
    const now = Date.now();
    if (!state?.page || !lease || this.moving || now - this._askedAt < 5000) {
      return;
    }
    if (this.ended?.ended && (this.ended.reclaimed || !state.notice)) {
      return; // the answer is final
    }
    this._askedAt = now;
    this._firstAsk = this._firstAsk || now;
    const end = await askLeaseEnd(state.page, lease);
    if (!end || end.lease !== lease || !this.serverAway) {
      return;
    }
    // a notice announced a reclaim: until the pool records it (after the stop), what the
    // notice said stands, unless the pool has said nothing of it for END_PATIENCE_MS
    if (state.notice && !end.reclaimed && Date.now() - this._firstAsk < END_PATIENCE_MS) {
      return;
    }
    const first = !this.ended?.ended;
    this.ended = end;
    this._changed.emit(this._state);
    if (first && end.ended) {
      this._gone.emit();
    }
  }

  /** This server's GPU kernel starts waiting for their GPU, and the pool's notices to its
   * GPU kernels (the server's `kernel-starts` events). */
  get kernelStarts(): IKernelStarts {
    return this._kernelStarts;
  }
  get kernelStartsChanged(): ISignal<this, IKernelStarts> {
    return this._kernelStartsChanged;
  }

  /** Cancel a waiting GPU kernel start: its place in the queue is given back and the start
   * fails with "GPU kernel start cancelled" (JupyterLab says so; the notebook keeps working). */
  async cancelKernelStart(kernelId: string): Promise<void> {
    const w = this._kernelStarts.waiting.find(k => k.kernel_id === kernelId);
    try {
      await this.request<{ cancelled: IKernelStart }>(
        `kernel-starts/${encodeURIComponent(kernelId)}`,
        'DELETE'
      );
      this._message.emit({
        text: `GPU kernel start cancelled${w ? ` (${w.offer_name || w.offer})` : ''}.`,
        error: false
      });
    } catch (e) {
      this._message.emit({
        text: `Could not cancel the GPU kernel start: ${(e as Error).message}`,
        error: true
      });
    }
  }

  /** one-line messages for the user (move refused, kept, saved) */
  get message(): ISignal<this, { text: string; error: boolean }> {
    return this._message;
  }

  url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'gpupool', path);
  }

  connect(): void {
    this.disconnect();
    // under JupyterHub a cookie-authenticated API request needs the XSRF token even for GET,
    // and EventSource cannot send headers: it goes in the query, as the hub accepts
    const xsrf = document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/);
    const query = `client=${this.clientId}` + (xsrf ? `&_xsrf=${encodeURIComponent(xsrf[1])}` : '');
    const source = new EventSource(this.url(`events?${query}`), {
      withCredentials: true
    });
    this._source = source;
    this._lastEvent = Date.now();
    const seen = () => (this._lastEvent = Date.now());
    source.addEventListener('ping', seen);
    source.addEventListener('state', ev => {
      seen();
      this._backoff.reset();
      this.serverAway = false;
      this.setState(JSON.parse((ev as MessageEvent).data));
    });
    source.addEventListener('kernel-starts', ev => {
      seen();
      this._kernelStarts = JSON.parse((ev as MessageEvent).data) as IKernelStarts;
      this._kernelStartsChanged.emit(this._kernelStarts);
    });
    source.addEventListener('save', ev => {
      seen();
      void this.answerSave(JSON.parse((ev as MessageEvent).data).id);
    });
    source.addEventListener('saved', ev => {
      seen();
      const r = JSON.parse((ev as MessageEvent).data) as ISaveResult;
      if (r.saved.length) {
        this._message.emit({ text: `Saved: ${r.saved.join(', ')}`, error: false });
      }
    });
    source.onerror = () => this.lost(source);
    if (this._watchdog === null) {
      // a proxy may keep the stream open after the server behind it is gone: the server
      // sends something every 10 s, so a silence of 25 s means it went away
      this._watchdog = window.setInterval(() => {
        if (this._source && Date.now() - this._lastEvent > 25000) {
          this.lost(this._source);
        }
      }, 5000);
    }
  }

  /** The server went away (restart, network): reconnect with backoff, never reload blindly. */
  private lost(source: EventSource): void {
    source.close();
    if (this._source === source) {
      this._source = null;
    }
    this.serverAway = true;
    if (this.moving) {
      this.restarting = true;
    }
    this._changed.emit(this._state);
    void this.askEnd();
    if (this._timer === null) {
      this._timer = window.setTimeout(() => {
        this._timer = null;
        void this.reconnect();
      }, this.nextDelay());
    }
  }

  /** The wait before the next reconnect: short and fixed during a move (the new server is
   * expected any second), the doubling back-off otherwise. */
  private nextDelay(): number {
    return this.moving ? MOVE_PROBE_MS : this._backoff.next();
  }

  private reloadAfterMove(delay: number): void {
    try {
      window.sessionStorage.setItem(MOVED_KEY, String(Date.now()));
    } catch {
      // storage refused: stale widget outputs stay as JupyterLab shows them
    }
    window.setTimeout(() => window.location.reload(), delay);
  }

  disconnect(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._source) {
      this._source.close();
      this._source = null;
    }
  }

  /** After the server went away: ask `state` first (a restarted server answers there). */
  private async reconnect(): Promise<void> {
    try {
      const state = await this.request<IState>('state', 'GET');
      this.serverAway = false;
      this.needsReload = false;
      this.setState(state);
      this.connect();
    } catch (e) {
      const status = (e as { status?: number }).status;
      if (status === 401 || status === 403) {
        // a new server process (restarted): this page's login was for the old one
        if (this.moving) {
          this.reloadAfterMove(0); // the page logs in again and loads on the new GPU
          return;
        }
        this.needsReload = true;
      }
      this._timer = window.setTimeout(() => {
        this._timer = null;
        void this.reconnect();
      }, this.nextDelay());
      void this.askEnd();
      this._changed.emit(this._state);
    }
  }

  setState(state: IState): void {
    const previous = this._state;
    this._state = state;
    if (state.lease) {
      this._lastLease = state.lease;
    }
    if (!this.serverAway) {
      this.ended = null;
      this._firstAsk = 0;
    }
    const move = this.moving;
    if (move && moveFinished(state, move)) {
      this.moving = null;
      if (this.restarting) {
        // the server restarted onto the new GPU: a fresh page gets its kernels and settings
        this.restarting = false;
        this.reloadAfterMove(0);
      } else {
        this._message.emit({ text: `Now on ${state.lease?.device}.`, error: false });
      }
    } else if (move && !this._asking && moveFailed(previous, state, move)) {
      this.moving = null;
      this.restarting = false;
      if (previous) {
        this._message.emit({
          text: 'The move did not happen: the GPU you asked for did not come. You keep your current one.',
          error: true
        });
      }
    }
    this._changed.emit(state);
  }

  async request<T>(path: string, method: string, body?: unknown): Promise<T> {
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
    }
    const response = await ServerConnection.makeRequest(this.url(path), init, this.settings);
    const text = await response.text();
    const data = text ? JSON.parse(text) : {};
    if (!response.ok) {
      const message = data?.error?.message || `HTTP ${response.status}`;
      const err = new Error(message) as Error & { code?: string; status?: number };
      err.code = data?.error?.code;
      err.status = response.status;
      throw err;
    }
    return data as T;
  }

  private async answerSave(id: string): Promise<void> {
    let answer;
    try {
      answer = await this.saver();
    } catch (e) {
      answer = { saved: [], unchanged: [], failed: [{ path: '*', error: String(e) }] };
    }
    try {
      await this.request(`save-all/${id}?client=${this.clientId}`, 'POST', answer);
    } catch {
      // the server stopped waiting (its timeout): it checkpointed instead
    }
  }

  async keep(): Promise<void> {
    try {
      this.setState(await this.request<IState>('keepalive', 'POST', {}));
      this._message.emit({ text: 'Kept: your GPU stays yours.', error: false });
    } catch (e) {
      this._message.emit({ text: `Could not keep the GPU: ${(e as Error).message}`, error: true });
    }
  }

  async move(offer: string): Promise<boolean> {
    // recorded first: the pool may restart the server before its answer gets here
    this.moving = {
      from: this._state?.lease?.id ?? null,
      offer,
      lease: this._state?.lease ?? null
    };
    this._asking = true;
    try {
      await this.request('resize', 'POST', { offer });
      this.follow();
      return true;
    } catch (e) {
      const status = (e as { status?: number }).status;
      if (status !== undefined && status >= 400 && status < 500 && (e as { code?: string }).code) {
        this.moving = null; // the pool's (or the server's) refusal: nothing happens
        this._message.emit({ text: `The move was refused: ${(e as Error).message}`, error: true });
        return false;
      }
      this.follow();
      return true; // no answer: the server is restarting (the probe and the stream tell)
    } finally {
      this._asking = false;
      void this.refresh();
    }
  }

  async cancelMove(): Promise<void> {
    try {
      this.moving = null;
      this.setState(await this.request<IState>('resize', 'DELETE'));
      this._message.emit({ text: 'Move cancelled; you keep your current GPU.', error: false });
    } catch (e) {
      this._message.emit({ text: `Could not cancel: ${(e as Error).message}`, error: true });
    }
  }

  async refresh(): Promise<void> {
    try {
      this.setState(await this.request<IState>('refresh', 'POST', {}));
    } catch {
      // the event stream reports the pool's state anyway
    }
  }

  dispose(): void {
    this.disconnect();
    if (this._watchdog !== null) {
      window.clearInterval(this._watchdog);
    }
    Signal.clearData(this);
  }
}
