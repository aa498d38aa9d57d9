/* ESLint for the project's two front-end trees: the lab extension's TypeScript (src/) and the
 * service's plain browser scripts (jupyterhub_gpupool/service/static/, served as written, no
 * build step). One config for both, kept here because the packages it imports live in this
 * folder's node_modules; `jlpm eslint:check` runs it from the repository root (base path), so
 * the patterns below are relative to the root. Rules follow the JupyterLab extension template
 * (github:jupyterlab/extension-template, template/eslint.config.mjs.jinja); formatting is
 * prettier's alone (eslint-config-prettier turns the formatting rules off).
 */
import js from '@eslint/js';
import jupyterPlugin from '@jupyter/eslint-plugin';
import prettierConfig from 'eslint-config-prettier/flat';
import { defineConfig } from 'eslint/config';
import globals from 'globals';
import tseslint from 'typescript-eslint';

const LAB = 'labextension/src/**/*.ts';
const STATIC = 'jupyterhub_gpupool/service/static/*.js';

export default defineConfig([
  {
    ignores: [
      '**/node_modules',
      'labextension/lib',
      'labextension/jupyterlab_gpupool',
      'labextension/coverage',
      // third-party, minified, checked by its own project
      'jupyterhub_gpupool/service/static/vendor'
    ]
  },
  {
    files: [LAB, STATIC, 'labextension/*.mjs', 'labextension/scripts/*.js'],
    ...js.configs.recommended
  },
  {
    files: [LAB],
    extends: [tseslint.configs.recommended, jupyterPlugin.configs.recommended],
    languageOptions: {
      globals: { ...globals.browser },
      parserOptions: {
        // the jupyter plugin's signal and disposable rules read types; the test config
        // covers src/__tests__ as well
        project: './tsconfig.test.json',
        tsconfigRootDir: import.meta.dirname,
        sourceType: 'module'
      }
    },
    rules: {
      '@typescript-eslint/naming-convention': [
        'error',
        { selector: 'interface', format: ['PascalCase'], custom: { regex: '^I[A-Z]', match: true } }
      ],
      '@typescript-eslint/no-unused-vars': ['error', { args: 'none' }],
      // The extension ships in English only, with no translation bundle or ITranslator;
      // translating it is a feature of its own, so untranslated strings are not findings yet.
      'jupyter/no-untranslated-string': 'off',
      'jupyter/prefer-lazy-imports': [
        'error',
        // activate() builds these at once: the model, the side panel and the status-bar item
        // show the GPU from the first paint, stale cleans the notebooks a move restores, and
        // kernels shows a GPU kernel's wait from the first kernel-starts event (the panel
        // imports it anyway)
        { ignoreImports: ['./kernels', './model', './panel', './stale', './statusbar'] }
      ],
      curly: ['error', 'all'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  {
    // the admin panel's and governance pages' scripts: classic <script defer> files, each one
    // strict-mode IIFE; what they share goes through window.gpupool
    files: [STATIC],
    languageOptions: {
      sourceType: 'script',
      ecmaVersion: 2022,
      // Chart: vendor/chart.umd.min.js's global, loaded before these scripts on the pages
      // that draw charts (each use is behind a window.Chart check)
      globals: { ...globals.browser, Chart: 'readonly' }
    },
    rules: {
      strict: ['error', 'global'],
      eqeqeq: 'error',
      'prefer-arrow-callback': 'error'
    }
  },
  {
    // the build scripts (stamp.js) and this file run under Node
    files: ['labextension/scripts/*.js', 'labextension/*.mjs'],
    languageOptions: { globals: { ...globals.node } }
  },
  prettierConfig
]);
