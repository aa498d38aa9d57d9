/**
 * One tab's view of the server's shared state: an EventSource on `gpupool/events` (the
 * server asks the pool once per interval for every tab), `save` requests answered by saving
 * the documents open in this tab, and the actions (Keep my GPU, move, cancel).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { Backoff, IMove, moveFailed, moveFinished } from './format';
import { ISaveResult, IState } from './types';

/** Saves what this tab has open; returns what it saved, left alone, or failed to save. */
export type Saver = () => Promise<{
  saved: string[];
  unchanged: string[];
  failed: { path: string; error: string }[];
}>;

const MOVE_KEY = 'jupyterlab-gpupool:move-target';

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
    const query =
      `client=${this.clientId}` + (xsrf ? `&_xsrf=${encodeURIComponent(xsrf[1])}` : '');
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
    if (this._timer === null) {
      this._timer = window.setTimeout(() => {
        this._timer = null;
        void this.reconnect();
      }, this._backoff.next());
    }
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
          window.location.reload(); // the page logs in again and loads on the new GPU
          return;
        }
        this.needsReload = true;
      }
      this._timer = window.setTimeout(() => {
        this._timer = null;
        void this.reconnect();
      }, this._backoff.next());
      this._changed.emit(this._state);
    }
  }

  setState(state: IState): void {
    const previous = this._state;
    this._state = state;
    const move = this.moving;
    if (move && moveFinished(state, move)) {
      this.moving = null;
      if (this.restarting) {
        // the server restarted onto the new GPU: a fresh page gets its kernels and settings
        this.restarting = false;
        window.setTimeout(() => window.location.reload(), 500);
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
    this.moving = { from: this._state?.lease?.id ?? null, offer };
    this._asking = true;
    try {
      await this.request('resize', 'POST', { offer });
      return true;
    } catch (e) {
      const status = (e as { status?: number }).status;
      if (status !== undefined && status >= 400 && status < 500 && (e as { code?: string }).code) {
        this.moving = null; // the pool's (or the server's) refusal: nothing happens
        this._message.emit({ text: `The move was refused: ${(e as Error).message}`, error: true });
        return false;
      }
      return true; // no answer: the server is restarting (the event stream tells)
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
