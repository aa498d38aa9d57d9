/** The state the server extension shares with every open tab (GET gpupool/state). */

export interface IReclaimNotice {
  kind: 'idle' | 'cpu' | 'max_age' | 'borrowed' | string;
  deadline: string;
  reason: string;
  action: string;
  issued?: string;
  pressure?: boolean;
  extensions: number;
  max_extensions: number;
  extendable: boolean;
  acting: boolean;
  /** The kind's heading ("Node maintenance: …"); from pools that send it. */
  heading?: string;
  /** Whether keeping is allowed now, and if not, why (a sentence). */
  keep?: boolean;
  why_not_kept?: string | null;
}

export interface IDevice {
  kind: 'mig' | 'gpu' | 'shared' | string;
  gpu: string;
  uuid: string;
  profile: string | null;
  start: number | null;
  parent: string | null;
}

export interface ILease {
  id: string;
  offer: string;
  offer_name: string;
  state: string;
  model: string | null;
  node: string | null;
  since: string | null;
  units: number;
  borrowed: boolean;
  device: string;
  memory_total_mib: number | null;
  devices: IDevice[];
  reclaim: IReclaimNotice | null;
}

export interface IPending {
  id: string;
  offer: string;
  /** The offer's display name (the id where the pool does not say). */
  offer_name?: string;
  state: string;
  position: number | null;
  eta_seconds: number | null;
  ready: boolean;
  resize_of: string | null;
}

export interface IQuota {
  held_units: number;
  guarantee: number;
  limit: number | null;
  used_unit_hours: number;
  budget: number | null;
  /** What the pool does when the budget is spent (an older pool sends none: `refuse`). */
  budget_action?: 'refuse' | 'notify' | 'stop';
  period: string;
  resets_at: string;
}

export interface IChoice {
  name: string;
  display_name: string;
  description: string;
  units: number;
  available: number;
  queue_length: number;
  eta_seconds: number | null;
  fits: boolean;
  why_not: string | null;
}

export interface ISample {
  ts: number;
  util: number | null;
  memory_used_mib: number;
  processes?: number;
}

export interface IReclaim {
  lease: string;
  offer: string;
  offer_name?: string;
  server: string;
  at: string;
  /** The notice's kind (from pools that send it). */
  kind?: string | null;
  action: string;
  reason: string;
  release_reason?: string;
  saved: string[];
  outcome: string;
  detail?: string;
}

export interface ISaveResult {
  saved: string[];
  unchanged: string[];
  failed: { path: string; error: string }[];
  via: 'lab' | 'checkpoints';
  labs: number;
  answered: number;
  reason: string;
  at: number;
}

export interface IPoolStatus {
  ok: boolean;
  error: string | null;
  code: string | null;
  down_since: number | null;
  retry_in: number | null;
  fetched_at: number | null;
}

export interface IState {
  version: number;
  at: number;
  interval: number;
  pool: IPoolStatus;
  user: string | null;
  server: string;
  lease_id: string | null;
  stale_lease: boolean;
  lease: ILease | null;
  pending: IPending | null;
  notice: IReclaimNotice | null;
  quota: IQuota | null;
  offers: IChoice[];
  utilization: { window: number; pool: ISample[]; local: ISample[] };
  local: {
    available: boolean;
    reason: string;
    devices: {
      uuid: string;
      name: string | null;
      util: number | null;
      memory_used_mib: number | null;
      memory_total_mib: number | null;
      processes: number | null;
    }[];
  };
  reclaims: IReclaim[];
  last_save: ISaveResult | null;
  /** The pool's user page as the browser reaches it (from servers that send it): once this
   * server is gone the lab asks its `ended/<lease>` page how the lease ended. */
  page?: string | null;
}

/** How a lease ended, as the pool's `ended/<lease>` page says (pages/ended.py). */
export interface ILeaseEnd {
  lease: string;
  state: string;
  ended: boolean;
  offer: string;
  offer_name: string;
  at: string | null;
  release_reason: string | null;
  reclaimed: boolean;
  kind: string | null;
  reason: string | null;
  action: string | null;
  saved: string[];
  outcome: string | null;
}

/** A GPU kernel start of this server waiting for its GPU (the `kernel-starts` event). */
export interface IKernelStart {
  kernel_id: string;
  kernel_name: string;
  /** The kernelspec's name in the launcher: "Python 3 (GPU: A100 1g.10gb)". */
  display_name: string;
  offer: string;
  offer_name: string;
  lease_id: string | null;
  /** `queued` (in the pool's queue) or `preparing` (granted, its MIG slice being made). */
  state: string;
  position: number | null;
  eta_seconds: number | null;
  since: string;
}

/** The pool's idle notice to one of this server's running GPU kernels. */
export interface IKernelNotice {
  kernel_id: string;
  kernel_name: string;
  display_name: string;
  offer: string;
  offer_name: string;
  message: string;
  deadline: string | null;
}

/** What the server's GPU kernels wait for or were told (`GET gpupool/kernel-starts`). */
export interface IKernelStarts {
  waiting: IKernelStart[];
  notices: IKernelNotice[];
}

/** A kernel lease as the pool's `GET kernels` gives it (the fields the panel shows). */
export interface IKernelLease {
  id: string;
  kernel_id: string;
  offer: string;
  state: string;
  position: number | null;
  eta_seconds: number | null;
  node: string | null;
  created: string | null;
  granted: string | null;
  activated: string | null;
  devices: { gpu?: string | null; mig?: { uuid?: string | null } | null }[];
  notice: { deadline: string; message: string } | null;
}
