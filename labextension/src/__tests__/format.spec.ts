import {
  budgetWarning,
  Backoff,
  clock,
  endedText,
  STALE_WIDGET_TEXT,
  staleWidgetOutputs,
  WIDGET_VIEW,
  actionText,
  availabilityText,
  countdown,
  doneText,
  durationText,
  formatMiB,
  formatUnits,
  fraction,
  keepState,
  moveFailed,
  moveFinished,
  reclaimedText,
  secondsUntil,
  statusText,
  unitsText,
  viewState,
  visible
} from '../format';
import { IChoice, ILeaseEnd, IQuota, IState } from '../types';

function state(over: Partial<IState> = {}): IState {
  return {
    version: 3,
    at: 1_700_000_000,
    interval: 5,
    pool: { ok: true, error: null, code: null, down_since: null, retry_in: null, fetched_at: 1 },
    user: 'alice',
    server: '',
    lease_id: 'L1',
    stale_lease: false,
    lease: {
      id: 'L1',
      offer: 'a100-1g',
      offer_name: 'A100 · 1g.10gb slice',
      state: 'active',
      model: 'A100-80GB',
      node: 'node-a100',
      since: '2026-01-01T10:00:00Z',
      units: 1 / 7,
      borrowed: false,
      device: 'A100 1g.10gb',
      memory_total_mib: 10240,
      devices: [],
      reclaim: null
    },
    pending: null,
    notice: null,
    quota: null,
    offers: [],
    utilization: {
      window: 900,
      pool: [{ ts: 1, util: 37.4, memory_used_mib: 2150 }],
      local: []
    },
    local: { available: false, reason: 'no NVML', devices: [] },
    reclaims: [],
    last_save: null,
    ...over
  };
}

const notice = {
  kind: 'idle',
  deadline: '2026-01-01T12:05:00Z',
  reason: 'idle for 30 minutes',
  action: 'stop',
  extensions: 0,
  max_extensions: 2,
  extendable: true,
  acting: false
};

describe('units and memory', () => {
  it('formats GPU units', () => {
    expect(formatUnits(1 / 7)).toBe('0.14');
    expect(formatUnits(0.5)).toBe('0.5');
    expect(formatUnits(1)).toBe('1');
    expect(formatUnits(1.25)).toBe('1.25');
    expect(formatUnits(12.4)).toBe('12');
    expect(formatUnits(0)).toBe('0');
    expect(formatUnits(null)).toBe('–');
    expect(formatUnits(NaN)).toBe('–');
  });
  it('formats MiB', () => {
    expect(formatMiB(512)).toBe('512 MiB');
    expect(formatMiB(2150)).toBe('2.1 GiB');
    expect(formatMiB(10240)).toBe('10 GiB');
    expect(formatMiB(81920)).toBe('80 GiB');
    expect(formatMiB(null)).toBe('–');
  });
  it('caps fractions of bars', () => {
    expect(fraction(1, 2)).toBe(0.5);
    expect(fraction(3, 2)).toBe(1);
    expect(fraction(1, 0)).toBe(0);
    expect(fraction(1, null)).toBe(0);
  });
});

describe('countdown', () => {
  it('counts down minutes and hours, never below zero', () => {
    expect(countdown(245)).toBe('4:05');
    expect(countdown(3723)).toBe('1:02:03');
    expect(countdown(-5)).toBe('0:00');
    expect(countdown(59.9)).toBe('0:59');
  });
  it('measures to an ISO deadline', () => {
    const now = Date.parse('2026-01-01T12:00:00Z');
    expect(secondsUntil('2026-01-01T12:05:00Z', now)).toBe(300);
    expect(secondsUntil('not a time', now)).toBe(0);
  });
  it('says waits in words', () => {
    expect(durationText(10)).toBe('now');
    expect(durationText(200)).toBe('about 3 min');
    expect(durationText(7200)).toBe('about 2 h');
    expect(durationText(3 * 86400)).toBe('3 days');
    expect(durationText(null)).toBe('unknown');
  });
});

describe('the status bar', () => {
  it('shows device, utilization and memory', () => {
    const t = statusText(state(), 0);
    expect([t.device, t.util, t.memory, t.tone]).toEqual([
      'A100 1g.10gb',
      '37%',
      '2.1 GiB / 10 GiB',
      'normal'
    ]);
    expect(t.label).toContain('utilization 37%');
  });
  it('prefers NVML on the server where it reads utilization', () => {
    const s = state({
      utilization: {
        window: 900,
        pool: [{ ts: 1, util: 10, memory_used_mib: 100 }],
        local: [{ ts: 2, util: 90, memory_used_mib: 200 }]
      }
    });
    expect(statusText(s, 0).util).toBe('90%');
  });
  it('turns amber under a notice, with the countdown in the label', () => {
    const now = Date.parse('2026-01-01T12:00:00Z');
    const t = statusText(state({ notice }), now);
    expect(t.tone).toBe('amber');
    expect(t.label).toContain('will be reclaimed in 5:00');
  });
  it('says CPU only without a lease, and when the pool is away', () => {
    const s = state({ lease: null, pool: { ...state().pool, ok: false, error: 'x' } });
    const t = statusText(s, 0);
    expect(t.device).toBe('CPU only');
    expect(t.util).toBe('');
    expect(t.tone).toBe('down');
  });
});

describe('state transitions', () => {
  it('orders the views', () => {
    expect(viewState(null)).toBe('loading');
    expect(viewState(state())).toBe('gpu');
    expect(viewState(state({ lease: null }))).toBe('cpu');
    expect(viewState(state({ notice }))).toBe('notice');
    const pending = {
      id: 'L2',
      offer: 'a100-3g',
      state: 'queued',
      position: 2,
      eta_seconds: 600,
      ready: false,
      resize_of: 'L1'
    };
    expect(viewState(state({ notice, pending }))).toBe('moving');
    expect(viewState(state({ pool: { ...state().pool, ok: false, error: 'down' } }))).toBe(
      'pool-down'
    );
    expect(viewState(state(), true)).toBe('restarting');
  });
  it('knows when a move finished or failed', () => {
    const pending = {
      id: 'L2',
      offer: 'a100-3g',
      state: 'granted',
      position: null,
      eta_seconds: null,
      ready: true,
      resize_of: 'L1'
    };
    const waiting = state({ pending });
    const arrived = state({ lease: { ...state().lease!, id: 'L2', offer: 'a100-3g' } });
    const gaveUp = state();
    const move = { from: 'L1', offer: 'a100-3g' };
    expect(moveFinished(waiting, move)).toBe(false);
    expect(moveFinished(arrived, move)).toBe(true);
    expect(moveFinished(gaveUp, move)).toBe(false);
    expect(moveFailed(waiting, gaveUp, move)).toBe(true);
    expect(moveFailed(waiting, arrived, move)).toBe(false);
    expect(moveFailed(waiting, waiting, move)).toBe(false);
    // a fresh page that finds no request and the old lease: the move is over
    expect(moveFailed(null, gaveUp, move)).toBe(true);
    // the pool away says nothing about the move
    const away = state({ pool: { ...state().pool, ok: false, error: 'x' } });
    expect(moveFailed(waiting, away, move)).toBe(false);
    // from CPU only onto a GPU
    const cpu = { from: null, offer: 'a100-3g' };
    expect(moveFinished(arrived, cpu)).toBe(true);
    expect(moveFailed(state({ lease: null, pending }), state({ lease: null }), cpu)).toBe(true);
  });
  it('enables Keep my GPU only where the pool would extend', () => {
    expect(keepState(state({ notice })).enabled).toBe(true);
    expect(keepState(state({ notice: { ...notice, acting: true } })).why).toBe(
      'the reclaim has started'
    );
    const spent = { ...notice, extendable: false, extensions: 2 };
    expect(keepState(state({ notice: spent })).why).toContain('kept 2 times');
    const borrowed = { ...notice, kind: 'borrowed', extendable: false };
    expect(keepState(state({ notice: borrowed })).why).toContain('guarantee');
    expect(keepState(state()).enabled).toBe(false);
  });
  it("follows the pool's own keep rule and words where it sends them", () => {
    const drain = {
      ...notice,
      kind: 'drain',
      extendable: false,
      heading: "Node maintenance: this GPU's node is being drained",
      keep: false,
      why_not_kept: 'It cannot be kept: its node is drained for maintenance'
    };
    expect(keepState(state({ notice: drain }))).toEqual({
      enabled: false,
      why: 'It cannot be kept: its node is drained for maintenance'
    });
    const idle = { ...notice, keep: true, why_not_kept: null };
    expect(keepState(state({ notice: idle }))).toEqual({ enabled: true, why: '' });
    expect(keepState(state({ notice: { ...idle, acting: true } })).enabled).toBe(false);
  });
  it('says plainly that the GPU was reclaimed once the server is gone after its deadline', () => {
    const deadline = Date.parse(notice.deadline);
    const saved = {
      saved: ['a.ipynb', 'b.py'],
      unchanged: [],
      failed: [],
      via: 'lab' as const,
      labs: 1,
      answered: 1,
      reason: 'reclaim',
      at: deadline / 1000
    };
    const s = state({ notice, last_save: saved });
    // before the deadline, or with the server answering: the countdown stays
    expect(reclaimedText(s, true, deadline - 5000)).toBeNull();
    expect(reclaimedText(s, false, deadline + 5000)).toBeNull();
    expect(reclaimedText(state(), true, deadline + 5000)).toBeNull();
    const text = reclaimedText(s, true, deadline + 60000)!;
    const at = new Date(deadline);
    const hhmm = `${String(at.getHours()).padStart(2, '0')}:${String(at.getMinutes()).padStart(2, '0')}`;
    expect(text).toBe(
      `Your GPU was reclaimed at ${hhmm} because idle for 30 minutes; the server was stopped; ` +
        'saved: a.ipynb, b.py. Start again from Hub home.'
    );
    // the reclaimer claimed it early (acting): the server gone means it happened
    const acting = state({ notice: { ...notice, acting: true }, last_save: null });
    expect(reclaimedText(acting, true, deadline - 5000)).toContain('nothing needed saving');
    // a save from before the notice was issued is not the reclaim's
    const early = { ...notice, issued: notice.deadline, acting: true };
    const old = { ...saved, at: deadline / 1000 - 3600 };
    expect(reclaimedText(state({ notice: early, last_save: old }), true, deadline)).toContain(
      'nothing needed saving'
    );
  });
  it('counts units naturally', () => {
    expect(unitsText(1)).toBe('1 unit');
    expect(unitsText(0.5)).toBe('0.5 units');
    expect(unitsText(2, 'GPU unit')).toBe('2 GPU units');
    expect(unitsText(1, 'GPU unit')).toBe('1 GPU unit');
  });
  it('explains actions and availability', () => {
    expect(actionText('shrink:a100-1g')).toContain('restart on a100-1g');
    expect(actionText('release-gpu')).toContain('without a GPU');
    expect(doneText('stop')).toBe('the server was stopped');
    expect(doneText('shrink:a100-1g')).toBe('the server restarted on a100-1g');
    const c: IChoice = {
      name: 'h100',
      display_name: 'H100',
      description: '',
      units: 1,
      available: 0,
      queue_length: 2,
      eta_seconds: 900,
      fits: true,
      why_not: null
    };
    expect(availabilityText(c)).toBe('none free: 2 waiting, about 15 min');
    expect(availabilityText({ ...c, available: 3, queue_length: 0 })).toBe('3 free now');
  });
});

describe('reconnect backoff', () => {
  it('doubles up to the cap and resets', () => {
    const b = new Backoff(1000, 5000);
    expect([b.next(), b.next(), b.next(), b.next(), b.next()]).toEqual([
      1000, 2000, 4000, 5000, 5000
    ]);
    b.reset();
    expect(b.next()).toBe(1000);
  });
});

describe('visible', () => {
  it('shows every bidirectional control instead of obeying it', () => {
    expect(visible('\u202eevil\u202c-rtl')).toBe('[U+202E]evil[U+202C]-rtl');
    for (const c of [0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069]) {
      const hex = c.toString(16).toUpperCase();
      expect(visible(`a${String.fromCodePoint(c)}b`)).toBe(`a[U+${hex}]b`);
    }
  });

  it('leaves other text (right-to-left letters included) alone', () => {
    expect(visible('alice')).toBe('alice');
    expect(visible('שלום ‎ok')).toBe('שלום ‎ok');
    expect(visible(null)).toBe('');
  });
});

describe('the budget warning', () => {
  const quota = (
    used: number,
    budget: number | null,
    action?: IQuota['budget_action']
  ): IQuota => ({
    held_units: 0,
    guarantee: 1,
    limit: 2,
    used_unit_hours: used,
    budget,
    budget_action: action,
    period: 'month',
    resets_at: '2026-12-31T23:59:59Z'
  });

  it('says nothing below 80 % or without a budget', () => {
    expect(budgetWarning(quota(7.9, 10))).toBeNull();
    expect(budgetWarning(quota(500, null))).toBeNull();
    expect(budgetWarning(null)).toBeNull();
  });

  it('warns from 80 %, with the share used', () => {
    expect(budgetWarning(quota(8, 10))).toBe(
      'You have used 80 % of your GPU-hour budget of this month.'
    );
  });

  it("at 100 % says what happens next for the quota's action", () => {
    expect(budgetWarning(quota(10, 10, 'stop'))).toContain(
      'stopped at its end (your work is saved first)'
    );
    expect(budgetWarning(quota(12, 10, 'notify'))).toContain('you may go on');
    expect(budgetWarning(quota(10, 10))).toBe(
      'Your GPU-hour budget of this month is spent: no new GPU is granted until the next month; what runs goes on.'
    );
  });
});

describe("endedText (the pool's record once the server is gone)", () => {
  const end = (over: Partial<ILeaseEnd> = {}): ILeaseEnd => ({
    lease: 'L1',
    state: 'released',
    ended: true,
    offer: 'a100-1g',
    offer_name: 'A100 · 1g.10gb slice',
    at: '2026-03-02T14:02:00Z',
    release_reason: 'reclaimed-idle',
    reclaimed: true,
    kind: 'idle',
    reason: 'the GPU has been idle for 30 min',
    action: 'stop',
    saved: ['a.ipynb', 'b.py'],
    outcome: 'done',
    ...over
  });
  const hhmm = clock(new Date('2026-03-02T14:02:00Z'));

  it('says when, why, what it did and what was saved, with the way back', () => {
    expect(endedText(end())).toEqual({
      word: 'reclaimed',
      text:
        `Your GPU was reclaimed at ${hhmm} because the GPU has been idle for 30 min; ` +
        'the server was stopped; saved: a.ipynb, b.py. Start again from Hub home.'
    });
    const drain = endedText(
      end({ kind: 'drain', reason: 'its node is drained', action: 'release-gpu', saved: [] })
    )!;
    expect(drain.text).toContain(
      'because its node is drained; the server restarted without a GPU; nothing needed saving'
    );
  });

  it('names other ends by their reason, and nothing while the lease lives', () => {
    const stopped = endedText(
      end({ reclaimed: false, reason: null, release_reason: 'stopped', saved: [] })
    )!;
    expect(stopped.word).toBe('ended');
    expect(stopped.text).toBe(
      `Your GPU lease (A100 · 1g.10gb slice) ended at ${hhmm}: the server was stopped. Start again from Hub home.`
    );
    expect(endedText(end({ ended: false, state: 'active' }))).toBeNull();
    expect(endedText(null)).toBeNull();
  });
});

describe('statusText beyond the state', () => {
  it('shows the old GPU during a move, not "CPU only"', () => {
    const old = state().lease!;
    const t = statusText(state({ lease: null }), 0, { lease: old });
    expect(t.device).toBe('A100 1g.10gb');
    expect(statusText(state({ lease: null }), 0).device).toBe('CPU only');
  });

  it('says reclaimed once the server is gone, not a stale device or 0:00', () => {
    const t = statusText(state(), 0, {
      ended: { word: 'reclaimed', text: 'Your GPU was reclaimed at 14:02' }
    });
    expect(t).toEqual({
      device: 'reclaimed',
      util: '',
      memory: '',
      tone: 'down',
      label: 'Your GPU was reclaimed at 14:02'
    });
  });
});

describe('staleWidgetOutputs', () => {
  it('finds widget views whose model the notebook did not save', () => {
    const outputs = [
      { data: { 'text/plain': 'hello' } },
      {
        data: {
          [WIDGET_VIEW]: { model_id: 'gone', version_major: 2 },
          'text/plain': 'GPUPoolWidget()'
        }
      },
      { data: { [WIDGET_VIEW]: { model_id: 'kept' } } },
      { data: null },
      {}
    ];
    expect(staleWidgetOutputs(outputs, new Set(['kept']))).toEqual([1]);
    expect(staleWidgetOutputs(outputs, new Set())).toEqual([1, 2]);
    expect(STALE_WIDGET_TEXT).toContain('run the cell again');
  });
});
