import { PresenceReporter } from '../presence';

function setVisibility(state: 'visible' | 'hidden'): void {
  Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => state });
}

describe('PresenceReporter', () => {
  let now = 0;
  let sent: number[] = [];
  let reporter: PresenceReporter;

  beforeEach(() => {
    jest.useFakeTimers();
    now = 1_000_000;
    sent = [];
    setVisibility('visible');
    reporter = new PresenceReporter(
      async idleFor => {
        sent.push(idleFor);
      },
      { now: () => now }
    );
    reporter.attach();
  });

  afterEach(() => {
    reporter.detach();
    jest.useRealTimers();
  });

  function advance(ms: number): void {
    now += ms;
    jest.advanceTimersByTime(ms);
  }

  it('reports the first input at once', () => {
    document.dispatchEvent(new KeyboardEvent('keydown', { key: 'a' }));
    expect(sent).toEqual([0]);
  });

  it('reports at most once a minute, with the newest input of that minute', () => {
    document.dispatchEvent(new KeyboardEvent('keydown', { key: 'a' }));
    for (let i = 0; i < 50; i++) {
      advance(1_000);
      document.dispatchEvent(new Event('pointerdown'));
    }
    expect(sent).toEqual([0]); // 50 s of typing: still one report
    advance(10_000); // the minute ends 10 s after the last input
    expect(sent).toEqual([0, 10]);
    advance(120_000); // no input since: nothing more
    expect(sent).toEqual([0, 10]);
  });

  it('an untouched tab reports nothing', () => {
    advance(30 * 60_000);
    expect(sent).toEqual([]);
    expect(reporter.reports).toBe(0);
  });

  it('input while the tab is hidden is not presence', () => {
    setVisibility('hidden');
    document.dispatchEvent(new KeyboardEvent('keydown', { key: 'a' }));
    document.dispatchEvent(new Event('wheel'));
    advance(120_000);
    expect(sent).toEqual([]);
  });

  it('typing once a minute is reported every minute', () => {
    for (let minute = 0; minute < 5; minute++) {
      document.dispatchEvent(new KeyboardEvent('keydown', { key: 'x' }));
      advance(60_000);
    }
    expect(sent).toEqual([0, 0, 0, 0, 0]);
  });

  it('a failed report does not stop the next one', async () => {
    const flaky = new PresenceReporter(async () => Promise.reject(new Error('away')), {
      now: () => now
    });
    flaky.onInput();
    advance(60_000);
    flaky.onInput();
    expect(flaky.reports).toBe(2);
    await Promise.resolve();
  });
});
