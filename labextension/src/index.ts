import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { ServerConnection } from '@jupyterlab/services';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';

import { KernelNotifications } from './kernels';
import { GPUPoolModel } from './model';
import { GPUPoolPanel } from './panel';
import { PresenceReporter } from './presence';
import { makeKernelSaver, makeSaver } from './saver';
import { cleanAfterMove } from './stale';
import { GPUPoolStatus } from './statusbar';

const GPU_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" width="16" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161"><path d="M3 6h18v11H3zM5 8v7h14V8zm2 1h4v5H7zm6 0h4v5h-4zM2 18h20v2H2zM6 3h2v3H6zm10 0h2v3h-2z"/></g></svg>';
export const gpuIcon = new LabIcon({ name: 'jupyterlab-gpupool:gpu', svgstr: GPU_SVG });

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyterlab-gpupool:plugin',
  description: 'Your GPU from the JupyterHub GPU pool: status bar, side panel, save-all.',
  autoStart: true,
  requires: [ILabShell],
  optional: [IStatusBar, IDocumentManager, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    statusBar: IStatusBar | null,
    docs: IDocumentManager | null,
    palette: ICommandPalette | null
  ) => {
    const model = new GPUPoolModel(ServerConnection.makeSettings(), makeSaver(app, docs));
    const panel = new GPUPoolPanel(model);
    panel.title.icon = gpuIcon;
    shell.add(panel, 'right', { rank: 600 });
    const open = () => shell.activateById(panel.id);
    app.commands.addCommand('gpupool:open', {
      label: 'Show my GPU (GPU pool)',
      describedBy: { args: { type: 'object', properties: {} } }, // it takes no arguments
      execute: open
    });
    palette?.addItem({ command: 'gpupool:open', category: 'GPU pool' });
    if (statusBar) {
      statusBar.registerStatusItem('jupyterlab-gpupool:status', {
        item: new GPUPoolStatus(model, open),
        align: 'left',
        rank: 4
      });
    }
    model.gone.connect(open); // the server is gone and its lease ended: show what happened
    // a GPU kernel waiting for its GPU, or told it will be reclaimed: a notification
    const notes = new KernelNotifications(
      id => model.cancelKernelStart(id),
      Notification,
      makeKernelSaver(app, docs)
    );
    model.kernelStartsChanged.connect((_, board) => notes.update(board));
    cleanAfterMove(app, docs);
    model.connect();
    // the user's own input is the only presence the pool counts where this extension runs
    new PresenceReporter(idleFor =>
      model.request('presence', 'POST', { idle_for: idleFor })
    ).attach();
  }
};

export default plugin;
