import { renderChart, series, summary } from '../chart';

describe('charts have a text alternative', () => {
  const samples = [
    { ts: 1000, util: 20, memory_used_mib: 100 },
    { ts: 1060, util: null, memory_used_mib: 150 },
    { ts: 1120, util: 80, memory_used_mib: 300 }
  ];
  it('summarises the figures', () => {
    const s = series(
      samples,
      p => p.util,
      'GPU activity',
      '%',
      100,
      v => `${v}%`
    );
    expect(summary(s)).toBe(
      'GPU activity over the last 15 minutes: now 80%, lowest 20%, highest 80%'
    );
    const none = series(
      [],
      p => p.util,
      'GPU activity',
      '%',
      100,
      v => `${v}%`
    );
    expect(summary(none)).toContain('no readings');
  });
  it('draws an SVG with role img and a table of the figures', () => {
    const host = document.createElement('div');
    const s = series(
      samples,
      p => p.memory_used_mib,
      'Memory',
      'MiB',
      400,
      v => `${v} MiB`
    );
    renderChart(host, s, 900, 1200);
    const svg = host.querySelector('svg')!;
    expect(svg.getAttribute('role')).toBe('img');
    expect(svg.getAttribute('aria-label')).toContain('now 300 MiB');
    expect(host.querySelector('path')!.getAttribute('d')).toMatch(/^M.* L.* L/);
    const rows = host.querySelectorAll('tr');
    expect(rows.length).toBe(3);
    expect(host.querySelector('caption')!.textContent).toBe('Memory');
  });
});
