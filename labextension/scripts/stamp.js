// Writes (or with --check, verifies) the hash of the frontend's sources into the built
// extension, so a test can tell a committed build that is older than src/ (the build is
// committed so that `pip install ./labextension` needs no Node).
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

const root = path.join(__dirname, '..');
const out = path.join(root, 'jupyterlab_gpupool', 'labextension', 'build-source.sha256');

function files(dir) {
  return fs.readdirSync(path.join(root, dir), { withFileTypes: true }).flatMap(e => {
    const rel = path.join(dir, e.name);
    if (e.isDirectory()) return e.name === '__tests__' ? [] : files(rel);
    return [rel];
  });
}

const inputs = [
  ...files('src'),
  ...files('style'),
  'package.json',
  'tsconfig.json',
  'yarn.lock'
].sort();
const hash = crypto.createHash('sha256');
for (const f of inputs) {
  hash.update(f.split(path.sep).join('/') + '\0');
  hash.update(fs.readFileSync(path.join(root, f)));
  hash.update('\0');
}
const digest = hash.digest('hex');
if (process.argv.includes('--check')) {
  const have = fs.existsSync(out) ? fs.readFileSync(out, 'utf8').trim() : '';
  if (have !== digest) {
    console.error('the built extension is older than its sources: run `jlpm build:prod`');
    process.exit(1);
  }
} else {
  fs.writeFileSync(out, digest + '\n');
}
