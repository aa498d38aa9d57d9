/**
 * Ask the pool how this server's lease ended, once the server is gone.
 *
 * The server cannot answer any more, and a script's cookie request to the pool's API would need
 * the service's XSRF token, which this page (under `/user/…`) cannot read. A hidden frame that
 * loads the pool's `ended/<lease>` page is a navigation: the hub's OAuth signs the browser in
 * there without a prompt and no XSRF token is asked for a read. Same origin, so the page's JSON
 * data block is read from the frame's document. Another origin, or a login page instead of the
 * answer: `null`, and the panel keeps what it last knew.
 */
import { URLExt } from '@jupyterlab/coreutils';

import { ILeaseEnd } from './types';

export function askLeaseEnd(
  page: string,
  lease: string,
  timeoutMs = 20000
): Promise<ILeaseEnd | null> {
  return new Promise(resolve => {
    const frame = document.createElement('iframe');
    frame.className = 'jp-GPUPool-ask';
    frame.setAttribute('aria-hidden', 'true');
    frame.tabIndex = -1;
    frame.style.display = 'none';
    let done = false;
    const finish = (answer: ILeaseEnd | null) => {
      if (done) {
        return;
      }
      done = true;
      window.clearTimeout(timer);
      frame.remove();
      resolve(answer);
    };
    const timer = window.setTimeout(() => finish(null), timeoutMs);
    frame.onload = () => {
      try {
        const data = frame.contentDocument?.getElementById('gpupool-lease-end')?.textContent;
        finish(data ? (JSON.parse(data) as ILeaseEnd) : null);
      } catch {
        finish(null); // another origin, or not the answer
      }
    };
    frame.src = URLExt.join(page, 'ended', encodeURIComponent(lease)) + `?t=${Date.now()}`;
    document.body.appendChild(frame);
  });
}
