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
