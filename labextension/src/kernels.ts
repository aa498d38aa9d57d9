/**
 * GPU kernels (issue 36) where the user looks: a JupyterLab notification while a GPU kernel
 * waits for its GPU ("Waiting for a GPU (A100 1g.10gb): position 2 in the queue, about 3 min",
 * updated in place, with Cancel; gone once the kernel starts or fails), one for the pool's idle
 * notice to a running GPU kernel, and the "GPU kernels" list of the side panel (the user's
 * kernel leases from the pool). Plain DOM; every value is text.
 */
import type { Notification } from '@jupyterlab/apputils';

import { durationText, visible } from './format';
import { ordinal } from './jobs';
import { IKernelLease, IKernelNotice, IKernelStart, IKernelStarts } from './types';
import { el, when } from './dom';

/** The notifications API as used here: JupyterLab's `Notification` (tests pass their own). */
export interface INotifier {
  emit(
    message: string,
    type: Notification.TypeOptions,
    options: Notification.IOptions<null>
  ): string;
  update(args: Notification.IUpdate<null>): boolean;
  dismiss(id: string): void;
}

/** "about 3 min", "any moment", or nothing where the pool has no estimate yet. */
export function etaText(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) {
    return '';
  }
  return seconds < 30 ? 'any moment' : durationText(seconds);
}

/** What a waiting GPU kernel start says: its offer, its place in the queue, the estimate. */
export function waitingText(w: IKernelStart): string {
  const gpu = w.offer_name || w.offer;
  if (w.state === 'preparing') {
    return `Preparing the GPU (${gpu}) for your kernel: it starts in a moment.`;
  }
  const where = w.position ? `position ${w.position} in the queue` : 'in the queue';
  const eta = etaText(w.eta_seconds);
  return `Waiting for a GPU (${gpu}): ${where}, ${eta || 'no estimate yet'}`;
}

/** What the pool's idle notice to a GPU kernel says in the lab: always that its variables
 * will be lost (the pool's words say so; said again where an older pool's do not). */
export function noticeText(n: IKernelNotice): string {
  const head = `GPU kernel ${n.display_name || n.offer_name || n.offer}: `;
  const lost = /variables will be lost/i.test(n.message)
    ? ''
    : ' Its variables will be lost (the notebook is kept).';
  return head + n.message + lost;
}

/**
 * Keeps one notification per waiting start and per notice, in step with the server's board:
 * emitted once, updated in place when the position or estimate changes, dismissed when the
 * start is over (started, failed, cancelled) or the notice is gone. When a notice comes, and
 * again when it goes (the kernel reclaimed, or a cell ran), the notebooks on that kernel are
 * saved (`save`): the kernel may be shut down, the notebook is kept on disk.
 */
export class KernelNotifications {
  private shown = new Map<string, { id: string; text: string }>();

  constructor(
    private cancel: (kernelId: string) => Promise<void>,
    private notes: INotifier,
    private save: (kernelId: string) => Promise<unknown> = async () => undefined
  ) {}

  /** The notifications now on screen, by key (`wait:<kernel>`, `notice:<kernel>`). */
  get ids(): Map<string, string> {
    return new Map([...this.shown].map(([k, v]) => [k, v.id]));
  }

  update(board: IKernelStarts): void {
    const wanted = new Map<
      string,
      { text: string; type: Notification.TypeOptions; actions: Notification.IAction[] }
    >();
    for (const w of board.waiting) {
      wanted.set(`wait:${w.kernel_id}`, {
        text: visible(waitingText(w)),
        type: 'in-progress',
        actions: [
          {
            label: 'Cancel',
            caption: 'Give the place in the queue back: the kernel does not start',
            displayType: 'warn',
            callback: () => void this.cancel(w.kernel_id)
          }
        ]
      });
    }
    for (const n of board.notices) {
      wanted.set(`notice:${n.kernel_id}`, {
        text: visible(noticeText(n)),
        type: 'warning',
        actions: []
      });
    }
    for (const [key, was] of [...this.shown]) {
      if (!wanted.has(key)) {
        this.notes.dismiss(was.id);
        this.shown.delete(key);
        this.saveFor(key);
      }
    }
    for (const [key, want] of wanted) {
      const was = this.shown.get(key);
      const options = { autoClose: false as const, actions: want.actions };
      if (!was) {
        const id = this.notes.emit(want.text, want.type, options);
        this.shown.set(key, { id, text: want.text });
        this.saveFor(key);
      } else if (was.text !== want.text) {
        this.notes.update({ id: was.id, message: want.text, type: want.type, ...options });
        was.text = want.text;
      }
    }
  }

  private saveFor(key: string): void {
    if (key.startsWith('notice:')) {
      void this.save(key.slice('notice:'.length)).catch(e =>
        console.warn(`GPU pool: saving before the kernel goes: ${String(e)}`)
      );
    }
  }

  dispose(): void {
    for (const was of this.shown.values()) {
      this.notes.dismiss(was.id);
    }
    this.shown.clear();
  }
}

/** The device a kernel lease holds: its MIG device, else its GPU. */
export function kernelDevice(k: IKernelLease): string {
  const parts = (k.devices || []).map(d => d.mig?.uuid || d.gpu || '').filter(Boolean);
  return parts.join(', ') || '–';
}

/** A kernel lease's state in words. */
export function kernelStateText(k: IKernelLease): string {
  switch (k.state) {
    case 'queued': {
      const eta = etaText(k.eta_seconds);
      return (
        (k.position ? `queued, ${ordinal(k.position)} in line` : 'queued') + (eta ? `, ${eta}` : '')
      );
    }
    case 'granted':
      return 'starting';
    case 'active':
      return k.notice ? 'running (idle notice)' : 'running';
    case 'reclaiming':
      return 'being reclaimed';
    default:
      return k.state;
  }
}

/** How the panel reaches the server's routes (the model's `request`). */
export type Requester = <T>(path: string, method: string, body?: unknown) => Promise<T>;

/** The "GPU kernels" section: the user's kernel leases (any server of theirs), from the pool. */
export class KernelsView {
  readonly node = el('section', 'jp-GPUPool-section jp-GPUPool-kernels');
  private list = el('ul', 'jp-GPUPool-kernelList');
  private message = el('p', 'jp-GPUPool-jobMessage');

  constructor(
    private request: Requester,
    private offerName: (offer: string) => string = offer => offer
  ) {
    const h = el('h3', 'jp-GPUPool-subheading', 'GPU kernels');
    h.id = 'jp-gpupool-h-gpu-kernels';
    this.node.setAttribute('aria-labelledby', h.id);
    this.message.setAttribute('role', 'status');
    this.node.append(h, this.message, this.list);
  }

  /** Ask the server for the kernel leases again and redraw them. */
  async refresh(): Promise<void> {
    try {
      const answer = await this.request<{ kernels: IKernelLease[] }>('kernels', 'GET');
      this.render(answer.kernels || []);
      this.message.textContent = '';
      this.message.classList.remove('jp-GPUPool-error');
    } catch (e) {
      this.message.textContent = visible(
        `Could not read your GPU kernels: ${(e as Error).message}`
      );
      this.message.classList.add('jp-GPUPool-error');
    }
  }

  render(kernels: IKernelLease[]): void {
    this.list.textContent = '';
    if (!kernels.length) {
      this.list.append(
        el(
          'li',
          'jp-GPUPool-noJobs',
          'No GPU kernels. Pick a "Python 3 (GPU: …)" kernel to run one notebook on a GPU.'
        )
      );
      return;
    }
    for (const k of kernels) {
      const li = el('li', 'jp-GPUPool-kernel');
      li.dataset.kernel = k.kernel_id;
      li.dataset.state = k.state;
      const dl = el('dl', 'jp-GPUPool-facts');
      const add = (key: string, value: string) => dl.append(el('dt', '', key), el('dd', '', value));
      add('Offer', this.offerName(k.offer));
      add('State', kernelStateText(k));
      add('Device', kernelDevice(k));
      add('Since', when(k.activated || k.granted || k.created));
      li.append(dl);
      this.list.append(li);
    }
  }
}
