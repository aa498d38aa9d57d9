import {
  IJob,
  IJobLog,
  JobsView,
  Requester,
  appendLog,
  jobStateText,
  ordinal,
  shownJobs
} from '../jobs';

function job(over: Partial<IJob> = {}): IJob {
  return {
    id: 'j1',
    name: 'resnet',
    offer: 'h100',
    class: 'training',
    state: 'running',
    position: null,
    node: 'node-h100',
    started: '2026-03-02T09:00:00Z',
    ended: null,
    exit_code: null,
    notice_deadline: null,
    reason: null,
    ...over
  };
}

/** A pool in memory behind the server's routes: jobs, their output, and the calls made. */
class Pool {
  calls: string[] = [];
  logs: Record<string, string> = {};
  complete: Record<string, boolean> = {};
  constructor(public jobs: IJob[]) {}

  request: Requester = async <T>(path: string, method: string): Promise<T> => {
    this.calls.push(`${method} ${path}`);
    if (method === 'GET' && path === 'jobs') {
      return { jobs: this.jobs } as T;
    }
    const logs = path.match(/^jobs\/([^/]+)\/logs\?offset=(\d+)$/);
    if (method === 'GET' && logs) {
      const text = this.logs[logs[1]] || '';
      const from = Number(logs[2]);
      const part: IJobLog = {
        offset: from,
        data: text.slice(from),
        next: text.length,
        complete: !!this.complete[logs[1]]
      };
      return part as T;
    }
    const one = path.match(/^jobs\/([^/]+)$/);
    if (method === 'DELETE' && one) {
      const j = this.jobs.find(x => x.id === one[1]);
      if (!j) {
        throw new Error(`no job '${one[1]}'`);
      }
      j.state = j.state === 'queued' ? 'cancelled' : 'cancelling';
      return j as T;
    }
    throw new Error(`unexpected ${method} ${path}`);
  };
}

const tick = () => new Promise(r => setTimeout(r, 0));

/** Wait for `check` (the view polls on its own timer), failing after a generous bound. */
async function until(check: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!check()) {
    if (Date.now() > end) {
      throw new Error('not within the bound');
    }
    await new Promise(r => setTimeout(r, 5));
  }
}

describe('job wording', () => {
  it('says the place in line, where it runs and how it ended', () => {
    expect(jobStateText(job({ state: 'queued', position: 2, node: null }))).toBe(
      'queued, 2nd in line'
    );
    expect(jobStateText(job())).toBe('running on node-h100');
    expect(jobStateText(job({ state: 'failed', exit_code: 3 }))).toBe('failed (exit code 3)');
    expect(jobStateText(job({ state: 'cancelled', reason: 'cancelled by user:alice' }))).toBe(
      'cancelled (by user:alice)'
    );
    expect(jobStateText(job({ state: 'preempted', reason: 'for bob' }))).toBe('preempted: for bob');
    expect(jobStateText(job({ state: 'cancelling' }))).toBe('stopping (cancelled)');
  });

  it('writes ordinals as people do', () => {
    expect([1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].map(ordinal)).toEqual([
      '1st',
      '2nd',
      '3rd',
      '4th',
      '11th',
      '12th',
      '13th',
      '21st',
      '22nd',
      '101st',
      '111th'
    ]);
  });

  it('lists every live job and only the newest ended ones', () => {
    const jobs = [
      job({ id: 'a', state: 'succeeded' }),
      job({ id: 'b', state: 'queued' }),
      job({ id: 'c', state: 'failed' }),
      job({ id: 'd', state: 'cancelled' }),
      job({ id: 'e', state: 'running' })
    ];
    expect(shownJobs(jobs, 2).map(j => j.id)).toEqual(['a', 'b', 'c', 'e']);
  });

  it('keeps the latest output within its bound', () => {
    expect(appendLog('abc', 'def', 4)).toBe('cdef');
    expect(appendLog('', 'xy', 4)).toBe('xy');
  });
});

describe('JobsView', () => {
  it('lists the jobs with Cancel only where it does something', async () => {
    const pool = new Pool([
      job({ id: 'q', name: 'sweep', state: 'queued', position: 1, node: null }),
      job({ id: 'r', name: 'resnet' }),
      job({ id: 'd', name: 'old', state: 'succeeded', exit_code: 0 })
    ]);
    const view = new JobsView(pool.request, 10);
    await view.refresh();
    const rows = Array.from(view.node.querySelectorAll<HTMLElement>('li.jp-GPUPool-job'));
    expect(rows.map(r => r.dataset.job)).toEqual(['q', 'r', 'd']);
    expect(rows[0].querySelector('.jp-GPUPool-jobState')!.textContent).toBe('queued, 1st in line');
    expect(rows[0].querySelector('.jp-GPUPool-jobClass')!.textContent).toBe('training');
    expect(rows.map(r => !!r.querySelector('.jp-GPUPool-jobCancel'))).toEqual([true, true, false]);
  });

  it('cancels a queued job and shows its new state', async () => {
    const pool = new Pool([job({ id: 'q', name: 'sweep', state: 'queued', position: 1 })]);
    const view = new JobsView(pool.request, 10);
    await view.refresh();
    (view.node.querySelector('.jp-GPUPool-jobCancel') as HTMLButtonElement).click();
    await tick();
    await tick();
    expect(pool.calls).toContain('DELETE jobs/q');
    const row = view.node.querySelector('li[data-job="q"]') as HTMLElement;
    expect(row.dataset.state).toBe('cancelled');
    expect(row.querySelector('.jp-GPUPool-jobCancel')).toBeNull();
    expect(view.node.querySelector('.jp-GPUPool-jobMessage')!.textContent).toBe(
      'sweep: cancelled.'
    );
  });

  it('says a refused cancel', async () => {
    const pool = new Pool([job({ id: 'gone' })]);
    const view = new JobsView(pool.request, 10);
    await view.refresh();
    pool.jobs = [];
    await view.cancel(job({ id: 'gone' }));
    const message = view.node.querySelector('.jp-GPUPool-jobMessage')!;
    expect(message.textContent).toBe("Could not cancel resnet: no job 'gone'");
    expect(message.classList.contains('jp-GPUPool-error')).toBe(true);
  });

  it('follows a running job output from where it left off until it ends', async () => {
    const pool = new Pool([job({ id: 'r' })]);
    pool.logs.r = 'epoch 1\n';
    const view = new JobsView(pool.request, 5);
    await view.refresh();
    await view.showLog(pool.jobs[0]);
    const text = view.node.querySelector('.jp-GPUPool-jobLogText')!;
    expect(text.textContent).toBe('epoch 1\n');
    pool.logs.r += 'epoch 2\n';
    pool.complete.r = true;
    await until(() => text.textContent === 'epoch 1\nepoch 2\n');
    expect(pool.calls.filter(c => c.startsWith('GET jobs/r/logs'))).toEqual([
      'GET jobs/r/logs?offset=0',
      'GET jobs/r/logs?offset=8'
    ]);
    await new Promise(r => setTimeout(r, 50)); // ten poll intervals: none asked, it ended
    expect(pool.calls.filter(c => c.startsWith('GET jobs/r/logs')).length).toBe(2);
    view.closeLog();
    expect((view.node.querySelector('.jp-GPUPool-jobLog') as HTMLElement).hidden).toBe(true);
  });

  it('shows names as text, bidi controls visible', async () => {
    const pool = new Pool([job({ name: '<img src=x>\u202eevil' })]);
    const view = new JobsView(pool.request, 10);
    await view.refresh();
    expect(view.node.querySelector('img')).toBeNull();
    expect(view.node.querySelector('.jp-GPUPool-jobName')!.textContent).toContain('<img src=x>');
    expect(view.node.querySelector('.jp-GPUPool-jobName')!.textContent).not.toContain('\u202e');
  });
});
