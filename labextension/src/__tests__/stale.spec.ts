import { Signal } from '@lumino/signaling';

import { fixQuietly } from '../stale';

/** A document model as JupyterLab's: content, and a dirty flag reported on stateChanged. */
class FakeModel {
  content: string[] = ['a'];
  private _dirty = false;
  readonly stateChanged = new Signal<this, { name: string; oldValue: unknown; newValue: unknown }>(
    this
  );

  get dirty(): boolean {
    return this._dirty;
  }
  set dirty(value: boolean) {
    const old = this._dirty;
    this._dirty = value;
    this.stateChanged.emit({ name: 'dirty', oldValue: old, newValue: value });
  }
  toJSON(): unknown {
    return { content: [...this.content] };
  }
  /** A change the shared model reports now. */
  edit(line: string): void {
    this.content.push(line);
    this.dirty = true;
  }
}

describe('fixQuietly', () => {
  beforeEach(() => jest.useFakeTimers());
  afterEach(() => jest.useRealTimers());

  it('keeps a display fix from marking the document unsaved, however late its reports come', () => {
    const model = new FakeModel();
    const n = fixQuietly(model, () => {
      model.content[0] = 'fixed';
      return 1;
    });
    expect(n).toBe(1);
    model.dirty = true; // the shared model's first report of the fix, a turn later
    expect(model.dirty).toBe(false);
    jest.advanceTimersByTime(30000);
    model.dirty = true; // a second report, much later on a loaded machine
    expect(model.dirty).toBe(false);
  });

  it("leaves the user's edit unsaved: from the first edit on, the flag is theirs", () => {
    const model = new FakeModel();
    fixQuietly(model, () => {
      model.content[0] = 'fixed';
      return 1;
    });
    model.edit('typed by the user');
    expect(model.dirty).toBe(true);
    model.dirty = false; // saved
    model.dirty = true; // the late report of the fix: the document differs, so it stands
    expect(model.dirty).toBe(true);
  });

  it('a report during the fix itself is the fix', () => {
    const model = new FakeModel();
    fixQuietly(model, () => {
      model.content[0] = 'fixed';
      model.dirty = true;
      return 1;
    });
    expect(model.dirty).toBe(false);
  });

  it('stops watching when nothing was fixed, and after its time', () => {
    const model = new FakeModel();
    expect(fixQuietly(model, () => 0)).toBe(0);
    model.dirty = true;
    expect(model.dirty).toBe(true);

    const other = new FakeModel();
    fixQuietly(
      other,
      () => {
        other.content[0] = 'fixed';
        return 1;
      },
      1000
    );
    jest.advanceTimersByTime(1001);
    other.dirty = true;
    expect(other.dirty).toBe(true);
  });
});
