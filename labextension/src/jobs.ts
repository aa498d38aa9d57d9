/**
 * "My jobs" in the side panel: the user's jobs (training, inference) from the server's
 * `gpupool/jobs` (the pool's, asked with the server's token), their state and place in line,
 * Cancel, and a job's recent output followed while it runs. Plain DOM; every value is text.
 */
import { visible } from './format';
import { el } from './dom';

/** A job as the pool's `GET jobs` gives it (the fields the panel shows). */
export interface IJob {
  id: string;
  name: string;
  offer: string;
  class: string;
  state: string;
  position: number | null;
  node: string | null;
  started: string | null;
  ended: string | null;
  exit_code: number | null;
  notice_deadline: string | null;
  reason: string | null;
}

/** A piece of a job's output (`GET jobs/<id>/logs?offset=`). */
export interface IJobLog {
  offset: number;
  data: string;
  next: number;
  complete: boolean;
}

/** How the panel reaches the server's routes (the model's `request`). */
export type Requester = <T>(path: string, method: string, body?: unknown) => Promise<T>;

/** States that end a job: no Cancel, no more output. */
export const FINAL = ['succeeded', 'failed', 'cancelled', 'preempted'];
/** States in which Cancel does something (a `cancelling` job is already being stopped). */
export const CANCELLABLE = ['queued', 'granted', 'running', 'preempting'];
/** Ended jobs the panel lists (the newest); the user page and `job list` show them all. */
export const ENDED_SHOWN = 5;
/** The most output the panel keeps in view (the latest characters). */
export const LOG_SHOWN = 64 * 1024;

/** "1st", "2nd", "3rd", "11th", "22nd". */
export function ordinal(n: number): string {
  const teen = n % 100 >= 11 && n % 100 <= 13;
  const suffix = teen ? 'th' : ({ 1: 'st', 2: 'nd', 3: 'rd' } as Record<number, string>)[n % 10];
  return `${n}${suffix || 'th'}`;
}

/** A job's state in words: its place in line, where it runs, how it ended. */
export function jobStateText(job: IJob): string {
  switch (job.state) {
    case 'queued':
      return job.position ? `queued, ${ordinal(job.position)} in line` : 'queued';
    case 'granted':
      return `starting${job.node ? ` on ${job.node}` : ''}`;
    case 'running':
      return `running${job.node ? ` on ${job.node}` : ''}`;
    case 'preempting':
      return `preempted: stops${job.notice_deadline ? ` at ${clockOf(job.notice_deadline)}` : ' soon'}`;
    case 'cancelling':
      return 'stopping (cancelled)';
    case 'succeeded':
    case 'failed':
      return `${job.state}${job.exit_code === null ? '' : ` (exit code ${job.exit_code})`}`;
    case 'cancelled':
      // the pool's reason says who: "cancelled by user:alice"
      return job.reason ? `cancelled (${job.reason.replace(/^cancelled /, '')})` : 'cancelled';
    default:
      return job.reason ? `${job.state}: ${job.reason}` : job.state;
  }
}

function clockOf(iso: string): string {
  const d = new Date(iso);
  return isNaN(d.getTime()) ? iso : d.toLocaleTimeString();
}

/** The jobs the panel lists, newest first: every one not ended, and the last `ended`. */
export function shownJobs(jobs: IJob[], ended = ENDED_SHOWN): IJob[] {
  let done = 0;
  return jobs.filter(j => !FINAL.includes(j.state) || ++done <= ended);
}

/** The output in view after a new piece: at most `max` characters, the latest kept. */
export function appendLog(shown: string, data: string, max = LOG_SHOWN): string {
  const text = shown + data;
  return text.length > max ? text.slice(text.length - max) : text;
}

/** The "My jobs" section: refreshed by `refresh()`, with Cancel and a Logs view per job. */
export class JobsView {
  readonly node = el('section', 'jp-GPUPool-section jp-GPUPool-jobs');
  private list = el('ul', 'jp-GPUPool-jobList');
  private message = el('p', 'jp-GPUPool-jobMessage');
  private logBox = el('div', 'jp-GPUPool-jobLog');
  private logTitle = el('h4', 'jp-GPUPool-jobLogTitle');
  private logText = el('pre', 'jp-GPUPool-jobLogText');
  private jobs: IJob[] = [];
  /** the job whose output is shown, and the offset of its next piece */
  private following: { id: string; next: number; timer: number | null } | null = null;

  constructor(
    private request: Requester,
    private followMs = 3000
  ) {
    const h = el('h3', 'jp-GPUPool-subheading', 'My jobs');
    h.id = 'jp-gpupool-h-my-jobs';
    this.node.setAttribute('aria-labelledby', h.id);
    this.message.setAttribute('role', 'status');
    this.logBox.hidden = true;
    this.logBox.setAttribute('aria-live', 'polite');
    this.logText.tabIndex = 0;
    const close = el('button', 'jp-Button jp-mod-styled jp-GPUPool-jobLogClose', 'Close output');
    close.type = 'button';
    close.addEventListener('click', () => this.closeLog());
    this.logBox.append(this.logTitle, this.logText, close);
    this.node.append(h, this.message, this.list, this.logBox);
  }

  /** Ask the server for the jobs again and redraw them. */
  async refresh(): Promise<void> {
    try {
      const answer = await this.request<{ jobs: IJob[] }>('jobs', 'GET');
      this.jobs = shownJobs(answer.jobs || []);
      this.render();
    } catch (e) {
      this.say(`Could not read your jobs: ${(e as Error).message}`, true);
    }
  }

  private say(text: string, error = false): void {
    this.message.textContent = visible(text);
    this.message.classList.toggle('jp-GPUPool-error', error);
  }

  private render(): void {
    this.list.textContent = '';
    if (!this.jobs.length) {
      this.list.append(
        el('li', 'jp-GPUPool-noJobs', 'No jobs. Submit one with `jupyterhub-gpupool job submit`.')
      );
      return;
    }
    for (const job of this.jobs) {
      const li = el('li', 'jp-GPUPool-job');
      li.dataset.job = job.id;
      li.dataset.state = job.state;
      const name = el('span', 'jp-GPUPool-jobName', job.name);
      const cls = el('span', `jp-GPUPool-jobClass jp-GPUPool-class-${job.class}`, job.class);
      const state = el('span', 'jp-GPUPool-jobState', jobStateText(job));
      const logs = el('button', 'jp-Button jp-mod-styled jp-GPUPool-jobLogs', 'Logs');
      logs.type = 'button';
      logs.setAttribute('aria-label', visible(`Output of ${job.name}`));
      logs.addEventListener('click', () => void this.showLog(job));
      li.append(name, ' ', cls, ' ', state, ' ', logs);
      if (CANCELLABLE.includes(job.state)) {
        const cancel = el(
          'button',
          'jp-Button jp-mod-styled jp-mod-reject jp-GPUPool-jobCancel',
          'Cancel'
        );
        cancel.type = 'button';
        cancel.setAttribute('aria-label', visible(`Cancel ${job.name}`));
        cancel.addEventListener('click', () => void this.cancel(job));
        li.append(' ', cancel);
      }
      this.list.append(li);
    }
  }

  /** Cancel a job (the pool's answer is its new state) and redraw. */
  async cancel(job: IJob): Promise<void> {
    try {
      const now = await this.request<IJob>(`jobs/${encodeURIComponent(job.id)}`, 'DELETE');
      this.say(`${job.name}: ${jobStateText(now)}.`);
    } catch (e) {
      this.say(`Could not cancel ${job.name}: ${(e as Error).message}`, true);
    }
    await this.refresh();
  }

  /** Show a job's output, followed while the job runs. */
  async showLog(job: IJob): Promise<void> {
    this.closeLog();
    const me = { id: job.id, next: 0, timer: null as number | null };
    this.following = me;
    this.logBox.hidden = false;
    this.logBox.dataset.job = job.id;
    this.logTitle.textContent = visible(`Output of ${job.name}`);
    this.logText.textContent = '';
    await this.poll(me);
  }

  private async poll(me: { id: string; next: number; timer: number | null }): Promise<void> {
    if (this.following !== me) {
      return;
    }
    try {
      const part = await this.request<IJobLog>(
        `jobs/${encodeURIComponent(me.id)}/logs?offset=${me.next}`,
        'GET'
      );
      if (this.following !== me) {
        return;
      }
      this.logText.textContent = appendLog(this.logText.textContent || '', part.data);
      me.next = part.next;
      this.logBox.dataset.complete = String(part.complete);
      if (part.complete && !this.logText.textContent) {
        this.logText.textContent = '(no output)';
      }
      if (!part.complete) {
        me.timer = window.setTimeout(() => void this.poll(me), this.followMs);
      }
    } catch (e) {
      this.say(`Could not read the output: ${(e as Error).message}`, true);
    }
  }

  closeLog(): void {
    if (this.following?.timer) {
      window.clearTimeout(this.following.timer);
    }
    this.following = null;
    this.logBox.hidden = true;
  }

  dispose(): void {
    this.closeLog();
  }
}
