/* The user page's "My jobs": Cancel (confirmed, then ``DELETE jobs/{id}``) and the job's recent
 * output (``GET jobs/{id}/logs``, followed while the job runs). Output is set as text, never
 * parsed as HTML; every call carries the hub's XSRF token (gpupool.js's ``api``).
 */
'use strict';

(function () {
  const { act, api, confirmDialog, status } = window.gpupool;

  // The most output the page keeps in view (the latest characters).
  const SHOWN = 200 * 1024;
  // How often a running job's output is fetched again (ms).
  const FOLLOW_MS = 3000;

  let following = null; // the job whose output is shown: { id, next, timer }

  async function showLog(id, name) {
    const box = document.getElementById('gpupool-job-log');
    const pre = box.querySelector('pre');
    if (following) clearTimeout(following.timer);
    following = { id, next: 0, timer: null };
    box.hidden = false;
    box.dataset.job = id;
    document.getElementById('gpupool-job-log-title').textContent = `Output of ${name}`;
    pre.textContent = '';
    const me = following;
    const poll = async () => {
      if (following !== me) return;
      try {
        const part = await api('GET', `jobs/${encodeURIComponent(id)}/logs?offset=${me.next}`);
        if (following !== me) return;
        const text = pre.textContent + part.data;
        pre.textContent = text.length > SHOWN ? text.slice(-SHOWN) : text;
        if (!pre.textContent) pre.textContent = part.complete ? '(no output)' : '';
        me.next = part.next;
        box.dataset.complete = String(part.complete);
        if (!part.complete) me.timer = setTimeout(poll, FOLLOW_MS);
      } catch (e) {
        status(`Output of ${name}: ${e.message}`, true);
      }
    };
    await poll();
  }

  async function cancel(id, name, state) {
    const v = await confirmDialog({
      title: 'Cancel this job',
      text:
        state === 'queued'
          ? `${name} leaves the queue.`
          : state === 'granted'
            ? `${name} does not start; its GPU is given back.`
            : `${name} is stopped (SIGTERM, then SIGKILL) and its GPU given back.`,
      ok: 'Cancel job'
    });
    if (!v) return;
    return act('Cancel', () => api('DELETE', `jobs/${encodeURIComponent(id)}`));
  }

  document.addEventListener('click', event => {
    const b = event.target.closest('button[data-job-action]');
    if (!b) return;
    const { job, name } = b.dataset;
    if (b.dataset.jobAction === 'logs') showLog(job, name);
    else if (b.dataset.jobAction === 'cancel')
      cancel(job, name, b.closest('tr[data-state]')?.dataset.state);
  });
})();
