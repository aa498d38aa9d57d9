import type { Notification } from '@jupyterlab/apputils';

import {
  INotifier,
  KernelNotifications,
  KernelsView,
  etaText,
  kernelDevice,
  kernelStateText,
  noticeText,
  waitingText
} from '../kernels';
import { IKernelLease, IKernelNotice, IKernelStart } from '../types';

function start(over: Partial<IKernelStart> = {}): IKernelStart {
  return {
    kernel_id: 'k1',
    kernel_name: 'gpupool-a100-1g',
    display_name: 'Python 3 (GPU: A100 1g.10gb)',
    offer: 'a100-1g',
    offer_name: 'A100 1g.10gb',
    lease_id: 'l1',
    state: 'queued',
    position: 2,
    eta_seconds: 180,
    since: '2026-03-02T09:00:00Z',
    ...over
  };
}

function notice(over: Partial<IKernelNotice> = {}): IKernelNotice {
  return {
    kernel_id: 'k9',
    kernel_name: 'gpupool-h100',
    display_name: 'Python 3 (GPU: H100)',
    offer: 'h100',
    offer_name: 'H100',
    message:
      'This GPU kernel has not run anything for 60 min: it will be shut down in 5 min. Its variables will be lost: save what you need.',
    deadline: '2026-03-02T10:05:00Z',
    ...over
  };
}

function lease(over: Partial<IKernelLease> = {}): IKernelLease {
  return {
    id: 'l1',
    kernel_id: 'k1',
    offer: 'a100-1g',
    state: 'active',
    position: null,
    eta_seconds: null,
    node: 'n1',
    created: '2026-03-02T09:00:00Z',
    granted: '2026-03-02T09:00:01Z',
    activated: '2026-03-02T09:00:02Z',
    devices: [{ gpu: 'GPU-1', mig: { uuid: 'MIG-1' } }],
    notice: null,
    ...over
  };
}

/** JupyterLab's notifications in memory: what is on screen, and every call. */
class Screen implements INotifier {
  shown = new Map<string, { message: string; type: string; actions: string[] }>();
  calls: string[] = [];
  private next = 0;
  actions = new Map<string, (() => void)[]>();

  emit(
    message: string,
    type: Notification.TypeOptions,
    options: Notification.IOptions<null>
  ): string {
    const id = `n${++this.next}`;
    const actions = options.actions || [];
    this.calls.push(`emit ${id}`);
    this.shown.set(id, { message, type, actions: actions.map(a => a.label) });
    this.actions.set(
      id,
      actions.map(a => () => a.callback(new MouseEvent('click')))
    );
    expect(options.autoClose).toBe(false); // it stays until the wait is over
    return id;
  }
  update(args: Notification.IUpdate<null>): boolean {
    this.calls.push(`update ${args.id}`);
    const was = this.shown.get(args.id)!;
    this.shown.set(args.id, {
      ...was,
      message: args.message ?? was.message,
      type: args.type ?? was.type
    });
    return true;
  }
  dismiss(id: string): void {
    this.calls.push(`dismiss ${id}`);
    this.shown.delete(id);
  }
  texts(): string[] {
    return [...this.shown.values()].map(s => s.message);
  }
}

describe('GPU kernel wording', () => {
  it('says the offer, the place in the queue and the estimate', () => {
    expect(waitingText(start())).toBe(
      'Waiting for a GPU (A100 1g.10gb): position 2 in the queue, about 3 min'
    );
    expect(waitingText(start({ eta_seconds: null, position: null }))).toBe(
      'Waiting for a GPU (A100 1g.10gb): in the queue, no estimate yet'
    );
    expect(waitingText(start({ eta_seconds: 5 }))).toContain('position 2 in the queue, any moment');
    expect(waitingText(start({ state: 'preparing' }))).toContain(
      'Preparing the GPU (A100 1g.10gb)'
    );
    expect(etaText(7200)).toBe('about 2 h');
    expect(etaText(undefined)).toBe('');
  });

  it('says a notice loses the variables, in the pool’s words or its own', () => {
    expect(noticeText(notice())).toBe(`GPU kernel Python 3 (GPU: H100): ${notice().message}`);
    expect(noticeText(notice({ message: 'Idle: shut down in 5 min.' }))).toBe(
      'GPU kernel Python 3 (GPU: H100): Idle: shut down in 5 min. Its variables will be lost (the notebook is kept).'
    );
  });

  it('says where a kernel lease stands', () => {
    expect(kernelStateText(lease({ state: 'queued', position: 1, eta_seconds: 600 }))).toBe(
      'queued, 1st in line, about 10 min'
    );
    expect(kernelStateText(lease())).toBe('running');
    expect(kernelStateText(lease({ notice: { deadline: 'x', message: 'm' } }))).toBe(
      'running (idle notice)'
    );
    expect(kernelStateText(lease({ state: 'granted' }))).toBe('starting');
    expect(kernelDevice(lease())).toBe('MIG-1');
    expect(kernelDevice(lease({ devices: [{ gpu: 'GPU-7', mig: null }] }))).toBe('GPU-7');
    expect(kernelDevice(lease({ state: 'queued', devices: [] }))).toBe('–');
  });
});

describe('KernelNotifications', () => {
  it('shows a wait, updates it in place, and dismisses it when the start is over', () => {
    const screen = new Screen();
    const cancelled: string[] = [];
    const notes = new KernelNotifications(async id => {
      cancelled.push(id);
    }, screen);
    notes.update({ waiting: [start()], notices: [] });
    expect(screen.texts()).toEqual([waitingText(start())]);
    const [id] = [...screen.shown.keys()];
    expect(screen.shown.get(id)).toMatchObject({ type: 'in-progress', actions: ['Cancel'] });
    notes.update({ waiting: [start()], notices: [] }); // nothing moved: nothing redrawn
    notes.update({ waiting: [start({ position: 1, eta_seconds: 60 })], notices: [] });
    expect(screen.calls).toEqual([`emit ${id}`, `update ${id}`]);
    expect(screen.texts()[0]).toContain('position 1 in the queue, about 1 min');
    screen.actions.get(id)![0]();
    expect(cancelled).toEqual(['k1']);
    notes.update({ waiting: [], notices: [] }); // started, failed or cancelled
    expect(screen.shown.size).toBe(0);
    expect(notes.ids.size).toBe(0);
  });

  it('shows a notice as a warning until it is gone, beside the waits', () => {
    const screen = new Screen();
    const notes = new KernelNotifications(async () => undefined, screen);
    notes.update({ waiting: [start()], notices: [notice()] });
    expect(screen.texts()).toEqual([waitingText(start()), noticeText(notice())]);
    expect([...screen.shown.values()][1]).toMatchObject({ type: 'warning', actions: [] });
    notes.update({ waiting: [start()], notices: [] }); // a cell ran: the notice is cancelled
    expect(screen.texts()).toEqual([waitingText(start())]);
    notes.dispose();
    expect(screen.shown.size).toBe(0);
  });

  it('saves the notebooks on a kernel when its notice comes and when it goes, not for waits', () => {
    const screen = new Screen();
    const saved: string[] = [];
    const notes = new KernelNotifications(
      async () => undefined,
      screen,
      async id => {
        saved.push(id);
      }
    );
    notes.update({ waiting: [start()], notices: [notice()] });
    expect(saved).toEqual(['k9']);
    notes.update({ waiting: [start()], notices: [notice({ message: 'moved' })] });
    expect(saved).toEqual(['k9']); // the same notice updated: not saved again
    notes.update({ waiting: [], notices: [] }); // reclaimed (or a cell ran)
    expect(saved).toEqual(['k9', 'k9']);
  });
});

describe('KernelsView', () => {
  it('lists the kernel leases with offer, state, device and since', async () => {
    let kernels = [
      lease(),
      lease({
        id: 'l2',
        kernel_id: 'k2',
        offer: 'h100',
        state: 'queued',
        position: 1,
        devices: [],
        granted: null,
        activated: null
      })
    ];
    const calls: string[] = [];
    const view = new KernelsView(
      async <T>(path: string, method: string): Promise<T> => {
        calls.push(`${method} ${path}`);
        return { kernels } as T;
      },
      offer => (offer === 'a100-1g' ? 'A100 1g.10gb' : offer)
    );
    await view.refresh();
    expect(calls).toEqual(['GET kernels']);
    expect(view.node.querySelector('h3')!.textContent).toBe('GPU kernels');
    const items = Array.from(view.node.querySelectorAll('li.jp-GPUPool-kernel'));
    expect(items.map(li => (li as HTMLElement).dataset.state)).toEqual(['active', 'queued']);
    const facts = (li: Element) => Array.from(li.querySelectorAll('dd')).map(d => d.textContent);
    expect(facts(items[0]).slice(0, 3)).toEqual(['A100 1g.10gb', 'running', 'MIG-1']);
    expect(facts(items[1]).slice(0, 3)).toEqual(['h100', 'queued, 1st in line', '–']);
    kernels = [];
    await view.refresh();
    expect(view.node.textContent).toContain('No GPU kernels.');
  });

  it('says when the kernels cannot be read', async () => {
    const view = new KernelsView(async () => {
      throw new Error('the GPU pool is not answering');
    });
    await view.refresh();
    expect(view.node.querySelector('[role=status]')!.textContent).toBe(
      'Could not read your GPU kernels: the GPU pool is not answering'
    );
  });
});
