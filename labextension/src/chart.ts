/**
 * A small SVG line chart of the last minutes, with a text alternative: the SVG has
 * role="img" and an aria-label with the latest, lowest and highest values, and a visually
 * hidden table holds the figures for screen readers.
 */
import { visible } from './format';
import { ISample } from './types';

const W = 280;
const H = 56;

export interface ISeries {
  label: string;
  unit: string;
  max: number;
  values: { ts: number; v: number | null }[];
  format: (v: number) => string;
}

export function series(
  samples: ISample[],
  pick: (s: ISample) => number | null,
  label: string,
  unit: string,
  max: number,
  format: (v: number) => string
): ISeries {
  return { label, unit, max, format, values: samples.map(s => ({ ts: s.ts, v: pick(s) })) };
}

export function summary(s: ISeries): string {
  const known = s.values.map(p => p.v).filter((v): v is number => v !== null);
  if (!known.length) {
    return `${s.label}: no readings in the last 15 minutes`;
  }
  const last = known[known.length - 1];
  return (
    `${s.label} over the last 15 minutes: now ${s.format(last)}, ` +
    `lowest ${s.format(Math.min(...known))}, highest ${s.format(Math.max(...known))}`
  );
}

export function renderChart(
  host: HTMLElement,
  s: ISeries,
  windowSeconds: number,
  now: number
): void {
  host.textContent = '';
  const svgNS = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(svgNS, 'svg');
  svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', summary(s));
  svg.classList.add('jp-GPUPool-chart');
  const start = now - windowSeconds;
  const x = (ts: number) => ((ts - start) / windowSeconds) * W;
  const y = (v: number) => H - 2 - (Math.min(v, s.max) / (s.max || 1)) * (H - 4);
  let d = '';
  let pen = false;
  for (const p of s.values) {
    if (p.v === null || p.ts < start) {
      pen = false;
      continue;
    }
    d += `${pen ? 'L' : 'M'}${x(p.ts).toFixed(1)},${y(p.v).toFixed(1)} `;
    pen = true;
  }
  const base = document.createElementNS(svgNS, 'line');
  base.setAttribute('x1', '0');
  base.setAttribute('x2', String(W));
  base.setAttribute('y1', String(H - 1));
  base.setAttribute('y2', String(H - 1));
  base.classList.add('jp-GPUPool-chart-axis');
  svg.appendChild(base);
  const path = document.createElementNS(svgNS, 'path');
  path.setAttribute('d', d.trim());
  path.classList.add('jp-GPUPool-chart-line');
  svg.appendChild(path);
  host.appendChild(svg);
  // the figures as a table for screen readers (one row a minute)
  const table = document.createElement('table');
  table.className = 'jp-GPUPool-sr-only';
  const caption = document.createElement('caption');
  caption.textContent = visible(s.label);
  table.appendChild(caption);
  let lastMinute = -1;
  for (const p of s.values) {
    const minute = Math.floor(p.ts / 60);
    if (p.v === null || minute === lastMinute) {
      continue;
    }
    lastMinute = minute;
    const row = table.insertRow();
    row.insertCell().textContent = new Date(p.ts * 1000).toLocaleTimeString();
    row.insertCell().textContent = s.format(p.v);
  }
  host.appendChild(table);
}
