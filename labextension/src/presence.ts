/**
 * The user's own input, reported to the pool: the only presence the reclaimer counts where
 * this extension runs. An open tab polls the server all the time, and the proxy stamps every
 * request as activity, so the hub cannot tell a person from a tab; the tab can. Keyboard and
 * pointer input while the tab is visible is reported at most once a minute (the newest input
 * of that minute, with how long ago it was); a hidden tab or an untouched one reports nothing.
 */

/** The DOM events that are a person at the keyboard or the pointer. */
export const INPUT_EVENTS = [
  'keydown',
  'pointerdown',
  'pointermove',
  'wheel',
  'touchstart'
] as const;

export interface IPresenceOptions {
  /** Shortest time between two reports, in ms (60 000). */
  minInterval?: number;
  /** The clock, in ms (Date.now). */
  now?: () => number;
  /** Where input is listened for and visibility read (document). */
  doc?: Document;
}

/** Sends `idleFor` (seconds since the newest input) at most once per `minInterval`. */
export class PresenceReporter {
  constructor(
    private readonly send: (idleFor: number) => Promise<unknown>,
    options: IPresenceOptions = {}
  ) {
    this.minInterval = options.minInterval ?? 60_000;
    this.now = options.now ?? Date.now;
    this.doc = options.doc ?? document;
    this.onInput = this.onInput.bind(this);
  }

  /** Start listening (capture phase, passive: nothing the lab does is held up). */
  attach(): void {
    for (const name of INPUT_EVENTS) {
      this.doc.addEventListener(name, this.onInput, { capture: true, passive: true });
    }
  }

  detach(): void {
    for (const name of INPUT_EVENTS) {
      this.doc.removeEventListener(name, this.onInput, { capture: true });
    }
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  /** Reports sent so far (tests, and the curious). */
  get reports(): number {
    return this.sent;
  }

  onInput(): void {
    if (this.doc.visibilityState !== 'visible') {
      return; // a hidden tab's events (none, usually) are not someone looking at it
    }
    const now = this.now();
    this.inputAt = now;
    const wait = this.lastSent + this.minInterval - now;
    if (wait <= 0) {
      this.flush();
    } else if (this.timer === null) {
      this.timer = setTimeout(() => this.flush(), wait);
    }
  }

  private flush(): void {
    this.timer = null;
    if (this.inputAt === null) {
      return;
    }
    const now = this.now();
    const idleFor = Math.max(0, (now - this.inputAt) / 1000);
    this.inputAt = null;
    this.lastSent = now;
    this.sent += 1;
    this.send(idleFor).catch(() => {
      // not delivered (the server restarts, the pool is away): the next input reports again
    });
  }

  private readonly minInterval: number;
  private readonly now: () => number;
  private readonly doc: Document;
  private inputAt: number | null = null;
  private lastSent = -Infinity;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private sent = 0;
}
