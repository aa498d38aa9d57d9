/**
 * After a move the page reloads on the new server, whose kernels are new: a widget output saved
 * in a notebook has no model any more and JupyterLab would show "Error displaying widget: model
 * not found". The notebooks this page restores right after a move get those outputs replaced by
 * a plain line saying to run the cell again (widgets whose state the notebook saved are kept).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import type { IChangedArgs } from '@jupyterlab/coreutils';
import { IDocumentManager } from '@jupyterlab/docmanager';

import { STALE_WIDGET_TEXT, staleWidgetOutputs } from './format';

/** Set just before the page reloads onto the new server after a move. */
export const MOVED_KEY = 'jupyterlab-gpupool:moved';

/* eslint-disable @typescript-eslint/no-explicit-any -- notebook models, duck-typed: this
   package does not depend on @jupyterlab/notebook */
function clean(model: any): number {
  const state = model.getMetadata?.('widgets')?.['application/vnd.jupyter.widget-state+json'];
  const saved = new Set<string>(Object.keys(state?.state ?? {}));
  let n = 0;
  const cells = model.cells;
  for (let c = 0; cells && c < cells.length; c++) {
    const outputs = cells.get(c)?.outputs;
    if (!outputs || typeof outputs.get !== 'function') {
      continue;
    }
    const list = [];
    for (let i = 0; i < outputs.length; i++) {
      list.push({ data: outputs.get(i)?.data ?? null });
    }
    for (const i of staleWidgetOutputs(list, saved)) {
      outputs.set(i, {
        output_type: 'display_data',
        data: { 'text/plain': STALE_WIDGET_TEXT },
        metadata: {}
      });
      n++;
    }
  }
  return n;
}

/**
 * Run `fix` on an unmodified document model without leaving it "unsaved": the shared model
 * reports the change when it gets to it (a later turn, much later on a loaded machine, and
 * possibly in more than one report), so while the document is still exactly what the fix made
 * of it (for `keepFor` ms) a dirty flag is put back; the user's first edit makes it differ, and
 * from then on the flag is theirs. Returns what `fix` returns (0: nothing changed).
 */
export function fixQuietly(model: any, fix: () => number, keepFor = 60000): number {
  let fixed: string | null = null;
  const keepClean = (_: unknown, change: IChangedArgs<unknown>) => {
    if (change.name !== 'dirty' || change.newValue !== true) {
      return;
    }
    if (fixed === null || JSON.stringify(model.toJSON()) === fixed) {
      model.dirty = false;
    } else {
      model.stateChanged.disconnect(keepClean);
    }
  };
  model.stateChanged.connect(keepClean);
  const n = fix();
  if (!n) {
    model.stateChanged.disconnect(keepClean);
    return n;
  }
  fixed = JSON.stringify(model.toJSON());
  window.setTimeout(() => model.stateChanged.disconnect(keepClean), keepFor);
  return n;
}

/** If this page was loaded by a move: clean the notebooks it restores (for a minute). */
export function cleanAfterMove(app: JupyterFrontEnd, docs: IDocumentManager | null): void {
  let moved: boolean;
  try {
    moved = window.sessionStorage.getItem(MOVED_KEY) !== null;
    window.sessionStorage.removeItem(MOVED_KEY);
  } catch {
    return;
  }
  if (!moved || !docs) {
    return;
  }
  const seen = new Set<string>();
  const sweep = () => {
    for (const widget of app.shell.widgets('main')) {
      const context = docs.contextForWidget(widget);
      if (!context || seen.has(context.path)) {
        continue;
      }
      seen.add(context.path);
      void context.ready.then(() => {
        // a display fix, not an edit: a notebook just loaded stays unmodified (nothing for
        // the next save-all to write, no "unsaved changes" the user did not make)
        const model = context.model;
        if (model.dirty) {
          clean(model);
          return;
        }
        fixQuietly(model, () => clean(model));
      });
    }
  };
  void app.restored.then(sweep);
  const timer = window.setInterval(sweep, 1000);
  window.setTimeout(() => window.clearInterval(timer), 60000);
}
