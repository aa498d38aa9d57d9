/* The pool's charts: the admin map page's utilization heat map and history, and the user
 * page's own usage (Chart.js from vendor/, drawn on canvases: labels are text, never markup).
 */
'use strict';

(function () {
  const { api, status } = window.gpupool;

  // -- charts ------------------------------------------------------------------------------

  function heatColor(v) {
    if (v === null || v === undefined) return '#eee';
    const t = Math.max(0, Math.min(1, v / 100));
    return `hsl(${210 - 210 * t}, 70%, ${92 - 45 * t}%)`;
  }

  async function poolCharts() {
    if (!window.Chart) return;
    const h = await api('GET', 'pool/history?hours=24&step=900');
    const labels = h.times.map(t => new Date(t * 1000).toISOString().slice(11, 16));
    const free = h.used.map(u => Math.max(0, h.capacity - u));
    new Chart(document.getElementById('units'), {
      type: 'line',
      data: {
        labels,
        datasets: [
          {
            label: 'used',
            data: h.used,
            borderColor: '#1a7f37',
            backgroundColor: '#1a7f3733',
            fill: true,
            pointRadius: 0
          },
          { label: 'free', data: free, borderColor: '#0b5cad', pointRadius: 0 },
          { label: 'queued', data: h.queued, borderColor: '#b42318', pointRadius: 0 }
        ]
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        scales: { y: { beginAtZero: true, title: { display: true, text: 'GPU units' } } }
      }
    });
    const gpus = Object.keys(h.heatmap).sort();
    const cells = [];
    gpus.forEach(g => h.heatmap[g].forEach((v, i) => cells.push({ x: i, y: g, v })));
    const canvas = document.getElementById('heatmap');
    canvas.parentNode.style.height = `${Math.min(600, 60 + 14 * Math.max(1, gpus.length))}px`;
    new Chart(canvas, {
      type: 'matrix',
      data: {
        datasets: [
          {
            label: 'utilization %',
            data: cells,
            backgroundColor: c => heatColor(c.raw && c.raw.v),
            width: ({ chart }) => (chart.chartArea || {}).width / Math.max(1, h.times.length) - 1,
            height: ({ chart }) => (chart.chartArea || {}).height / Math.max(1, gpus.length) - 1
          }
        ]
      },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        plugins: {
          legend: { display: false },
          tooltip: {
            callbacks: {
              title: i => i[0].raw.y,
              label: i => `${labels[i.raw.x]}: ${i.raw.v ?? 'no data'} %`
            }
          }
        },
        scales: {
          x: {
            type: 'linear',
            min: -0.5,
            max: h.times.length - 0.5,
            ticks: { stepSize: 8, callback: v => labels[v] || '' },
            grid: { display: false }
          },
          y: {
            type: 'category',
            labels: gpus,
            offset: true,
            ticks: { display: gpus.length <= 40 },
            grid: { display: false }
          }
        }
      }
    });
  }

  function userCharts() {
    if (!window.Chart) return;
    for (const canvas of document.querySelectorAll('canvas.sparkline')) {
      const values = JSON.parse(canvas.dataset.values || '[]');
      new Chart(canvas, {
        type: 'line',
        data: {
          labels: values.map((_, i) => i),
          datasets: [
            {
              data: values,
              borderColor: '#0b5cad',
              borderWidth: 1.5,
              pointRadius: 0,
              spanGaps: true
            }
          ]
        },
        options: {
          animation: false,
          responsive: false,
          plugins: { legend: { display: false }, tooltip: { enabled: false } },
          scales: { x: { display: false }, y: { display: false, min: 0, max: 100 } }
        }
      });
    }
    const history = document.getElementById('gpupool-history');
    if (history) {
      const days = JSON.parse(history.dataset.history || '[]');
      new Chart(history, {
        type: 'bar',
        data: {
          labels: days.map(d => d.day.slice(5)),
          datasets: [
            { label: 'held GPU-hours', data: days.map(d => d.held), backgroundColor: '#9ec5ee' },
            { label: 'busy GPU-hours', data: days.map(d => d.busy), backgroundColor: '#1a7f37' }
          ]
        },
        options: {
          animation: false,
          responsive: true,
          maintainAspectRatio: false,
          scales: { y: { beginAtZero: true } }
        }
      });
    }
  }

  document.addEventListener('DOMContentLoaded', () => {
    const page = document.body.dataset.page;
    if (page === 'admin_map') poolCharts().catch(e => status(`Charts: ${e.message}`, true));
    if (page === 'user') userCharts();
  });
})();
