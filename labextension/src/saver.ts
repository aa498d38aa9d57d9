/** Save every document open in this tab (what the browser holds, not yet on disk). */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { IDocumentManager } from '@jupyterlab/docmanager';

export function makeSaver(app: JupyterFrontEnd, docs: IDocumentManager | null) {
  return async () => {
    const saved: string[] = [];
    const unchanged: string[] = [];
    const failed: { path: string; error: string }[] = [];
    if (!docs) {
      return { saved, unchanged, failed };
    }
    const seen = new Set<string>();
    for (const widget of app.shell.widgets('main')) {
      const context = docs.contextForWidget(widget);
      if (!context || seen.has(context.path)) {
        continue;
      }
      seen.add(context.path);
      if (!context.model.dirty || context.model.readOnly) {
        unchanged.push(context.path);
        continue;
      }
      try {
        await context.save();
        saved.push(context.path);
      } catch (e) {
        failed.push({ path: context.path, error: String(e) });
      }
    }
    return { saved, unchanged, failed };
  };
}

/**
 * Save the documents open in this tab that run on the kernel `kernelId` (a GPU kernel the pool
 * has told it will reclaim: its notebook is on disk before the kernel goes).
 */
export function makeKernelSaver(app: JupyterFrontEnd, docs: IDocumentManager | null) {
  return async (kernelId: string): Promise<string[]> => {
    const saved: string[] = [];
    if (!docs) {
      return saved;
    }
    for (const widget of app.shell.widgets('main')) {
      const context = docs.contextForWidget(widget);
      const kernel = context?.sessionContext?.session?.kernel;
      if (!context || kernel?.id !== kernelId || saved.includes(context.path)) {
        continue;
      }
      if (context.model.dirty && !context.model.readOnly) {
        try {
          await context.save();
          saved.push(context.path);
        } catch (e) {
          console.warn(`GPU pool: ${context.path} not saved: ${String(e)}`);
        }
      }
    }
    return saved;
  };
}
