/** The status-bar item: device, utilization %, memory used/total; amber under a notice; the
 * old GPU during a move until the new one is live; "reclaimed" once the server is gone. */
import { Widget } from '@lumino/widgets';

import { statusText, visible } from './format';
import { GPUPoolModel } from './model';

export class GPUPoolStatus extends Widget {
  private button: HTMLButtonElement;
  private ticker: number;
  constructor(
    private model: GPUPoolModel,
    open: () => void
  ) {
    super();
    this.addClass('jp-GPUPool-status');
    this.button = document.createElement('button');
    this.button.type = 'button';
    this.button.className = 'jp-GPUPool-status-button';
    this.button.onclick = open;
    this.node.appendChild(this.button);
    // `this` as the receiver: Widget.dispose's Signal.clearData(this) disconnects it
    model.changed.connect(() => this.render(), this);
    this.ticker = window.setInterval(() => this.render(), 1000);
    this.render();
  }

  dispose(): void {
    window.clearInterval(this.ticker);
    super.dispose();
  }

  render(): void {
    const now = Date.now();
    const t = statusText(this.model.state, now, this.model.statusExtra(now));
    const parts = [t.device, t.util, t.memory].filter(Boolean);
    this.button.textContent = visible(`GPU: ${parts.join(' · ')}`);
    this.button.title = visible(t.label);
    this.button.setAttribute('aria-label', visible(`${t.label}. Open the GPU panel`));
    this.node.dataset.tone = t.tone;
    this.node.classList.toggle('jp-GPUPool-amber', t.tone === 'amber');
    this.node.classList.toggle('jp-GPUPool-down', t.tone === 'down');
  }
}
