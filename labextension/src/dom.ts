/** The panel's small DOM helpers, shared by its sections (panel, My jobs, GPU kernels). */
import { visible } from './format';

/** A `tag` element with class `cls` and text `text` (made visible: control characters shown). */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text !== undefined) {
    e.textContent = visible(text);
  }
  return e;
}

/** An ISO time in the browser's locale; `–` for none, the text itself if it is not a time. */
export function when(iso: string | null): string {
  if (!iso) {
    return '–';
  }
  const d = new Date(iso);
  return isNaN(d.getTime()) ? iso : d.toLocaleString();
}
